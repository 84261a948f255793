"""The pytest plugin: one test per ordered pair of a target's libraries and flags mode.

    pytest --loadfuzz=TARGET [--loadfuzz-add=LIB]... [--loadfuzz-select=GLOB]...
           [--loadfuzz-flags=global,local] [--loadfuzz-expect=FILE]

Each test is one trial of the load order `<first id> -> <second id> @ <flags>`
(the test's name; its node id is `loadfuzz::<name>`). A pair that is not clean
fails and shows its trial record and repro command; a finding an expectation
covers is reported as xfail. It works in any folder, test files or none: the
tests hang off the session itself (see `pytest_make_collect_report`). Under
pytest-xdist (`-n N`) every worker reads the target and collects the same tests
in the same order, and runs its share through a fork server of its own.

Without `--loadfuzz` the plugin does nothing: it imports none of loadfuzz's
other modules and registers no hook beyond its options (`PairPlugin` holds
the rest). It always provides the `loadfuzz_run` fixture (see loadfuzz.api).
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from loadfuzz.expect import Expectation
    from loadfuzz.inventory import Inventory, Library
    from loadfuzz.model import Flags, Sequence, TrialRecord
    from loadfuzz.run.trials import Trials

RECORD_PROPERTY = "loadfuzz_record"  # the trial record (JSON) in each report's user_properties


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("loadfuzz", "load-order checks of native libraries (loadfuzz)")
    group.addoption("--loadfuzz", metavar="TARGET",
                    help="add one test per ordered pair of TARGET's libraries and flags mode "
                         "(TARGET: a .whl, a directory, or an installed distribution's name)")
    group.addoption("--loadfuzz-add", action="append", default=[], metavar="LIB",
                    help="an extra library (id extra/<file name>); repeatable")
    group.addoption("--loadfuzz-select", action="append", default=[], metavar="GLOB",
                    help="only the libraries whose id matches; repeatable")
    group.addoption("--loadfuzz-flags", default="global,local", metavar="MODES",
                    help="flags modes, e.g. global,local (default)")
    group.addoption("--loadfuzz-expect", metavar="FILE",
                    help="expectations file (TOML): the findings it covers are xfail")


# --- what one pytest process checks ----------------------------------------------------


@dataclass
class PairCheck:
    """The target, its pairs and expectations, as read once per pytest process (or xdist worker).

    The fork server (`trials`) starts with the first test that runs, so that
    collecting (`--collect-only`, the xdist controller) never starts one.
    """

    inventory: Inventory
    libraries: tuple[Library, ...]
    flags: tuple[Flags, ...]
    work: list[Sequence]
    expectations: tuple[Expectation, ...]
    _trials: Trials | None = None

    @classmethod
    def read(cls, config: pytest.Config) -> PairCheck:
        """Read the options and the target; any bad input is a one-line pytest usage error."""
        from loadfuzz import plan
        from loadfuzz.model import Flags, UsageError
        from loadfuzz.settings import CampaignSettings, TargetSpec

        option = config.getoption
        try:
            expect = option("loadfuzz_expect")
            if expect == "":
                raise UsageError("--loadfuzz-expect: an empty path")
            if any(not add.strip() for add in option("loadfuzz_add")):  # Path("") would be "."
                raise UsageError("--loadfuzz-add: an empty path")
            settings = CampaignSettings(
                TargetSpec((option("loadfuzz"),), tuple(Path(p) for p in option("loadfuzz_add")),
                           tuple(option("loadfuzz_select"))),
                flags=Flags.parse_list(option("loadfuzz_flags")),
                expect=None if expect is None else Path(expect))
            inv, libs = settings.target.load()
            expectations = settings.expectations()
        except (UsageError, ValueError) as exc:
            raise usage_error(str(exc)) from None
        if len(libs) < 2:
            raise usage_error(f"{len(libs)} library selected in {inv.target}; a pair needs two")
        work = plan.pairs(libs, settings.flags)
        return cls(inv, libs, settings.flags, work, expectations)

    def trials(self) -> Trials:
        if self._trials is None:
            from loadfuzz.settings import RunSettings

            self._trials = RunSettings().trials(self.inventory, self.libraries)
        return self._trials

    def covering(self, record: TrialRecord) -> Expectation | None:
        return next((entry for entry in self.expectations if entry.matches(record)), None)

    def close(self) -> None:
        if self._trials is not None:
            self._trials.close()


CHECK = pytest.StashKey[PairCheck]()
# the loadfuzz command line's option names (in loadfuzz's messages) -> this plugin's
OPTION_NAMES = (("--add ", "--loadfuzz-add "), ("--select ", "--loadfuzz-select "),
                ("--expect ", "--loadfuzz-expect "))


def usage_error(message: str) -> pytest.UsageError:
    for cli, ours in OPTION_NAMES:
        message = message.replace(cli, ours)
    return pytest.UsageError(f"loadfuzz: {message}")


def pytest_configure(config: pytest.Config) -> None:
    """With --loadfuzz: read the target (on the xdist controller first, so bad input stops
    the run before any worker starts) and register the hooks that add and report the pairs."""
    # (`is not None`: an empty TARGET, a CI job's `--loadfuzz="$TARGET"` whose variable is
    # unset, is bad input, not a green run of nothing)
    if config.getoption("loadfuzz") is not None:
        check = config.stash[CHECK] = PairCheck.read(config)
        config.pluginmanager.register(PairPlugin(check), "loadfuzz-pairs")
        config.addinivalue_line("markers", "loadfuzz: a load-order pair test added by loadfuzz")


class PairPlugin:
    """The hooks of an active run: they exist only with --loadfuzz."""

    def __init__(self, check: PairCheck) -> None:
        self.check = check
        self.records: list[TrialRecord] = []  # every pair's record this process was told of

    def pytest_report_header(self) -> str:
        inv, check = self.check.inventory, self.check
        modes = ",".join(mode.value for mode in check.flags)
        return (f"loadfuzz: {inv.target} ({inv.name} {inv.version or ''}".rstrip()
                + f"), {len(check.libraries)} libraries, flags {modes}: {len(check.work)} pairs")

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Generator[None, Any, Any]:
        """The pairs hang off the session itself, whatever the folder holds (or not)."""
        report = yield
        if isinstance(collector, pytest.Session) and report.passed:
            report.result.append(Pairs.from_parent(collector, name="loadfuzz", nodeid="loadfuzz"))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect the records; on the xdist controller these are every worker's reports."""
        if report.when != "call":
            return
        from loadfuzz.model import TrialRecord

        self.records += [TrialRecord.from_json(json.loads(value), locate=lambda lib: Path())
                         for name, value in report.user_properties if name == RECORD_PROPERTY]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.records:
            return
        from loadfuzz.expect import names_nothing, sort_findings

        expected, unexpected, stale, environment = sort_findings(self.records,
                                                                 self.check.expectations)
        terminalreporter.section("loadfuzz")
        findings = len(expected) + len(unexpected)
        terminalreporter.line(f"{len(self.records)} load orders run, {findings} findings: "
                              f"{len(expected)} expected, {len(unexpected)} unexpected"
                              + (f"; {len(environment)} problems of the environment (skipped)"
                                 if environment else ""))
        ids = [lib.id for lib in self.check.libraries]
        for entry in stale:
            note = names_nothing(entry.to_json(), ids)
            terminalreporter.line(f"expectation that matched nothing run here: {entry.source} "
                                  f"({entry.first} x {entry.second}, {entry.outcome.value})"
                                  + (f"; {note}" if note else ""))

    def pytest_unconfigure(self) -> None:
        self.check.close()


# --- the tests ----------------------------------------------------------------------------


class Pairs(pytest.Collector):
    """Every ordered pair under every flags mode, in the plan's (deterministic) order."""

    def collect(self) -> list[PairItem]:
        return [PairItem.from_parent(self, name=pair_id(seq), sequence=seq)
                for seq in self.config.stash[CHECK].work]


def pair_id(seq: Sequence) -> str:
    """`<first id> -> <second id> @ <flags>`: how people spell a load order, and the name
    `matrix` gives the pair's junit test case, whatever way each step loads its library (a
    Python extension module is imported under `python`)."""
    first, second = seq
    return f"{first.lib} -> {second.lib} @ {first.flags.value}"


class PairItem(pytest.Item):
    """One load order of two libraries: one trial."""

    def __init__(self, *, sequence: Sequence, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sequence = sequence
        self.add_marker("loadfuzz")

    def runtest(self) -> None:
        from loadfuzz.classify import environment_signatures

        check = self.config.stash[CHECK]
        record = check.trials().run(self.sequence)
        self.user_properties.append((RECORD_PROPERTY, json.dumps(record.to_json())))
        if record.clean:
            return
        if record.signature in environment_signatures():  # never a finding, as in a campaign
            pytest.skip(f"a problem of the environment, not a collision: {failure_headline(record)}")
        entry = check.covering(record)
        if entry is not None:
            pytest.xfail(f"{failure_headline(record)}; expected ({entry.source}): {entry.why}")
        raise PairFailed(record)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str:
        if isinstance(excinfo.value, PairFailed):
            return failure_text(excinfo.value.record)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, None, str]:
        return self.path, None, self.name  # no source line: a pair is not written anywhere


class PairFailed(Exception):
    """A load order that was not clean and no expectation covers."""

    def __init__(self, record: TrialRecord) -> None:
        super().__init__(failure_headline(record))
        self.record = record


def failure_headline(record: TrialRecord) -> str:
    """`reregister executorch-reregister quantized_decomposed::add.out at step 1 (extra/p.so)`."""
    from loadfuzz import spelling

    where = f" at step {record.step} ({record.sequence[record.step].lib})" if (
        record.step is not None) else ""
    return spelling.headline(record.to_json()) + where


def failure_text(record: TrialRecord) -> str:
    """What a failed pair shows: the headline first (pytest's summary line), the record last."""
    from loadfuzz.spelling import explanation

    data = record.to_json()
    return "\n".join([
        failure_headline(record),
        f"detail: {record.detail}",
        *explanation(data),
        f"repro:  {record.repro}",
        f"record: {json.dumps(data, ensure_ascii=False)}",
    ])


@pytest.fixture
def loadfuzz_run():
    """Run one load order, cold, and get its trial record (see loadfuzz.api.run_load_order).

        def test_plugin_loads_beside_the_runtime(loadfuzz_run):
            record = loadfuzz_run("executorch", "lib/libexecutorch.so", "local:build/plugin.so")
            assert record.clean, record.detail
    """
    from loadfuzz.api import run_load_order

    return run_load_order
