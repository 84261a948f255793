"""Bench: the ordered-pair matrix of the installed executorch, the plain way and loadfuzz's way.

    .venv/bin/python -m loadfuzz.bench [--target executorch] [--flags global]

The plain way is one fresh process per trial, one at a time; loadfuzz's
defaults are fork servers that preloaded what is not under test, one per
core, and row servers for the rows that share a first step. Both classify
every pair; `identical` says whether they agree on every one. The floor is
what a trial cannot cost less than on one core: fork, the dlopen calls the
trial makes itself and the wait, measured in a process that holds what its
server holds, with no harness and no protocol. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadfuzz import inventory, plan
from loadfuzz.campaign import sequence_key
from loadfuzz.execute import Limits
from loadfuzz.model import Flags
from loadfuzz.trial import Trials, run_all, same_verdict


def timed(trials: Trials, work, jobs: int) -> tuple[float, list]:
    """Seconds for the whole work list the way every campaign runs it, and the records in order."""
    records = {}

    def keep(record) -> None:
        records[record.key()] = record

    started = time.perf_counter()
    run_all(trials, work, jobs, keep)
    return time.perf_counter() - started, [records[sequence_key(seq)] for seq in work]


def in_child(measure: Callable[[], Any]) -> Any:
    """`measure()` (a JSON value) in a forked, quiet child: what it loads stays out of this process."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        quiet = os.open(os.devnull, os.O_WRONLY)  # what the libraries print is not the bench's
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        os.write(writer, json.dumps(measure()).encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as answer:
        value = json.loads(answer.read())
    os.waitpid(pid, 0)
    return value


def load(path: Path, mode: str) -> None:
    ctypes.CDLL(str(path), mode=os.RTLD_NOW | (os.RTLD_GLOBAL if mode == "g" else os.RTLD_LOCAL))


def load_step(step) -> None:
    load(step.path, "g" if step.flags is Flags.GLOBAL else "l")


def fork_and_load(steps) -> float:
    """Seconds of fork, a dlopen per step, _exit and wait."""
    began = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            for step in steps:
                load_step(step)
        except OSError:
            os._exit(1)
        os._exit(0)
    os.waitpid(pid, 0)
    return time.perf_counter() - began


def floor_per_trial(trials: Trials, work, samples: int = 30) -> float:
    """Median seconds of fork + the trial's own dlopens + _exit + wait, the way it runs.

    Per fork-server tier and per path: a trial of a shared row pays only for
    the steps after the row's first, in a process that holds the tier's
    preload and that first step; any other trial for all its steps, after
    the preload. Measured in child processes (they must not keep libtorch
    mapped in this one) over `samples` trials of each, weighted by how many
    trials of the work take each.
    """
    groups: dict[tuple, list] = {}
    for batch in trials.batches(work):
        groups.setdefault((tuple(trials.preload_of(batch[0])), len(batch) > 1), []).append(batch)
    total = 0.0
    for (preload, shared), batches in groups.items():
        taken, left = [], samples
        for batch in batches:
            if left > 0:
                taken.append(batch[:left])
                left -= len(taken[-1])
        times = in_child(lambda preload=preload, shared=shared, taken=taken:
                         tier_times(preload, taken, shared))
        total += statistics.median(times) * sum(len(batch) for batch in batches)
    return total / len(work)


def tier_times(preload, batches, shared: bool) -> list[float]:
    for step in preload:
        load(step.path, step.mode)
    if not shared:
        return [fork_and_load(seq) for batch in batches for seq in batch]

    def row_times(row) -> list[float]:  # in a process that took the row's first step
        load_step(row[0][0])
        return [fork_and_load(seq[1:]) for seq in row]

    return [t for row in batches for t in in_child(lambda row=row: row_times(row))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loadfuzz-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="executorch")
    parser.add_argument("--flags", default="global")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)

    inv = inventory.load_target(args.target)
    libs = inv.libraries
    work = plan.pairs([(lib.id, lib.path) for lib in libs], Flags.parse_list(args.flags))
    limits = Limits()

    needs_python, preload_of = plan.trial_hooks(libs)
    print(f"bench: {len(work)} ordered pairs of {len(libs)} libraries in {inv.target} "
          f"{inv.version} ({args.flags}), {args.jobs} jobs", file=sys.stderr)
    with Trials(limits, needs_python, cold=True) as plain:
        plain_s, plain_records = timed(plain, work, 1)
    with Trials(limits, needs_python, preload=preload_of) as fast:
        fast_s, fast_records = timed(fast, work, args.jobs)
        disagreements = len(fast.disagreements)
        preload = fast.preload
    identical = all(same_verdict(a, b) for a, b in zip(plain_records, fast_records, strict=True))
    floor = floor_per_trial(fast, work)
    per_trial = fast_s / len(work)
    findings = sum(not r.clean for r in fast_records)
    print(f"plain_s={plain_s:.2f} loadfuzz_s={fast_s:.2f} speedup={plain_s / fast_s:.1f}x "
          f"trials={len(work)} identical={str(identical).lower()} "
          f"ms_per_trial={per_trial * 1000:.2f}")
    print(f"floor_ms_per_trial={floor * 1000:.2f} (fork + a trial's own dlopens + wait, one core) "
          f"loadfuzz_ms_per_trial_per_worker={per_trial * args.jobs * 1000:.2f} "
          f"findings={findings} disagreements={disagreements} "
          f"preload={','.join(Path(s.path).name for s in preload)}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
