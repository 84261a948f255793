"""Processes: a harness process, its tree and its scratch folder, seen and ended from outside.

A fork server must be one process that a fork copies whole; when it goes, so
must everything below it and everything in its process group, and its
scratch folder. A loadfuzz killed by SIGKILL cleans nothing up: the servers
end by themselves (their control pipe hangs up), and their scratch folders
are removed by the next loadfuzz that starts servers (`sweep_scratch`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from pathlib import Path

from loadfuzz import scratch

SCRATCH_PREFIX = "loadfuzz-server-"
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
    (see `scratch.held`): while it is open, no `sweep_scratch` removes the folder."""
    return scratch.held(Path(tempfile.gettempdir()), SCRATCH_PREFIX)


def sweep_scratch() -> int:
    """Remove the servers' scratch folders whose owner is gone; how many (`scratch.sweep`)."""
    return scratch.sweep(Path(tempfile.gettempdir()), SCRATCH_PREFIX)
