"""Bench: the ordered-pair matrix of the installed executorch, the plain way and loadfuzz's way.

    .venv/bin/python tools/bench.py [--target executorch] [--flags global]

The plain way is one fresh process per trial, one at a time; loadfuzz's
defaults are fork servers that preloaded what is not under test, one per
core, and row servers for the rows that share a first step. Both classify
every pair; `identical` says whether they agree on every one. The floor is
what a trial cannot cost less than on one core: fork, the dlopen calls the
trial makes itself and the wait, timed in a small process that holds what
its server holds, with no harness and no protocol (tools/floor.py). The
child time is the same span as the servers timed it around each trial. A
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loadfuzz import inventory, plan
from loadfuzz.model import Flags, sequence_key
from loadfuzz.run.harness import HarnessStep, Limits, trial_environment
from loadfuzz.run.tiers import Tiers
from loadfuzz.run.trials import Trials, run_all, same_verdict

FLOOR = Path(__file__).with_name("floor.py")


def timed(trials: Trials, work, jobs: int) -> tuple[float, list]:
    """Seconds for the whole work list the way every campaign runs it, and the records in order."""
    records = {}

    def keep(record) -> None:
        records[record.key()] = record

    started = time.perf_counter()
    run_all(trials, work, jobs, keep)
    return time.perf_counter() - started, [records[sequence_key(seq)] for seq in work]


def floor_per_trial(trials: Trials, work, samples: int = 30) -> float:
    """Seconds a trial cannot go below, the way it runs (see tools/floor.py).

    Per fork-server tier and per path: a trial of a shared row pays only for
    the steps after the row's first, any other trial for all its steps. Each
    is timed over `samples` trials and weighted by how many trials of the
    work take it.
    """
    groups: dict[tuple, list] = {}
    for batch in trials.batches(work):
        groups.setdefault((trials.tiers.preload(batch[0]), len(batch) > 1), []).append(batch)
    tiers = []
    for (preload, shared), batches in groups.items():
        rows, left = [], samples
        for batch in batches:
            if left > 0:
                rows.append([[[HarnessStep.of(step.kind, step.flags, step.path).mode, str(step.path)]
                              for step in seq] for seq in batch[:left]])
                left -= len(rows[-1])
        tiers.append({"preload": [[step.mode, str(step.path)] for step in preload],
                      "shared": shared, "rows": rows})
    with tempfile.TemporaryDirectory(prefix="loadfuzz-floor-") as scratch:
        done = subprocess.run([sys.executable, str(FLOOR)], input=json.dumps(tiers),
                              capture_output=True, text=True, check=True, cwd=scratch,
                              env=trial_environment(Path(scratch)))
    medians = json.loads(done.stdout)
    weights = [sum(len(batch) for batch in batches) for batches in groups.values()]
    return sum(m * w for m, w in zip(medians, weights, strict=True)) / len(work)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loadfuzz-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="executorch")
    parser.add_argument("--flags", default="global")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)

    inv = inventory.load_target(args.target)
    libs = inv.libraries
    work = plan.pairs(libs, Flags.parse_list(args.flags))
    limits = Limits()
    tiers = Tiers.of(libs)
    print(f"bench: {len(work)} ordered pairs of {len(libs)} libraries in {inv.target} "
          f"{inv.version} ({args.flags}), {args.jobs} jobs", file=sys.stderr)
    with Trials(limits, tiers, cold=True) as plain:
        plain_s, plain_records = timed(plain, work, 1)
    with Trials(limits, tiers) as fast:
        fast_s, fast_records = timed(fast, work, args.jobs)
        disagreements = len(fast.disagreements)
        preload = fast.preload
        usage = fast.usage
    identical = all(same_verdict(a, b) for a, b in zip(plain_records, fast_records, strict=True))
    floor = floor_per_trial(fast, work)
    per_trial = fast_s / len(work)
    findings = sum(not r.clean for r in fast_records)
    # what the servers timed around each child: fork to reaped, with no protocol and no Python
    in_harness = statistics.mean(r.duration_s for r in fast_records if "cold" not in r.via)
    print(f"plain_s={plain_s:.2f} loadfuzz_s={fast_s:.2f} speedup={plain_s / fast_s:.1f}x "
          f"trials={len(work)} identical={str(identical).lower()} "
          f"ms_per_trial={per_trial * 1000:.2f}")
    print(f"floor_ms_per_trial={floor * 1000:.2f} (fork + a trial's own dlopens + wait, one core) "
          f"loadfuzz_ms_per_trial_per_worker={per_trial * args.jobs * 1000:.2f} "
          f"child_ms_per_trial={in_harness * 1000:.2f} "
          f"findings={findings} disagreements={disagreements} "
          f"preload={','.join(Path(s.path).name for s in preload)}")
    print(f"outside_trials: servers={usage.servers} server_start_s={usage.server_start_s:.2f} "
          f"rows_shared={usage.rows_shared} row_start_s={usage.row_start_s:.2f} "
          f"rows_not_shared={sum(usage.rows_not_shared.values())}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
