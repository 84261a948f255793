"""Campaign: check a campaign's inputs, run its work list into the results folder, and sum it up.

Shared by `matrix`, `fuzz` and `repro`. `prepare` reads and checks every
input (target, expectations, results folder) before anything is written, so
bad input writes nothing. `run_work` runs a work list, skipping what a
resumed folder already holds (a search runs its trials through
`search.once.RunOnce` instead). The summary and the exit status come from the records, the
expectations and nothing else. `run_matrix` is the matrix command's whole job.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from loadfuzz import plan, predict
from loadfuzz.baseline import Baseline
from loadfuzz.expect import Expectation, sort_findings
from loadfuzz.inventory import Inventory, Library
from loadfuzz.model import Sequence as Steps
from loadfuzz.model import TrialRecord, UsageError, new_and_unexpected, sequence_key
from loadfuzz.results import ResultsFolder, default_out, utc_now
from loadfuzz.run.pool import ServerPool
from loadfuzz.run.schedule import run_all
from loadfuzz.run.trials import Trials, loadfuzz_command
from loadfuzz.settings import CampaignSettings, Checked, check_input


class Watcher(Protocol):
    """Told about the trials as they finish (the terminal's progress line, or nothing)."""

    def planned(self, count: int) -> None: ...

    def skipped(self, count: int) -> None: ...

    def finished(self, record: TrialRecord) -> None: ...

    def close(self) -> None: ...


class Quiet:
    def planned(self, count: int) -> None:
        pass

    def skipped(self, count: int) -> None:
        pass

    def finished(self, record: TrialRecord) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Prepared:
    """A campaign whose inputs are all read and checked; its folder is not written yet."""

    settings: CampaignSettings
    command: str  # matrix | fuzz | repro
    inv: Inventory
    libs: tuple[Library, ...]
    expectations: tuple[Expectation, ...]
    folder: ResultsFolder
    baseline: Baseline | None = None  # --baseline: the earlier campaign to compare with

    @property
    def out(self):
        return self.folder.out

    def trials(self, servers_for: Sequence[Library] | None = None, confirm: bool = True,
               pool: ServerPool | None = None, keep_printed: bool = False) -> Trials:
        return self.settings.run.trials(self.inv, tuple(servers_for or self.libs), confirm, pool,
                                        keep_printed)

    def resume_command(self) -> str | None:
        """The command that continues this campaign (matrix only: fuzz and repro start anew)."""
        if self.command != "matrix":
            return None
        words, typed = [], list(self.settings.invocation or (self.command, self.inv.target))
        targets = set(self.settings.target.targets)
        while typed:
            word = typed.pop(0)
            if word == "--out" and typed:
                typed.pop(0)
            elif word in PATH_OPTIONS and typed:
                words += [word, os.path.abspath(typed.pop(0))]
            elif word.partition("=")[0] in PATH_OPTIONS:
                option, _, value = word.partition("=")
                words.append(f"{option}={os.path.abspath(value)}")
            elif word in targets and not word.startswith("-") and Path(word).exists():
                words.append(os.path.abspath(word))  # a target given by its relative path
            elif word != "--resume" and not word.startswith("--out="):
                words.append(word)
        # loadfuzz as its repro commands call it: a CI job may not have it on PATH; every path
        # absolute, so that it runs from any folder
        return shlex.join([*loadfuzz_command(), *words, "--resume", "--out",
                           os.path.abspath(self.out)])


PATH_OPTIONS = ("--add", "--expect", "--baseline")  # matrix's options whose value is a path


def prepare(settings: CampaignSettings, command: str, suffix: str = "",
            baseline: Path | None = None, checked: Checked | None = None) -> Prepared:
    """The campaign: its input checked (`check_input`, unless `checked` says it was), then
    its target read; UsageError if bad."""
    resumable = command == "matrix"
    checked = checked or check_input(settings, command, baseline)
    expectations, earlier = checked.expectations, checked.baseline
    inv, libs = settings.target.load()
    if command == "matrix" and len(libs) < 2:  # no pair: a green run that tested nothing
        chosen = " selected" if settings.target.select or settings.target.exclude else ""
        raise UsageError(f"a matrix pairs libraries, and {inv.target} has {len(libs)}{chosen}: "
                         f"give it two or more (`loadfuzz run` loads one)")
    check_shard(settings, command, libs)
    out = settings.out or default_out(inv.folder_name, suffix)
    folder = ResultsFolder(out, settings.resume, inv.locate, resumable, default=not settings.out)
    return Prepared(settings, command, inv, libs, expectations, folder, earlier)


def check_shard(settings: CampaignSettings, command: str, libs: Sequence[Library]) -> None:
    """UsageError when `--shard K/N` cuts the work into more slices than it has items (a
    matrix's pairs, a fuzz campaign's first libraries): some shard would test nothing, and a
    green run that tested nothing is no pass."""
    shard = settings.shard
    units, what = ((plan.pair_count(libs, settings.flags), "pairs") if command == "matrix"
                   else (len(libs), "first libraries"))
    if command in ("matrix", "fuzz") and shard.count > units:
        raise UsageError(f"--shard {shard}: the {command} has {units} {what} to share out, so "
                         f"at most {units} shards (shard {units + 1} on would test nothing)")


def run_work(work: Sequence[Steps], trials: Trials, folder: ResultsFolder, jobs: int,
             watcher: Watcher) -> list[TrialRecord]:
    """Run every sequence not already in the folder, `jobs` at a time; all records, in order."""
    todo = [seq for seq in work if sequence_key(seq) not in folder.done]
    results = dict(folder.done)
    watcher.skipped(len(work) - len(todo))

    def keep(record: TrialRecord) -> None:
        folder.append(record)
        results[record.key()] = record
        watcher.finished(record)

    run_all(trials, todo, jobs, keep)
    return [results[sequence_key(seq)] for seq in work]


def summarize(campaign: Prepared, records: Iterable[TrialRecord], findings: Sequence[TrialRecord],
              trials: Trials, started: str, elapsed_s: float, **extra: Any) -> dict[str, Any]:
    """The `--json` object of a campaign, plus what the reports show besides."""
    records = list(records)
    expected, unexpected, stale, environment = sort_findings(findings, campaign.expectations)
    shard = campaign.settings.shard
    if campaign.baseline is not None:
        extra["baseline"] = campaign.baseline.compare([r.to_json() for r in findings],
                                                      [r.to_json() for r in records])
    return {
        "target": campaign.inv.target,
        "targets": list(campaign.inv.labels),
        "libraries": [lib.id for lib in campaign.libs],
        "flags": [mode.value for mode in campaign.settings.flags],
        "trials": len(records),
        "findings": [r.to_json() for r in findings],
        "unexpected": [r.to_json() for r in unexpected],
        "stale": [e.to_json() for e in stale],
        "command": campaign.command,
        "version": campaign.inv.version,
        "out": str(campaign.out),
        "shard": None if shard.whole else str(shard),
        "fail_on": campaign.settings.fail_on,
        "expected": [{"record": r.to_json(), "why": e.why} for r, e in expected],
        "expectations": [e.to_json() for e in campaign.expectations],
        "preload": list(dict.fromkeys(str(step.path) for step in trials.preload)),
        "throughput": round(len(records) / elapsed_s, 1) if elapsed_s > 0 else None,
        "disagreements": [d.to_json() for d in trials.disagreements],
        "environment": [r.to_json() for r in environment],
        "servers": trials.usage.to_json(),
        "prediction": predict.agreement(campaign.inv, records),
        "started": started,
        "finished": utc_now(),
        **extra,
    }


def exit_status(summary: dict[str, Any], fail_on: str = "unexpected") -> int:
    """0: nothing unexpected; 1: a finding no expectation covers (`fail_on` "new": one that
    is also new since the baseline)."""
    if fail_on == "new":
        return 1 if new_and_unexpected(summary) else 0
    return 1 if summary["unexpected"] else 0


def write_partial(campaign: Prepared, records: Sequence[TrialRecord],
                  findings: Sequence[TrialRecord], trials: Trials, started: str, elapsed_s: float,
                  per: str, **extra: Any) -> None:
    """The summary and the reports of the trials finished so far, marked incomplete, when the
    folder can still take them (a full disk may be why the campaign stopped)."""
    summary = summarize(campaign, records, findings, trials, started, elapsed_s, incomplete=True,
                        resume=campaign.resume_command(), **extra)
    with contextlib.suppress(OSError):
        campaign.folder.write_reports(summary, records, per=per)


def run_matrix(campaign: Prepared, watcher: Watcher, pool: ServerPool | None = None,
               ) -> tuple[dict[str, Any], list[TrialRecord]]:
    """Every ordered pair of the selected libraries under each flags mode (this shard's slice),
    into the results folder; the summary and every record, reports written. Stopped (a signal)
    or failing, it leaves a partial summary and report of what finished, then raises.
    `pool`: fork servers already starting (`ahead`), closed when the run ends."""
    settings = campaign.settings
    work = plan.pairs(campaign.libs, settings.flags, settings.shard)
    watcher.planned(len(work))
    started, clock = utc_now(), time.monotonic()
    try:  # the runner is made before the folder is taken: stopped while it is made (its
        # imports, its tiers), a campaign leaves nothing, not a folder without a summary
        with campaign.trials(pool=pool) as trials:
            campaign.folder.open()
            try:
                records = run_work(work, trials, campaign.folder, settings.run.jobs, watcher)
            except BaseException:
                trials.close()
                done = [campaign.folder.records[key] for key in map(sequence_key, work)
                        if key in campaign.folder.records]
                write_partial(campaign, done, [r for r in done if not r.clean], trials, started,
                              time.monotonic() - clock, "pair")
                raise
            findings = [r for r in records if not r.clean]
            summary = summarize(campaign, records, findings, trials, started,
                                time.monotonic() - clock,
                                interposition=predict.interposition(campaign.inv, records))
        campaign.folder.write_reports(summary, records, per="pair")  # the folder still ours
    finally:
        watcher.close()
        campaign.folder.close()
    return summary, records
