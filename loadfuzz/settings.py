"""Settings: what a user asked for, as typed values that the CLI, the API and the pytest plugin
all build the same way (nothing below the command line sees argparse), and the check of the
files it names (`check_input`) that comes before anything is read or run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from loadfuzz import hostenv
from loadfuzz.baseline import Baseline
from loadfuzz.expect import Expectation, load_expectations
from loadfuzz.model import Flags, UsageError
from loadfuzz.plan import WHOLE, Shard
from loadfuzz.results import check_out, check_step_summary
from loadfuzz.run.harness import Limits

if TYPE_CHECKING:  # imported where used: a command reads its settings before they load
    from loadfuzz import inventory
    from loadfuzz.run.pool import ServerPool
    from loadfuzz.run.trials import Trials


@dataclass(frozen=True)
class TargetSpec:
    """Which libraries: one or several TARGETs or the whole environment (`--env`), extra
    libraries (`--add`), and id globs to keep (`--select`) and to leave out (`--exclude`)."""

    targets: tuple[str, ...]
    add: tuple[Path, ...] = ()
    select: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    env: bool = False

    def load(self) -> tuple[inventory.Inventory, tuple[inventory.Library, ...]]:
        """The targets' inventory (from the derived cache while its files are unchanged) and
        the selected libraries; UsageError on bad input."""
        from loadfuzz import inventory_cache

        inv = inventory_cache.load_targets(self.targets, self.add, self.env)
        return inv, inv.select(self.select, self.exclude)


@dataclass(frozen=True)
class RunSettings:
    """How trials run: limits, fork servers or not, and how many at once."""

    limits: Limits = field(default_factory=Limits)
    cold: bool = False  # every trial a fresh process, no fork server
    jobs: int = field(default_factory=hostenv.usable_cores)

    def trials(self, inv: inventory.Inventory,
               servers_for: tuple[inventory.Library, ...] | None = None,
               confirm: bool = True, pool: ServerPool | None = None,
               keep_printed: bool = False) -> Trials:
        """A runner for sequences of the inventory's libraries, its fork servers built for
        `servers_for` (default: every library); `confirm` False: findings are not confirmed
        cold one by one (a search confirms those it reports); `pool`: the fork servers to use
        (default: a new pool; see `ahead`); `keep_printed`: records keep what was printed."""
        from loadfuzz.explain import Explainer
        from loadfuzz.run.tiers import Tiers
        from loadfuzz.run.trials import Trials

        return Trials(self.limits, Tiers.of(inv.libraries, servers_for, inv.link_map),
                      cold=self.cold, confirm=confirm, explainer=Explainer(inv), pool=pool,
                      keep_printed=keep_printed)


@dataclass(frozen=True)
class CampaignSettings:
    """One campaign (matrix, fuzz or repro) as asked for."""

    target: TargetSpec
    run: RunSettings = field(default_factory=RunSettings)
    flags: tuple[Flags, ...] = (Flags.GLOBAL, Flags.LOCAL)
    expect: Path | None = None  # expectations file
    out: Path | None = None  # results folder; None: results/<name>-<version>/<time>/
    resume: bool = False
    shard: Shard = WHOLE
    invocation: tuple[str, ...] = ()  # the command's words as typed (for the resume command)
    fail_on: str = "unexpected"  # --fail-on: exit 1 on any unexpected finding, or a new one

    def expectations(self) -> tuple[Expectation, ...]:
        return load_expectations(self.expect) if self.expect else ()


@dataclass(frozen=True)
class Checked:
    """What the user wrote, read and checked (`check_input`): nothing of the target yet."""

    expectations: tuple[Expectation, ...]
    baseline: Baseline | None


def check_input(settings: CampaignSettings, command: str,
                baseline: Path | None = None) -> Checked:
    """Read the expectations and the baseline (`--baseline`), and check the results folder;
    UsageError if bad. Cheap: a command does this before it reads the target (seconds for a
    large one, and the ELF cache filled) or starts a fork server, so bad input costs nothing
    and runs no library's code."""
    if settings.resume and settings.out is None:
        raise UsageError("--resume needs --out DIR, the folder of the campaign to continue")
    expectations = settings.expectations()
    earlier = Baseline.read(baseline) if baseline is not None else None
    if settings.out is not None:
        check_out(settings.out, settings.resume, command == "matrix")
    if command in ("matrix", "fuzz"):  # the commands that append their report to it
        check_step_summary()
    return Checked(expectations, earlier)
