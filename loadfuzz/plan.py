"""Plan: which sequences a campaign runs, and which slice of them this job takes.

Everything here is deterministic: the same libraries and flags give the same
work list in the same order on every machine, so `--shard K/N` slices are
disjoint and their union is the whole.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadfuzz import hostenv
from loadfuzz.execute import HarnessStep
from loadfuzz.inventory import Library
from loadfuzz.model import Flags, Step, StepKind, UsageError
from loadfuzz.model import Sequence as Steps


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

    def take(self, work: Sequence[Steps]) -> list[Steps]:
        """Every N-th item, starting at the K-th: disjoint slices of even size."""
        return [item for position, item in enumerate(work) if position % self.count == self.index - 1]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


WHOLE = Shard(1, 1)


def dlopen(lib: str, path: Path, flags: Flags) -> Step:
    return Step(StepKind.DLOPEN, lib, flags, path)


def pairs(libraries: Iterable[tuple[str, Path]], flags: Sequence[Flags]) -> list[Steps]:
    """Every ordered pair of distinct libraries, both loaded with the same flags mode.

    Grouped by flags mode, then by first library (a matrix row), then second.
    """
    libs = sorted(libraries)
    return [
        (dlopen(first, first_path, mode), dlopen(second, second_path, mode))
        for mode in flags
        for first, first_path in libs
        for second, second_path in libs
        if first != second
    ]


def parse_budget(text: str) -> float:
    """`90`, `90s`, `10m`, `1h30m` -> seconds."""
    found = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*",
                         text)
    if not text.strip() or not found or not any(found.groups()):
        raise UsageError(f"bad --budget {text!r}: expected a duration such as 60s, 10m or 1h")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in found.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise UsageError(f"bad --budget {text!r}: it must be more than zero")
    return total


# The C library and the loader: already in every harness process.
ALWAYS_LOADED = ("libc.so", "libdl.so", "libpthread.so", "librt.so", "libm.so", "ld-linux")


def preload_for(libraries: Sequence[Library]) -> tuple[HarnessStep, ...]:
    """What a fork server loads once for these libraries: never one of them.

    libpython RTLD_GLOBAL when any of them needs Python symbols (as every
    trial of such a library gets it), then every dependency outside the
    target (torch's libraries, the C++ runtime) RTLD_LOCAL, so that the global
    scope a trial sees is the one a cold process would have.
    """
    steps: list[HarnessStep] = []
    if any(lib.needs_python for lib in libraries) and (python := hostenv.libpython_path()):
        steps.append(HarnessStep("g", python))
    own = {lib.path.resolve() for lib in libraries}
    seen = {step.path for step in steps}
    for lib in libraries:
        for dep in lib.external:
            if dep in seen or dep.resolve() in own or dep.name.startswith(ALWAYS_LOADED):
                continue
            seen.add(dep)
            steps.append(HarnessStep("l", dep))
    return tuple(steps)


def reaches_torch(lib: Library) -> bool:
    return any(dep.name.startswith(("libtorch", "libc10")) for dep in lib.external)


def trial_hooks(libraries: Sequence[Library], selected: Sequence[Library] | None = None,
                ) -> tuple[Callable[[Steps], bool], Callable[[Steps], tuple[HarnessStep, ...]]]:
    """What `Trials` asks about a sequence of these libraries (steps by id): whether it needs
    libpython loaded first, and what its fork server preloads (tiers from `selected`)."""
    by_id = {lib.id: lib for lib in libraries}
    choose = preload_chooser(libraries if selected is None else selected)

    def needs_python(seq: Steps) -> bool:
        return any(by_id[step.lib].needs_python for step in seq)

    def preload(seq: Steps) -> tuple[HarnessStep, ...]:
        return choose([by_id[step.lib] for step in seq])

    return needs_python, preload


def preload_chooser(libraries: Sequence[Library]) -> Callable[[Sequence[Library]], tuple[HarnessStep, ...]]:
    """Three tiers of fork server, and which one a trial forks from.

    A process that has libtorch mapped costs several milliseconds to fork and
    to tear down; most trials never reach it. So a trial forks from the
    lightest server that holds what its libraries need: *light* (only their
    C++ runtime) when none needs Python or torch, *python* (libpython too) when
    none reaches torch, else *heavy* (`preload_for` of all the libraries).
    Every tier only ever holds what is not under test.
    """
    def tier(lib: Library) -> int:
        return 2 if reaches_torch(lib) else 1 if lib.needs_python else 0

    preloads = [preload_for([lib for lib in libraries if tier(lib) <= level]) for level in range(3)]
    tiers = {lib.id: tier(lib) for lib in libraries}

    def choose(trial_libraries: Sequence[Library]) -> tuple[HarnessStep, ...]:
        return preloads[max((tiers.get(lib.id, 2) for lib in trial_libraries), default=0)]

    return choose
