"""Tiers: what a trial's process must hold before its first step, and which fork server has it.

Two questions about any sequence of a campaign's libraries, answered from
the inventory: does it need libpython loaded first (RTLD_GLOBAL, as a Python
process has it), and what should the fork server it forks from have
preloaded. A process with libtorch mapped costs several milliseconds to fork
and to tear down and most trials never reach it, so there are three tiers
of server: *light* (only the C++ runtime the libraries need), *python*
(libpython too) and *heavy* (the libtorch closure too). A trial forks from
the lightest tier that holds what its libraries need. No tier ever holds a
library under test.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadfuzz import hostenv, inventory
from loadfuzz.inventory import Library
from loadfuzz.model import Sequence as Steps
from loadfuzz.model import Step, StepKind
from loadfuzz.run.harness import HarnessStep

LIGHT, PYTHON, HEAVY = 0, 1, 2
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


def tier_of(lib: Library) -> int:
    return HEAVY if lib.reaches_torch else PYTHON if lib.needs_python else LIGHT


@dataclass(frozen=True)
class Tiers:
    """The answers for one campaign's libraries, looked up by a step's path."""

    python: frozenset[Path]  # libraries that need libpython loaded first
    tiers: Mapping[Path, int]
    preloads: tuple[tuple[HarnessStep, ...], ...]  # per tier, LIGHT to HEAVY

    @classmethod
    def of(cls, libraries: Iterable[Library], servers_for: Iterable[Library] | None = None) -> Tiers:
        """`servers_for`: the libraries the servers are built for (default: all); a library
        outside them forks from the heavy tier."""
        libraries = tuple(libraries)
        chosen = libraries if servers_for is None else tuple(servers_for)
        preloads = tuple(preload_for([lib for lib in chosen if tier_of(lib) <= level])
                         for level in (LIGHT, PYTHON, HEAVY))
        return cls(frozenset(lib.path for lib in libraries if lib.needs_python),
                   {lib.path: tier_of(lib) for lib in chosen}, preloads)

    @classmethod
    def for_steps(cls, seq: Steps) -> Tiers:
        """The tiers of the libraries a sequence names by path (a `run` of loose files)."""
        files = [step.path for step in seq if step.kind is not StepKind.MODULE]
        if not files:
            return NO_TIERS
        return cls.of(inventory.load_libraries(list(dict.fromkeys(files))).libraries)

    def needs_python(self, seq: Steps) -> bool:
        return any(step.path in self.python for step in seq)

    def reaches_torch(self, step: Step) -> bool:
        """Whether loading the step's library maps PyTorch's (unknown libraries are assumed to)."""
        return self.tiers.get(step.path, HEAVY) == HEAVY

    def preload(self, seq: Steps) -> tuple[HarnessStep, ...]:
        """What the server a trial forks from has preloaded: the lightest tier that will do."""
        return self.preloads[max((self.tiers.get(step.path, HEAVY) for step in seq
                                  if step.kind is not StepKind.MODULE), default=LIGHT)]


NO_TIERS = Tiers(frozenset(), {}, ((), (), ()))
