"""Tiers: what a trial's process must hold before its first step, and which fork server has it.

Two questions about any sequence of a campaign's libraries, answered from
the inventory: does it need libpython loaded first (RTLD_GLOBAL, as a Python
process has it), and what should the fork server it forks from have
preloaded. A process with libtorch mapped costs several milliseconds to fork
and to tear down and most trials never reach it, so there are three tiers
of server: *light* (only the C++ runtime the libraries need), *python*
(libpython too) and *heavy* (the libtorch closure too). A trial forks from
the lightest tier that holds what its libraries need. No tier ever holds a
library under test, nor a dependency that leads back to one; a trial whose
cold run would bind or find a preloaded object otherwise forks from less
(`rebinding`).

On top of the tiers, a *route* may put a heavy library (one under test, or
a dependency of theirs that their trial's server may not hold) in front of a
step, when `standins` proves that loading it first (RTLD_LOCAL) leaves the
process exactly as the step alone would: the same objects, constructors in
the same order, every symbol of the stand-in bound to the same definers,
the same global scope. In front of the first step it joins the fork
server's preload (a server per stand-in: e.g. libtorch_cpu.so for every row
whose first library is libtorch.so, libshm.so or libtorch_cpu.so); in front
of the second it is a hidden step of the row server, taken after the row's
first step (e.g. libtorch_cpu.so after libc10.so, for the trials whose
second library is libtorch.so). Where the rule does not hold, the trial
loads the library itself, in its step: for a library whose own definition
(not a copy of a C++ template instance or type_info object) of a name
libtorch_cpu.so looks up comes first in the cold run's scope. Never for a
Python step (`y`), nor after one, nor when libpython would come after the
stand-in. What a stand-in printed while preloaded opens the trial's output
(as in the cold run, where it printed first in the step); a stand-in that
fails, ends its process or leaves it unforkable (a thread, a child, a
timer) makes its server fail to start, or its row be refused, and the
trials go the usual way.

A sequence that does not need libpython may still be run with it first
(`python_inert`: no object its loads can map defines or references a name
libpython defines), so that it shares a row with those that do need it
(see `trials.Trials.batches`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loadfuzz import hostenv
from loadfuzz.elf.cache import ElfCache
from loadfuzz.elf.loader import LinkMap, SearchPath, link_all
from loadfuzz.elf.read import BadElf, ElfFacts, ElfReader
from loadfuzz.inventory import Library
from loadfuzz.model import Flags, Step, StepKind
from loadfuzz.model import Sequence as Steps
from loadfuzz.run.harness import HarnessStep
from loadfuzz.run.rebinding import Rebinding, cold_steps
from loadfuzz.run.standins import C_LIBRARY, HEAVY_BYTES, STARTS_LOADED, StandIns

LIGHT, PYTHON, HEAVY = 0, 1, 2
ALWAYS_LOADED = C_LIBRARY  # the C library and the loader: already in every harness process


def preload_for(libraries: Sequence[Library], link_map: LinkMap | None = None,
                ) -> tuple[HarnessStep, ...]:
    """What a fork server loads once for these libraries: never one of them.

    libpython RTLD_GLOBAL when any of them needs Python symbols (as every
    trial of such a library gets it), then every dependency outside the
    target (torch's libraries, the C++ runtime) RTLD_LOCAL, so that the global
    scope a trial sees is the one a cold process would have. With the link map,
    not a dependency whose own dependencies lead back to one of the libraries
    (it would bring a library under test into the server, constructor and all).
    """
    steps: list[HarnessStep] = []
    if any(lib.needs_python for lib in libraries) and (python := hostenv.libpython_path()):
        steps.append(HarnessStep("g", python))
    own = {lib.path.resolve() for lib in libraries}
    seen = {step.path for step in steps}
    for lib in libraries:
        for dep in lib.external:
            if dep in seen or dep.name.startswith(ALWAYS_LOADED) or dep.resolve() in own \
                    or leads_back(dep, own, link_map):
                continue
            seen.add(dep)
            steps.append(HarnessStep("l", dep))
    return tuple(steps)


def leads_back(dep: Path, own: set[Path], link_map: LinkMap | None) -> bool:
    """Whether loading `dep` would map one of `own` (its closure, by the link map)."""
    facts = link_map.files.get(dep) if link_map is not None else None
    return facts is not None and any(obj.path.resolve() in own
                                     for obj in link_map.search_list(facts)[0][1:])


def tier_of(lib: Library) -> int:
    return HEAVY if lib.reaches_torch else PYTHON if lib.needs_python else LIGHT


@dataclass(frozen=True)
class Route:
    """Where a trial forks from, and what is taken before its own steps."""

    preload: tuple[HarnessStep, ...]  # its fork server's (the tier's, and maybe a stand-in)
    prefix: tuple[HarnessStep, ...]  # what a row server takes for it: libpython, its first step
    hidden: tuple[HarnessStep, ...] = ()  # a stand-in the row server loads after the prefix
    tier: tuple[HarnessStep, ...] = ()  # the tier's preload alone: the way back
    costly: bool = False  # the row server's steps map a heavy library: a row of 2 pays off


@dataclass(frozen=True)
class Tiers:
    """The answers for one campaign's libraries, looked up by a step's path."""

    python: frozenset[Path]  # libraries that need libpython loaded first
    tiers: Mapping[Path, int]
    preloads: tuple[tuple[HarnessStep, ...], ...]  # per tier, LIGHT to HEAVY
    standins: StandIns | None = None
    rebinding: Rebinding | None = None  # with `standins`: may a trial fork from a tier's server
    # what a trial that wants libpython gets first (looked up once: a trial asks several times)
    libpython: Path | None = field(default_factory=hostenv.libpython_path)

    @classmethod
    def of(cls, libraries: Iterable[Library], servers_for: Iterable[Library] | None = None,
           link_map: LinkMap | None = None) -> Tiers:
        """`servers_for`: the libraries the servers are built for (default: all); a library
        outside them forks from the heavy tier. With the inventory's `link_map`, those
        libraries and their dependencies may stand in front of steps (see `route`)."""
        libraries = tuple(libraries)
        chosen = libraries if servers_for is None else tuple(servers_for)
        preloads = tuple(preload_for([lib for lib in chosen if tier_of(lib) <= level], link_map)
                         for level in (LIGHT, PYTHON, HEAVY))
        # a stand-in is a library under test or one they depend on (libtorch_cpu.so after an
        # ExecuTorch library whose trials cannot fork from the heavy tier)
        candidates = [*(lib.path for lib in chosen), *(dep for lib in chosen for dep in lib.external)]
        standins = StandIns(link_map, candidates, python_brings) if link_map else None
        return cls(frozenset(lib.path for lib in libraries if lib.needs_python),
                   {lib.path: tier_of(lib) for lib in chosen}, preloads, standins,
                   Rebinding(standins) if standins else None)

    def needs_python(self, seq: Steps) -> bool:
        return any(step.path in self.python for step in seq)

    def reaches_torch(self, step: Step) -> bool:
        """Whether loading the step's library maps PyTorch's (unknown libraries are assumed to)."""
        return self.tiers.get(step.path, HEAVY) == HEAVY

    def python_inert(self, seq: Steps) -> bool:
        """Whether libpython, loaded RTLD_GLOBAL before this sequence that does not need it,
        would change nothing it does: every step is a library the model knows, loaded with
        dlopen, and no object those loads can map defines or references, even weakly, a
        name libpython could define (so no relocation of theirs can bind to libpython, nor
        libpython's to them; see `StandIns.avoids_python`)."""
        model = self.standins
        return model is not None and not self.needs_python(seq) and all(
            step.kind is StepKind.DLOPEN and step.flags is not Flags.PYTHON
            and model.avoids_python(step.path) for step in seq)

    def preload(self, seq: Steps, python: bool = False) -> tuple[HarnessStep, ...]:
        """What the server a trial forks from has preloaded: the lightest tier that will do
        (`python`: one that has libpython, for a sequence run with libpython first); nothing
        when its cold run would bind a preloaded object otherwise than the server did
        (`Rebinding.rebinds`)."""
        level = max((self.tiers.get(step.path, HEAVY) for step in seq
                     if step.kind is not StepKind.MODULE), default=LIGHT)
        tier = self.preloads[max(level, PYTHON) if python else level]
        steps = cold_steps(seq)
        if tier and self.rebinding is not None and self.rebinding.rebinds(tier, steps):
            # a library of the trial takes over a preloaded one's binding: the rest of the
            # preload (libpython, the C++ runtime), if that rebinds nothing, else nothing
            rest = self.rebinding.without_contested(tier)
            return rest if not self.rebinding.rebinds(rest, steps) else ()
        return tier


    def route(self, seq: Steps, steps: Sequence[HarnessStep], prelude: int,
              python: bool = False) -> Route:
        """The route of a trial whose harness steps are `steps` (the first `prelude` of them
        prerequisites; `python`: libpython is one, though the sequence does not need it): its
        tier's server, and the stand-ins the rule allows."""
        tier = self.preload(seq, python)
        prefix = tuple(steps[:prelude + 1])
        model = self.standins
        if model is None or len(steps) <= prelude or not set(steps[:prelude]) <= set(tier):
            return Route(tier, prefix, (), tier)
        first = steps[prelude]
        state = model.start(tier)
        preload, lead = tier, model.choose(state, first)
        if lead is not None:
            preload = (*tier, HarnessStep("l", lead))
            state = model.after(state, preload[-1])
        costly = lead is None and model.weighs(state, first) >= HEAVY_BYTES
        hidden: tuple[HarnessStep, ...] = ()
        if len(steps) > prelude + 1 and first.mode != "y":
            state = model.after(state, first)
            if (follow := model.choose(state, steps[prelude + 1])) is not None:
                hidden, costly = (HarnessStep("l", follow),), True
        return Route(preload, prefix, hidden, tier, costly)


def python_brings() -> list[ElfFacts]:
    """What loading libpython maps besides itself and what every harness process has (the C
    library and the loader): its libm. Read through the ELF cache."""
    libpython = hostenv.libpython_path()
    if libpython is None:
        return []
    reader = ElfReader(ElfCache.default())
    try:
        facts = reader.facts(libpython)
        order = link_all([facts], reader, SearchPath.for_trials()).search_list(facts)[0]
    except BadElf:
        return []
    return [obj for obj in order[1:] if not obj.path.name.startswith(STARTS_LOADED)]


NO_TIERS = Tiers(frozenset(), {}, ((), (), ()))
