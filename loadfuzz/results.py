"""Results: the `--out` folder of a campaign, written as it goes and rendered at the end.

Every finished trial is appended to `trials.jsonl` at once, as one whole line
in one write, so a campaign killed at any moment keeps every trial it
finished and `--resume` runs only the rest. At the end the summary and the
reports (see `report`) are written beside it, and the Markdown report is
appended to `$GITHUB_STEP_SUMMARY` when that is set.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadfuzz import report
from loadfuzz.model import Key, TrialRecord, UsageError


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def default_out(name: str, version: str | None, suffix: str = "") -> Path:
    """results/<name>-<version>/<UTC time><suffix>/"""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path("results") / f"{name}-{version or 'unversioned'}" / f"{stamp}{suffix}"


class ResultsFolder:
    """The `--out` folder: trials.jsonl appended per trial, then the reports.

    Made before anything is written, so that a folder that cannot be used is
    bad input found before the campaign starts.
    """

    def __init__(self, out: Path, resume: bool, locate: Callable[[str], Path]):
        self.out = out
        self.trials_path = out / "trials.jsonl"
        if resume and not self.trials_path.exists():
            raise UsageError(f"--resume: {out} holds no campaign (no trials.jsonl)")
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out}: not a folder")
        if not resume and out.exists() and any(out.iterdir()):
            raise UsageError(f"{out} already holds results: pass --resume or another --out")
        self.done: dict[Key, TrialRecord] = {}
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

    def write_reports(self, summary: dict[str, Any], records: Iterable[TrialRecord], per: str) -> None:
        """summary.json, report.md, matrix.html, junit.xml and repro/ (and the step summary)."""
        trials = [r.to_json() for r in records]
        report.write_all(self.out, summary, trials, per=per)
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as file:
                file.write(report.markdown_summary(summary, trials) + "\n")
