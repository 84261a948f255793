"""Floor: what a trial cannot cost less than, timed in a process as small as a fork server.

    python tools/floor.py < tiers.json

The bench's measure of a trial's floor: fork, the dlopen calls the trial
makes itself, _exit and wait, with no harness and no protocol. Each forked
process copies the page tables of the one it forks from, so the timing must
not come from a big process: this one imports only the standard library
(the bench's own process holds the inventory and forks twice as slowly).

Reads a JSON list of tiers, each `{"preload": [[mode, path], ...], "shared":
bool, "rows": [[trial, ...], ...]}`, a trial being `[[mode, path], ...]` and
a mode `g` or `l`. A child loads the tier's preload and backs its heap with
huge pages, as a fork server does (see `huge_heap`); for a shared tier, a
grandchild per row also takes the row's first step, as a row server has, and
times only the steps after it. Prints the median seconds per trial of each
tier, as one JSON list.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

MADV_COLLAPSE = 25  # Linux 6.1


def in_child(measure: Callable[[], Any]) -> Any:
    """`measure()` (a JSON value) in a forked child, quiet: what it loads stays out of this process."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        quiet = os.open(os.devnull, os.O_WRONLY)  # what the libraries print is not the floor's
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        os.write(writer, json.dumps(measure()).encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as answer:
        value = json.loads(answer.read())
    os.waitpid(pid, 0)
    return value


def load(step: list[str]) -> None:
    mode, path = step
    ctypes.CDLL(path, mode=os.RTLD_NOW | (os.RTLD_GLOBAL if mode == "g" else os.RTLD_LOCAL))


def fork_and_load(steps: list[list[str]]) -> float:
    """Seconds of fork, a dlopen per step, _exit and wait."""
    began = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            for step in steps:
                load(step)
        except OSError:
            os._exit(1)
        os._exit(0)
    os.waitpid(pid, 0)
    return time.perf_counter() - began


def row_times(row: list[list[list[str]]]) -> list[float]:
    """In a process that took the row's first step, as its row server has."""
    load(row[0][0])
    return [fork_and_load(trial[1:]) for trial in row]


def huge_heap() -> None:
    """madvise(MADV_COLLAPSE) on each anonymous private read-write mapping of 2 MiB or more,
    as the harness does after its preloads: a fork then copies a page table entry per 2 MiB
    instead of per 4 KiB page (best effort: an older kernel refuses)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            span, perms, inode = fields[0], fields[1], fields[4]
            start, end = (int(x, 16) for x in span.split("-"))
            anonymous = inode == "0" and (len(fields) == 5 or fields[5] == "[heap]")
            if anonymous and perms == "rw-p" and end - start >= 2 << 20:
                libc.madvise(start, end - start, MADV_COLLAPSE)


def tier_times(tier: dict[str, Any]) -> list[float]:
    for step in tier["preload"]:
        load(step)
    huge_heap()
    if not tier["shared"]:
        return [fork_and_load(trial) for row in tier["rows"] for trial in row]
    return [t for row in tier["rows"] for t in in_child(lambda row=row: row_times(row))]


def main() -> int:
    tiers = json.load(sys.stdin)
    medians = [statistics.median(in_child(lambda tier=tier: tier_times(tier))) for tier in tiers]
    print(json.dumps(medians))
    return 0


if __name__ == "__main__":
    sys.exit(main())
