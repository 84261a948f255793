"""Campaign: run a work list into a results folder as it goes, and sum it up.

Shared by `matrix`, `fuzz` and `repro`. Every finished trial is appended to
`trials.jsonl` at once, as one whole line in one write, so a campaign killed
at any moment keeps every trial it finished and `--resume` runs only the
rest. The summary, the reports and the exit status come from the records,
the expectations file and nothing else.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadfuzz import report
from loadfuzz.expect import Expectation, classify_findings
from loadfuzz.model import Flags, TrialRecord, UsageError
from loadfuzz.model import Sequence as Steps
from loadfuzz.trial import Trials, run_all


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def default_out(name: str, version: str | None) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path("results") / f"{name}-{version or 'unversioned'}" / stamp


def sequence_key(seq: Steps) -> tuple:
    return tuple((s.kind.value, s.lib, s.flags.value) for s in seq)


class ResultsFolder:
    """The `--out` folder: trials.jsonl appended per trial, then the reports."""

    def __init__(self, out: Path, resume: bool, locate: Callable[[str], Path]):
        self.out = out
        self.trials_path = out / "trials.jsonl"
        if resume and not self.trials_path.exists():
            raise UsageError(f"--resume: {out} holds no campaign (no trials.jsonl)")
        if not resume and out.exists() and any(out.iterdir()):
            raise UsageError(f"{out} already holds results: pass --resume or another --out")
        self.done: dict[tuple, TrialRecord] = {}
        if resume:
            self._repair()
            for line in self.trials_path.read_text(encoding="utf-8").splitlines():
                record = TrialRecord.from_json(json.loads(line), locate)
                self.done[record.key()] = record
        self._lock = threading.Lock()
        self._fd: int | None = None

    def _repair(self) -> None:
        """Drop a torn last line (the campaign was killed in the middle of one)."""
        data = self.trials_path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.trials_path.open("r+b") as file:
                file.truncate(data.rfind(b"\n") + 1)

    def open(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.trials_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: TrialRecord) -> None:
        line = json.dumps(record.to_json(), ensure_ascii=False).encode("utf-8", "backslashreplace")
        with self._lock:
            assert self._fd is not None, "open() the folder first"
            os.write(self._fd, line + b"\n")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Progress:
    """done / total, findings so far and the rate, on a terminal only."""

    def __init__(self, total: int, label: str, stream: Any = sys.stderr):
        self.total, self.label, self.stream = total, label, stream
        self.enabled = bool(getattr(stream, "isatty", lambda: False)())
        self.started = time.monotonic()
        self.done = self.findings = 0

    def update(self, record: TrialRecord) -> None:
        self.done += 1
        self.findings += not record.clean
        if self.enabled:
            rate = self.done / max(time.monotonic() - self.started, 1e-9)
            total = f"/{self.total}" if self.total else ""
            self.stream.write(f"\r{self.label}: {self.done}{total} trials, "
                              f"{self.findings} findings, {rate:.1f} trials/s ")
            self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.stream.write("\n")


def run_work(work: Sequence[Steps], trials: Trials, folder: ResultsFolder, jobs: int,
             progress: Progress) -> list[TrialRecord]:
    """Run every sequence not already in the folder, `jobs` at a time; all records, in order."""
    todo = [seq for seq in work if sequence_key(seq) not in folder.done]
    results = dict(folder.done)
    progress.done += len(work) - len(todo)

    def keep(record: TrialRecord) -> None:
        folder.append(record)
        results[record.key()] = record
        progress.update(record)

    run_all(trials, todo, jobs, keep)
    progress.finish()
    return [results[sequence_key(seq)] for seq in work]


class RunOnce:
    """Runs each distinct sequence once per campaign and appends its record to the folder:
    a search (fuzz's rounds, repro's orders, shrinking) asks for the same sequence often."""

    def __init__(self, trials: Trials, folder: ResultsFolder, progress: Progress | None = None):
        self.trials, self.folder, self.progress = trials, folder, progress
        self.runs: dict[tuple, TrialRecord] = {}

    def __call__(self, seq: Steps) -> TrialRecord:
        key = sequence_key(seq)
        if key not in self.runs:
            record = self.trials.run(seq)
            self.folder.append(record)
            self.runs[key] = record
            if self.progress is not None:
                self.progress.update(record)
        return self.runs[key]


@dataclass(frozen=True)
class Campaign:
    """What a campaign was asked to do; the summary says what it found."""

    command: str  # matrix | fuzz | repro
    target: str
    name: str
    version: str | None
    libraries: tuple[str, ...]
    flags: tuple[Flags, ...]
    expectations: tuple[Expectation, ...]
    out: Path
    shard: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def summarize(campaign: Campaign, records: Iterable[TrialRecord], findings: Sequence[TrialRecord],
              trials: Trials, started: str, elapsed_s: float) -> dict[str, Any]:
    """The contract's `--json` object, plus what the reports show besides."""
    records = list(records)
    expected, unexpected, stale = classify_findings(findings, campaign.expectations)
    return {
        "target": campaign.target,
        "libraries": list(campaign.libraries),
        "flags": [mode.value for mode in campaign.flags],
        "trials": len(records),
        "findings": [r.to_json() for r in findings],
        "unexpected": [r.to_json() for r in unexpected],
        "stale": [e.to_json() for e in stale],
        "command": campaign.command,
        "version": campaign.version,
        "out": str(campaign.out),
        "shard": campaign.shard,
        "expected": [{"record": r.to_json(), "why": e.why} for r, e in expected],
        "preload": [str(step.path) for step in trials.preload],
        "throughput": round(len(records) / elapsed_s, 1) if elapsed_s > 0 else None,
        "disagreements": [d.to_json() for d in trials.disagreements],
        "servers": trials.usage.to_json(),
        "started": started,
        "finished": utc_now(),
        **campaign.extra,
    }


def write_results(folder: ResultsFolder, summary: dict[str, Any], records: Iterable[TrialRecord],
                  per: str) -> None:
    trials = [r.to_json() for r in records]
    report.write_all(folder.out, summary, trials, per=per)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as file:
            file.write(report.markdown_summary(summary, trials) + "\n")


def exit_status(summary: dict[str, Any]) -> int:
    return 1 if summary["unexpected"] else 0
