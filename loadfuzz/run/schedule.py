"""Schedule: which thread runs which trials, `jobs` batches at a time.

A batch (see `trials.Trials.batches`) is a row, whose trials fork one after the
other from one row server, or a single sequence. A row runs on one thread, so
a work list of a few long rows, as a shard of a big matrix is, would leave a
thread idle while the longest row ends: `balance` cuts such rows into
pieces, each with a row server of its own (one more first step each: a fork
and the dlopen of a library that maps nothing heavy), and hands the longest
batches out first.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loadfuzz.model import Sequence, TrialRecord
from loadfuzz.run.tiers import Route

if TYPE_CHECKING:
    from loadfuzz.run.trials import Trials

# A row server costs about one trial (a fork, the first step, the END); below
# this many trials a row does not win that back.
MIN_ROW = 4


@dataclass(frozen=True)
class Batch:
    """Sequences run together (see `Trials.batches`): a row, with its row key, or one sequence."""

    sequences: tuple[Sequence, ...]
    route: Route | None = None  # the row key (see `Trials.row_key`), None for a single sequence

    def __len__(self) -> int:
        return len(self.sequences)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self.sequences)

    def __getitem__(self, index: int) -> Sequence:
        return self.sequences[index]


def balance(batches: list[Batch], jobs: int) -> list[Batch]:
    """The batches, cut so that `jobs` threads taking them in turn end at about the same time.

    Nothing changes on one thread, nor while every batch is at most half a
    thread's share (all the trials over `jobs`). Else every row longer than a
    quarter of a share is cut into even consecutive pieces of at most that,
    each with a row server of its own, and the longest batches go first. A
    costly row (its first step maps a heavy library, see `tiers.Route`) stays
    whole: a second row server would pay that step again."""
    share = -(-sum(map(len, batches)) // max(jobs, 1))
    if jobs <= 1 or max(map(len, batches), default=0) <= share // 2:
        return batches
    most = max(-(-share // 4), 2 * MIN_ROW)
    cut = []
    for batch in batches:
        if batch.route is None or batch.route.costly or len(batch) <= most:
            cut.append(batch)
            continue
        count = -(-len(batch) // most)  # pieces whose lengths differ by one at most
        bounds = [len(batch) * k // count for k in range(count + 1)]
        cut += [Batch(batch.sequences[start:end], batch.route)
                for start, end in itertools.pairwise(bounds)]
    return sorted(cut, key=len, reverse=True)


def run_all(trials: Trials, work: Iterable[Sequence], jobs: int,
            keep: Callable[[TrialRecord], None]) -> None:
    """Run every sequence, `jobs` batches at a time; `keep(record)` as each trial ends,
    one call at a time. On any exception (Ctrl-C, a failing `keep`) the servers close,
    ending their trials, and no further trial starts."""
    lock = threading.Lock()

    def run_batch(batch: Batch) -> None:
        for record in trials.run_batch(batch):
            if trials.closed:
                return
            with lock:
                keep(record)

    with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        futures = [pool.submit(run_batch, batch)
                   for batch in balance(trials.batches(work), jobs)]
        try:  # as_completed waits on all of them at once (a wait() per batch was O(n²))
            for future in as_completed(futures):
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            trials.close()
            raise
