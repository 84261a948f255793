"""Plan: which sequences a campaign runs, and which slice of them this job takes.

Everything here is deterministic: the same libraries and flags give the same
work list in the same order on every machine, so `--shard K/N` slices are
disjoint and their union is the whole. Every stage that builds steps from
libraries (matrix, prediction, fuzz, repro) builds them here.
"""

from __future__ import annotations

import collections
import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from loadfuzz.model import Flags, Role, Step, StepKind, UsageError
from loadfuzz.model import Sequence as Steps

T = TypeVar("T")


class Loadable(Protocol):
    """What a step needs of a library: its id, where it is and its role (an inventory `Library`)."""

    @property
    def id(self) -> str: ...

    @property
    def path(self) -> Path: ...

    @property
    def role(self) -> Role: ...


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based, as the user writes it
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        found = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not found or not 1 <= int(found[1]) <= int(found[2]):
            raise UsageError(f"bad --shard {text!r}: expected K/N with 1 <= K <= N, e.g. 2/3")
        return cls(int(found[1]), int(found[2]))

    def take(self, work: Iterable[T]) -> list[T]:
        """Every N-th item, starting at the K-th: disjoint slices of even size. `work` may be
        an iterator: only this slice's items are kept."""
        return list(itertools.islice(work, self.index - 1, None, self.count))

    def block(self, work: Iterable[T], total: int) -> list[T]:
        """The K-th of N runs of consecutive items of `work` (`total` of them): disjoint,
        of even size (one more or less), so that what goes together stays together. `work`
        may be an iterator: only this run's items are kept."""
        start, stop = ((k - 1) * total // self.count for k in (self.index, self.index + 1))
        return list(itertools.islice(work, start, stop))

    @property
    def whole(self) -> bool:
        return self.count == 1

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


WHOLE = Shard(1, 1)


def dlopen(lib: Loadable, flags: Flags) -> Step:
    return Step(StepKind.DLOPEN, lib.id, flags, lib.path)


def load(lib: Loadable, flags: Flags) -> Step:
    """Load a library with a flags mode; under `python`, an extension module is imported."""
    if flags is Flags.PYTHON and lib.role is Role.PYTHON_EXTENSION:
        return Step(StepKind.IMPORT, lib.id, flags, lib.path)
    return dlopen(lib, flags)


def pairs(libraries: Iterable[Loadable], flags: Sequence[Flags], shard: Shard = WHOLE,
          ) -> list[Steps]:
    """Every ordered pair of distinct libraries, both loaded with the same flags mode (only
    `shard`'s slice of them: the steps of the other slices are never made).

    Grouped by flags mode, then by first library (a matrix row), then second. A
    shard's slice is a run of consecutive pairs, so its rows stay whole (but for
    the first and the last) and share their first step (see `run.trials`).
    """
    libs = sorted(libraries, key=lambda lib: (lib.id, str(lib.path)))
    return [(load(first, mode), load(second, mode))
            for mode, first, second in shard.block(ordered_pairs(libs, flags),
                                                   pair_count(libs, flags))]


def ordered_pairs(libraries: Iterable[Loadable], flags: Sequence[Flags],
                  ) -> Iterator[tuple[Flags, Loadable, Loadable]]:
    """(flags mode, first, second) of every pair, in the matrix's order."""
    libs = sorted(libraries, key=lambda lib: (lib.id, str(lib.path)))
    return ((mode, first, second)
            for mode in flags for first in libs for second in libs if first.id != second.id)


def pair_count(libraries: Sequence[Loadable], flags: Sequence[Flags]) -> int:
    """How many trials `pairs` makes of the whole matrix."""
    same_id = collections.Counter(lib.id for lib in libraries)
    return len(flags) * sum(len(libraries) - same_id[lib.id] for lib in libraries)


def step_options(libs: Sequence[Loadable], flags: Sequence[Flags]) -> list[Step]:
    """Every way to load one library, simplest first: earlier library, `local`, `global`,
    `python` (as Python code loads it), and `py:` (an import) for a Python extension."""
    order = [mode for mode in (Flags.LOCAL, Flags.GLOBAL, Flags.PYTHON) if mode in flags]
    options = []
    for lib in libs:
        options += [load(lib, mode) for mode in order if not (
            mode is Flags.PYTHON and lib.role is Role.PYTHON_EXTENSION)]
        if lib.role is Role.PYTHON_EXTENSION:
            options.append(Step(StepKind.IMPORT, lib.id, Flags.LOCAL, lib.path))
    return options
