"""Processes: a harness process, its tree and its scratch folder, seen and ended from outside.

A fork server must be one process that a fork copies whole; when it goes, so
must everything below it and everything in its process group, and its
scratch folder. A loadfuzz killed by SIGKILL cleans nothing up: the servers
end by themselves (their control pipe hangs up), and their scratch folders
are removed by the next loadfuzz that starts servers (`sweep_scratch`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

SCRATCH_PREFIX = "loadfuzz-server-"
STALE_S = 60.0  # a scratch folder younger than this is never swept (it may be being made)
# What to ask one os.read of a pipe for: its capacity. os.read allocates all it is asked for
# first, and 1 MiB is an mmap and an munmap per read (20 us against 2 us, a tenth of a trial).
PIPE_READ = 1 << 16


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant (the harness is their subreaper, so all are below)."""
    import psutil  # 10 ms to import: not before a server is started

    try:
        root = psutil.Process(pid)
        family = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for proc in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(family, timeout=5)


def unforkable(pid: int, scratch: Path, pipes: dict[int, int]) -> str:
    """Why a server that preloaded libraries would not fork into copies of itself, or "".

    The checks a row server makes on itself after its prefix (docs/protocol.md),
    made from outside through /proc: one thread, no child, no POSIX timer, no
    pending signal, its working folder unchanged and empty, and its pipes (their
    numbers there -> our ends here) still ours. Interval timers are not visible
    from outside; a SIGALRM would end the server, which is seen."""
    proc = Path(f"/proc/{pid}")
    status = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines()
                  if ":" in line)
    if int(status["Threads"]) != 1:
        return "runs more than one thread"
    if (proc / "task" / str(pid) / "children").read_text().strip():
        return "has a child process"
    with contextlib.suppress(OSError):
        if (proc / "timers").read_text().strip():
            return "armed a timer"
    if int(status["SigPnd"], 16) or int(status["ShdPnd"], 16):
        return "has a signal pending"
    if Path(os.readlink(proc / "cwd")) != scratch.resolve() or any(scratch.iterdir()):
        return "changed its working folder"
    for theirs, ours in pipes.items():
        if os.readlink(proc / "fd" / str(theirs)) != f"pipe:[{os.fstat(ours).st_ino}]":
            return "touched its pipes"
    return ""


def end_group(pgid: int, wait_s: float = 5.0) -> None:
    """SIGKILL a process group and wait until it is gone (init reaps the orphans)."""
    deadline = time.monotonic() + wait_s
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
        while time.monotonic() < deadline:
            os.killpg(pgid, 0)  # ProcessLookupError once no member is left
            time.sleep(0.01)


def own_scratch() -> tuple[Path, int]:
    """A fresh scratch folder for a harness process, and the descriptor that holds its lock
    (flock on the folder itself): while it is open, no `sweep_scratch` removes the folder."""
    folder = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    owner = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(owner, fcntl.LOCK_EX)
    return folder, owner


def sweep_scratch(stale_s: float = STALE_S) -> int:
    """Remove the scratch folders whose owner is gone (its lock is free: the kernel drops it
    with the process, whatever ended it) and that nothing touched for `stale_s`; how many."""
    removed = 0
    for folder in Path(tempfile.gettempdir()).glob(SCRATCH_PREFIX + "*"):
        try:
            if time.time() - folder.stat().st_mtime < stale_s:
                continue
            lock = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its loadfuzz is alive
        else:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
        finally:
            os.close(lock)
    return removed
