"""Rounds: the Hypothesis search of one search process, round after round of examples.

Hypothesis draws sequences of 1..`--max-len` steps (a library, and how it is
loaded: `local`, `global`, `python` when `--flags` has it, or a `py:` import
for a Python extension) whose first
step is one of this process's, in rounds of a fixed number of examples. A
failure raises an exception whose *type* is made from its identity, so
Hypothesis tells failures apart (it does not shrink them here: the campaign's
process simplifies each distinct failure once, `shrink`); `target()`
pulls the search towards sequences the prediction calls dangerous, but nothing
it calls safe is skipped. A failure already known is not raised again, so it
cannot hide the next one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, seed, settings, target
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from loadfuzz import hostenv, predict
from loadfuzz.inventory import Inventory
from loadfuzz.model import Sequence as Steps
from loadfuzz.model import Step, TrialRecord
from loadfuzz.search.once import RunOnce
from loadfuzz.search.shrink import Identity

ROUND_EXAMPLES = 150  # examples per Hypothesis round; the budget is checked between rounds


def sequences(options: Sequence[Step], first: Sequence[Step], max_len: int) -> st.SearchStrategy:
    """Sequences of 1..max_len steps whose first step is one of `first` (this shard's)."""
    return st.builds(lambda head, tail: (head, *tail), st.sampled_from(first),
                     st.lists(st.sampled_from(options), max_size=max_len - 1))


@dataclass
class Search:
    """The Hypothesis rounds of one search process (mutable, owned by a worker): each failure
    it raises is a distinct one as far as this process knows, as drawn: neither shrunk nor
    simplified (the campaign simplifies it once)."""

    inv: Inventory
    run: RunOnce
    options: list[Step]
    found_elsewhere: Callable[[], Iterable[tuple]] = tuple  # rough identities other processes found
    failures: dict[tuple, TrialRecord] = field(default_factory=dict)  # rough identity -> record
    elsewhere: set[tuple] = field(default_factory=set)
    failure_types: dict[tuple, type] = field(default_factory=dict)

    def failure_type(self, rough: tuple) -> type:
        """One exception type per rough identity: how Hypothesis tells failures apart."""
        if rough not in self.failure_types:
            self.failure_types[rough] = type(f"LoadOrderFailure{len(self.failure_types)}",
                                             (LoadOrderFailure,), {})
        return self.failure_types[rough]

    def known(self, record: TrialRecord) -> bool:
        self.elsewhere.update(self.found_elsewhere())
        rough = Identity.of(record).rough(record)
        return rough in self.failures or rough in self.elsewhere

    def round(self, seed_: int, first: Sequence[Step], max_len: int,
              until: float) -> list[TrialRecord]:
        """One Hypothesis run of ROUND_EXAMPLES examples, seeded; the new failures it shrank.
        Past `until` (the budget's end) no new sequence runs: the round winds down at once
        (a sequence already run answers from memory, so a failure stays a failure)."""
        # Hypothesis keeps files of its own (a cache of constants) in .hypothesis/ of the
        # working folder unless told otherwise: loadfuzz's cache folder, not the user's.
        set_hypothesis_home_dir(hostenv.cache_folder() / "hypothesis")

        @seed(seed_)
        @settings(max_examples=ROUND_EXAMPLES, deadline=None, database=None,
                  phases=(Phase.generate, Phase.target),  # shrinking: once, by the campaign
                  report_multiple_bugs=True, suppress_health_check=list(HealthCheck),
                  print_blob=False)
        @given(sequences(self.options, first, max_len))
        def explore(seq: Steps) -> None:
            if time.monotonic() >= until and not self.run.knows(seq):
                return
            danger = predict.replay(self.inv, seq)
            target(0.0 if danger.clean else 1.0, label="predicted to fail")
            record = self.run(seq)
            if not record.clean and not self.known(record):
                identity = Identity.of(record)
                raise self.failure_type(identity.rough(record))(record)

        failures: list[BaseException] = []
        try:
            explore()
        except LoadOrderFailure as failure:
            failures = [failure]
        except BaseExceptionGroup as group:
            _, rest = group.split(LoadOrderFailure)
            if rest is not None:
                raise rest from None
            failures = leaves(group)
        new = [f.record for f in failures if isinstance(f, LoadOrderFailure)]
        for record in new:
            self.failures.setdefault(Identity.of(record).rough(record), record)
        return new


class LoadOrderFailure(Exception):
    def __init__(self, record: TrialRecord):
        super().__init__(f"{record.outcome.value} {record.signature or ''} {record.op or ''}")
        self.record = record


def leaves(group: BaseExceptionGroup) -> list[BaseException]:
    found: list[BaseException] = []
    for item in group.exceptions:
        found += leaves(item) if isinstance(item, BaseExceptionGroup) else [item]
    return found
