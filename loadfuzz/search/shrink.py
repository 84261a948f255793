"""Shrink: make a failing load order minimal while it keeps failing the same way.

`simplify` is a greedy pass to a fixpoint that keeps (outcome, signature,
operator): it drops steps, and loads each remaining library the simplest way
that still fails (`local`, then `global`, then a `py:` import); it never
swaps one library for another. `simplicity` orders finished sequences (fewer
steps, then earlier options: earlier libraries, `local`), to choose among
minimal records of one failure. A failure's `Identity` is what makes two
failures the same one once shrunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loadfuzz.model import Sequence as Steps
from loadfuzz.model import Step, TrialRecord


def simplicity(seq: Steps, options: Sequence[Step]) -> tuple:
    """Shortlex order: fewer steps first, then earlier options (earlier library, local)."""
    return (len(seq), [rank(step, options) for step in seq])


def rank(step: Step, options: Sequence[Step]) -> int:
    """Where a step comes among the options (after all of them, when it is none)."""
    return options.index(step) if step in options else len(options)


@dataclass(frozen=True)
class Identity:
    """What makes two failures the same failure."""

    outcome: str
    signature: str | None
    op: str | None
    libraries: frozenset[str]

    @classmethod
    def of(cls, record: TrialRecord) -> Identity:
        ended = record.sequence if record.step is None else record.sequence[:record.step + 1]
        libs = frozenset(s.lib for s in ended)  # every step when it failed after the last
        return cls(record.outcome.value, record.signature, record.op, libs)

    def rough(self, record: TrialRecord) -> tuple:
        """Before shrinking, the set is not known yet: the failing step's library stands in."""
        return (self.outcome, self.signature, self.op, record.sequence[record.step or 0].lib)


def simplify(record: TrialRecord, run: Callable[[Steps], TrialRecord | None],
             options: Sequence[Step],
             keeps: Callable[[TrialRecord], bool] = lambda _: True) -> TrialRecord:
    """Greedy shrink to a fixpoint, keeping (outcome, signature, op), and what `keeps` asks
    (repro: the message): cut the steps after the failing one, drop steps, load a library an
    earlier way (`local` before `global`), swap two steps to put the earlier option first
    (so a failure both orders of a pair have ends as the same record, whichever order was
    found first). A candidate `run` does not try (None: no time left) is passed over."""

    def same(candidate: TrialRecord | None) -> bool:
        return candidate is not None and (candidate.outcome, candidate.signature,
                                          candidate.op) == (record.outcome, record.signature,
                                                            record.op) and keeps(candidate)

    best = record
    if best.step is not None and best.step + 1 < len(best.sequence):
        cut = run(best.sequence[:best.step + 1])
        best = cut if cut is not None and same(cut) else best
    improved = True
    while improved:
        improved = False
        seq = best.sequence
        candidates = [seq[:i] + seq[i + 1:] for i in range(len(seq)) if len(seq) > 1]
        for i, current in enumerate(seq):
            simpler = [o for o in options[:options.index(current)]
                       if o.lib == current.lib] if current in options else []
            candidates += [(*seq[:i], o, *seq[i + 1:]) for o in simpler]
        candidates += [(*seq[:i], seq[i + 1], seq[i], *seq[i + 2:]) for i in range(len(seq) - 1)
                       if rank(seq[i + 1], options) < rank(seq[i], options)]
        for candidate in candidates:
            tried = run(candidate)
            if tried is not None and same(tried):
                best, improved = tried, True
                break
    return best
