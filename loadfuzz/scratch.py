"""Scratch: folders a command makes and removes itself, which a SIGKILL cannot leave for good.

A command that makes one (`held`) holds an exclusive flock on it while it
lives; the kernel drops the lock with the process, however the process ended.
The next command to make a folder of the same kind removes (`sweep`) those
whose lock is free and that nothing touched for a minute (a younger one may
be being made: its lock comes a moment after its `mkdir`). Used for the fork
servers' folders, wheels being unpacked into the cache and merges being
staged beside their `--out`.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

STALE_S = 60.0  # a folder younger than this is never swept (it may be being made)


def held(parent: Path, prefix: str) -> tuple[Path, int]:
    """A new folder `parent/<prefix><random>`, and the descriptor that holds its lock: while
    that is open, no `sweep` removes the folder (closing it is the owner's job)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    return folder, hold(folder)


def hold(folder: Path) -> int:
    """Lock a folder just made (as `held` does): the descriptor that holds the lock."""
    owner = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(owner, fcntl.LOCK_EX)
    return owner


def sweep(parent: Path, prefix: str, stale_s: float = STALE_S) -> int:
    """Remove the folders `parent/<prefix>*` whose owner is gone (their lock is free) and that
    nothing touched for `stale_s`; how many."""
    removed = 0
    for folder in parent.glob(prefix + "*"):
        try:
            info = folder.lstat()  # (one look: its age, and that it is no symlink)
            if stat.S_ISLNK(info.st_mode) or time.time() - info.st_mtime < stale_s:
                continue
            lock = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its owner is alive
        else:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
        finally:
            os.close(lock)
    return removed
