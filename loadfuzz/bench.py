"""Bench: the ordered-pair matrix of the installed executorch, the plain way and loadfuzz's way.

    .venv/bin/python -m loadfuzz.bench [--target executorch] [--flags global]

The plain way is one fresh process per trial, one at a time; loadfuzz's
defaults are fork servers that preloaded what is not under test, one per
core. Both classify every pair; `identical` says whether they agree on every
one. The floor is what a trial cannot cost less than on one core: fork, the
trial's dlopen calls and the wait, measured in a process that preloaded the
same libraries, with no harness and no protocol. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

from loadfuzz import inventory, plan
from loadfuzz.execute import Limits
from loadfuzz.model import Flags
from loadfuzz.trial import Trials, same_verdict


def run_all(trials: Trials, work, jobs: int) -> tuple[float, list]:
    from concurrent.futures import ThreadPoolExecutor

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        records = list(pool.map(trials.run, work))
    return time.perf_counter() - started, records


def floor_per_trial(preload_of, work, samples: int = 30) -> float:
    """Median seconds of fork + the trial's dlopens + _exit + wait, after the same preload.

    Measured in a child process per preload tier (it must not keep libtorch mapped
    in this one), over the first `samples` trials of each tier, weighted by how
    many trials of the work each tier takes.
    """
    tiers: dict[tuple, list] = {}
    for seq in work:
        tiers.setdefault(preload_of(seq), []).append(seq)
    total = 0.0
    for preload, seqs in tiers.items():
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(reader)
            quiet = os.open(os.devnull, os.O_WRONLY)  # what the libraries print is not the bench's
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            median = tier_floor(preload, seqs[:samples])
            os.write(writer, f"{median}".encode())
            os._exit(0)
        os.close(writer)
        with os.fdopen(reader) as answer:
            median = float(answer.read())
        os.waitpid(pid, 0)
        total += median * len(seqs)
    return total / len(work)


def tier_floor(preload, work) -> float:
    for step in preload:
        ctypes.CDLL(str(step.path), mode=os.RTLD_NOW | (os.RTLD_GLOBAL if step.mode == "g"
                                                         else os.RTLD_LOCAL))
    times = []
    for seq in work:
        began = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            for step in seq:
                mode = os.RTLD_NOW | (os.RTLD_GLOBAL if step.flags is Flags.GLOBAL
                                      else os.RTLD_LOCAL)
                try:
                    ctypes.CDLL(str(step.path), mode=mode)
                except OSError:
                    os._exit(1)
            os._exit(0)
        os.waitpid(pid, 0)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


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
        plain_s, plain_records = run_all(plain, work, 1)
    with Trials(limits, needs_python, preload=preload_of) as fast:
        fast_s, fast_records = run_all(fast, work, args.jobs)
        disagreements = len(fast.disagreements)
        preload = fast.preload
    identical = all(same_verdict(a, b) for a, b in zip(plain_records, fast_records, strict=True))
    floor = floor_per_trial(preload_of, work)
    per_trial = fast_s / len(work)
    findings = sum(not r.clean for r in fast_records)
    print(f"plain_s={plain_s:.2f} loadfuzz_s={fast_s:.2f} speedup={plain_s / fast_s:.1f}x "
          f"trials={len(work)} identical={str(identical).lower()} "
          f"ms_per_trial={per_trial * 1000:.2f}")
    print(f"floor_ms_per_trial={floor * 1000:.2f} (fork + dlopens + wait, one core) "
          f"loadfuzz_ms_per_trial_per_worker={per_trial * args.jobs * 1000:.2f} "
          f"findings={findings} disagreements={disagreements} "
          f"preload={','.join(Path(s.path).name for s in preload)}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
