"""Results: the `--out` folder of a campaign, written as it goes and rendered at the end.

Every finished trial is appended to `trials.jsonl` at once, as one whole line
in one write, so a campaign killed at any moment keeps every trial it
finished and `--resume` runs only the rest; a write that fails (a full disk)
is cut back so the file still ends in a whole line. At the end the summary
and the reports (see `report`) are written beside it, and the Markdown report
is appended to `$GITHUB_STEP_SUMMARY` when that is set.

One campaign writes a folder at a time: `open` takes a lock (`.lock`, flock),
so a second campaign on the same `--out` is refused even when both start at
the same instant.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadfuzz import entries, report
from loadfuzz.model import Key, TrialRecord, UsageError

LOCK = ".lock"
# What a campaign writes at its end (and a stopped one, marked incomplete), summary.json last.
REPORTS = ("summary.json", "report.md", "matrix.html", "junit.xml")
# Errors that say the results folder cannot take more (rather than a bug of loadfuzz's).
FULL_OR_READ_ONLY = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO,
                     errno.EFBIG)


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def default_out(folder_name: str, suffix: str = "") -> Path:
    """results/<name>-<version>/<UTC time><suffix>/ (see Inventory.folder_name)"""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path("results") / folder_name / f"{stamp}{suffix}"


class ResultsFolder:
    """The `--out` folder: trials.jsonl appended per trial, then the reports.

    Made before anything is written, so that a folder that cannot be used is
    bad input found before the campaign starts.
    """

    def __init__(self, out: Path, resume: bool, locate: Callable[[str], Path],
                 resumable: bool = True, default: bool = False):
        """`resumable`: the command has a `--resume` (said when the folder is taken);
        `default`: `out` is the default name, not the user's (see `open`)."""
        self.out = out
        self.default = default
        self.resumable = resumable
        self.trials_path = out / "trials.jsonl"
        if default:  # taken meanwhile or not, `open` finds it a free name
            usable(out, "--out")
        else:
            check_out(out, resume, resumable)
        self.resume = resume
        self.done: dict[Key, TrialRecord] = {}
        if resume:
            self.done = self._recorded(locate)
        self.records: dict[Key, TrialRecord] = dict(self.done)  # everything in trials.jsonl
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._lock_fd: int | None = None

    def _recorded(self, locate: Callable[[str], Path]) -> dict[Key, TrialRecord]:
        """The trials of the folder's trials.jsonl (for --resume); UsageError, naming the line,
        for one that is not a trial record of this campaign."""
        done: dict[Key, TrialRecord] = {}
        try:  # (a torn last line is left out here, and cut off once `open` holds the lock)
            data = self.trials_path.read_bytes()
            lines = data[:data.rfind(b"\n") + 1].decode("utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--resume: cannot read {self.trials_path} ({exc})") from None
        for number, line in enumerate(lines, 1):
            try:
                record = TrialRecord.from_json(json.loads(line), locate)
            except UsageError as exc:
                raise UsageError(f"--resume: {self.trials_path} line {number}: {exc}") from None
            except (ValueError, TypeError, KeyError, AttributeError, IndexError,
                    RecursionError) as exc:
                raise UsageError(f"--resume: {self.trials_path} line {number} is not a trial "
                                 f"record ({exc or type(exc).__name__}); start again with "
                                 "another --out") from None
            if len(record.sequence) != 2 or not (record.clean or "cold" in record.via):
                # a matrix keeps pairs, and confirms each finding cold before it keeps it
                raise UsageError(f"--resume: {self.trials_path} line {number} is no trial of a "
                                 "matrix campaign: only a matrix campaign can be resumed")
            done[record.key()] = record
        return done

    def _claim(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        name = self.out.name
        for number in itertools.count(2):
            try:
                self.out.mkdir()
                break
            except FileExistsError:
                self.out = self.out.with_name(f"{name}-{number}")
        self.trials_path = self.out / "trials.jsonl"

    def _repair(self) -> None:
        """Drop a torn last line (the campaign was killed in the middle of one)."""
        data = self.trials_path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.trials_path.open("r+b") as file:
                file.truncate(data.rfind(b"\n") + 1)

    def open(self) -> None:
        """Take the folder (UsageError when another campaign holds it) and open trials.jsonl.
        A default folder is this campaign's alone: made here, or when a campaign started in the
        same second made it first, the next free name beside it (`<time>-2`, `<time>-3`, ...)."""
        if self.default:
            self._claim()
        self.out.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.out / LOCK, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            raise UsageError(f"{self.out} is in use by another campaign: wait for it, or pass "
                             "another --out") from None
        if not self.resume and holds_results(self.out) and self.trials_path.exists():
            self.close()  # another campaign wrote here between our check and our lock
            raise UsageError(taken_message(self.out, self.resumable))
        if self.resume:  # what the earlier stop wrote describes it: gone until this run's end
            self._repair()
            for name in REPORTS:
                with contextlib.suppress(FileNotFoundError):
                    (self.out / name).unlink()
            shutil.rmtree(self.out / "repro", ignore_errors=True)
        self._fd = os.open(self.trials_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                           0o644)

    def append(self, record: TrialRecord) -> None:
        """Append one record as one whole line; on a failed write, cut the file back to the last
        whole line and raise (OSError), so that nothing torn is ever left behind."""
        line = json.dumps(record.to_json(), ensure_ascii=False).encode("utf-8", "backslashreplace")
        data = memoryview(line + b"\n")
        with self._lock:
            assert self._fd is not None, "open() the folder first"
            whole = os.fstat(self._fd).st_size
            try:
                while data:
                    data = data[os.write(self._fd, data):]
            except OSError:
                with contextlib.suppress(OSError):  # else --resume drops the torn line
                    os.ftruncate(self._fd, whole)
                raise
            self.records[record.key()] = record

    def close(self) -> None:
        for name in ("_fd", "_lock_fd"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def write_reports(self, summary: dict[str, Any], records: Iterable[TrialRecord], per: str) -> None:
        """summary.json, report.md, matrix.html, junit.xml and repro/ (and the step summary)."""
        trials = [r.to_json() for r in records]
        report.write_all(self.out, summary, trials, per=per)
        append_step_summary(report.markdown_summary(summary, trials))


def append_step_summary(text: str) -> None:
    """Append the report to `$GITHUB_STEP_SUMMARY`, when set. It was checked with the input;
    should it fail all the same (a full disk), a warning says so: the results folder is whole,
    and the campaign's exit status stands."""
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not step_summary:
        return
    try:
        with open(step_summary, "a", encoding="utf-8") as file:
            file.write(text + "\n")
    except OSError as exc:
        print(f"loadfuzz: warning: GITHUB_STEP_SUMMARY={step_summary}: could not append the "
              f"report ({exc.strerror or exc}); the results folder is whole", file=sys.stderr)


def taken_message(out: Path, resumable: bool) -> str:
    """Why `out` cannot take a new campaign; --resume offered where there is one to continue
    (not while a campaign still runs there: it would be refused as well)."""
    if not (out / "trials.jsonl").exists():
        return f"{out} holds other files (no campaign's): pass another --out"
    if in_use(out):
        return f"{out} is in use by another campaign: wait for it, or pass another --out"
    return f"{out} already holds results: pass {'--resume or ' if resumable else ''}another --out"


def in_use(out: Path) -> bool:
    """Whether a running campaign holds `out` (its lock file; nothing is written to see)."""
    try:
        fd = os.open(out / LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def check_out(out: Path, resume: bool, resumable: bool = True) -> None:
    """UsageError unless `out` can take this campaign: a folder this process can write in,
    holding a campaign to continue with `resume`, and none without (`resumable`: the command
    has a `--resume`). Cheap: a campaign checks it before it reads its target."""
    if resume and not (out / "trials.jsonl").exists():
        raise UsageError(f"--resume: {out} holds no campaign (no trials.jsonl)")
    if resume and (command := summary_command(out)) not in (None, "matrix"):
        raise UsageError(f"--resume: {out} holds a {command} campaign: only a matrix campaign "
                         "can be resumed")
    usable(out, "--out")  # an existing file too: it is not a folder
    if not resume and holds_results(out):
        raise UsageError(taken_message(out, resumable))


def read_summary(out: Path) -> dict[str, Any] | None:
    """The summary.json in `out`, or None when there is none that reads as one (not yet
    written, cut short, not a file)."""
    try:
        summary = json.loads(entries.read_regular(out / "summary.json").decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    return summary if isinstance(summary, dict) else None


def summary_command(out: Path) -> str | None:
    """The command named by the summary.json in `out`, when there is one that says."""
    command = (read_summary(out) or {}).get("command")
    return command if isinstance(command, str) else None


def check_step_summary() -> None:
    """UsageError unless `$GITHUB_STEP_SUMMARY`, when set, names a file this process can append
    to, or make (found out at the end, a bad one turned a finished campaign into exit 3)."""
    value = os.environ.get("GITHUB_STEP_SUMMARY")
    if not value:
        return
    path = Path(os.path.abspath(value))
    if path.is_dir():
        raise UsageError(f"GITHUB_STEP_SUMMARY={value}: a folder, not a file")
    if not path.exists() and not path.parent.is_dir():
        raise UsageError(f"GITHUB_STEP_SUMMARY={value}: no such folder {path.parent}")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise UsageError(f"GITHUB_STEP_SUMMARY={value}: cannot write there")


def holds_results(out: Path) -> bool:
    return out.is_dir() and any(p.name != LOCK for p in out.iterdir())


def usable(folder: Path, what: str) -> None:
    """UsageError unless `folder` is, or can be made, a folder this process can write in: its
    nearest existing ancestor is a folder, and a writable one when `folder` does not exist yet.
    Where a folder is to be made, a probe folder of a name no one else uses is made beside it
    and removed again: permission bits do not tell (root may write anywhere they say, but not
    in /proc, /sys or a read-only mount). Never `folder` itself: another campaign may make it
    and take its lock between our mkdir and rmdir."""
    existing = Path(os.path.abspath(folder))
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if existing.is_symlink() and not existing.exists():  # no folder can be made where it is
        raise UsageError(f"{what} {folder}: {existing} is a symbolic link to "
                         f"{os.readlink(existing)}, which does not exist")
    if not existing.is_dir():
        raise UsageError(f"{what} {folder}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {folder}: cannot write in {existing}")
    if existing != Path(os.path.abspath(folder)):
        made = Path(os.path.abspath(folder)).relative_to(existing).parts[0]
        try:
            probe = Path(tempfile.mkdtemp(prefix=f".{made}.probe-", dir=existing))
        except OSError as exc:
            raise UsageError(f"{what} {folder}: cannot make a folder in {existing}: "
                             f"{exc.strerror or exc}") from None
        with contextlib.suppress(OSError):
            probe.rmdir()


def finished_summary(folder: Path, where: str) -> dict[str, Any]:
    """The summary.json of a finished matrix or fuzz campaign in `folder` (for --baseline and
    merge); UsageError, naming the folder as `where`, when there is none."""
    path = folder / "summary.json"
    if not path.is_file():
        raise UsageError(f"{where}: not a results folder (no summary.json)")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UsageError(f"{where}: cannot read summary.json: {exc}") from None
    if not isinstance(summary, dict) or summary.get("command") not in ("matrix", "fuzz"):
        raise UsageError(f"{where}: not the results folder of a matrix or fuzz campaign")
    if summary.get("incomplete"):
        raise UsageError(f"{where}: the campaign there was stopped before it finished "
                         "(its summary is incomplete)")
    return summary
