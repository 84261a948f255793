"""The Python API for a project's own tests: run one load order, get its trial record.

    from loadfuzz.api import Outcome, run_load_order

    record = run_load_order("executorch", "lib/libexecutorch_kernels_quantized.so",
                            "local:extra/my_plugin.so", add=["build/my_plugin.so"])
    assert record.clean, f"{record.outcome.value}: {record.detail}\\n{record.repro}"

Steps are spelled as on the `loadfuzz run` command line: a library id of the
target (or a path), with an optional `global:` or `local:` prefix for its
flags mode, or `py:PATH` to import a Python extension module. With target
None every step is a path. Each call is one cold trial in a fresh process.
Inside pytest the `loadfuzz_run` fixture hands out this same function.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from loadfuzz import inventory
from loadfuzz.model import Flags, Outcome, TrialRecord, UsageError, parse_step
from loadfuzz.run.harness import Limits
from loadfuzz.run.tiers import Tiers
from loadfuzz.run.trials import Trials

__all__ = ["Outcome", "TrialRecord", "UsageError", "run_load_order"]


def run_load_order(target: str | Path | None, *steps: str | Path,
                   add: Iterable[str | Path] = (), flags: str = "global",
                   timeout: float = 10.0) -> TrialRecord:
    """Run `steps` in this order in one fresh process and return the trial record.

    target: a .whl, a directory or an installed distribution's name (then a
    step may be a library id), or None. add: extra libraries of the target
    (ids `extra/<file name>`). flags: the mode of steps without a prefix.
    timeout: the limit of one step, in seconds. Bad input raises UsageError.
    """
    if not steps:
        raise UsageError("run_load_order needs at least one step")
    try:
        default = Flags(flags)
    except ValueError:
        raise UsageError(f"unknown flags mode {flags!r} (expected global or local)") from None
    if not timeout > 0:
        raise UsageError(f"timeout must be more than zero seconds, not {timeout!r}")
    ids = {}
    if target is not None:
        inv = inventory.load_target(str(target), [Path(p) for p in add])
        ids = {lib.id: lib.path for lib in inv.libraries}
    seq = tuple(parse_step(str(text), default, ids.get) for text in steps)
    with Trials(Limits(timeout_s=timeout), Tiers.for_steps(seq), cold=True) as trials:
        return trials.run(seq)
