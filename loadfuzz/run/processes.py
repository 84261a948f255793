"""Processes: what a harness process holds and how its tree ends, seen from outside (psutil, /proc).

A fork server must be one process that a fork copies whole; when it goes, so
must everything below it and everything in its process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


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
