"""Rebinding: whether a fork server's preloaded objects are bound as a trial's cold run binds them.

A tier's fork server loads what the campaign's libraries depend on but do
not test (torch's libraries, the C++ runtime) once, RTLD_LOCAL, and its
trials fork from it: those objects were relocated in the server, against
the server's scope. A cold run maps the same object during one of the
trial's steps and relocates it then, against that step's scope: the global
scope (with what earlier RTLD_GLOBAL steps put there), then the step's
search list. A definition that comes first there takes the binding: a
library that exports operator new, a bundled copy of cpuinfo or of a BLAS,
a hook that a dependency calls through its PLT. A trial in which that
happens must not fork from that server.

The names that count are those a preloaded object's relocations name (its
imports, and its own exported definitions that it reaches through its PLT
or GOT: `ElfFacts.own_lookups`) and that another object the campaign can
map defines as its own: strongly, or weakly under a C name. Two kinds of
duplicate are taken to be the same code, by C++'s one-definition rule, and
left out: weak definitions of C++ names (inline functions and template
instances, which every C++ library repeats), and the
C++ runtime's own names (`std::`, `__gnu_cxx::`, their type_info and
vtables, `__cxa_*`, `_Unwind_*`), which a library that links libstdc++
statically exports as copies of the runtime (`standins.a_copy`; a strong
`__cxa_throw` in a library without a runtime of its own, no
`__gxx_personality_v0`, is a hook and counts). The replaceable allocation
functions (operator new and delete) are not the runtime's in that sense: a
library defines them so that they are used instead. And a weak reference
the server left null counts whatever answers it in the cold run, a copy
too: a copy of one thing is no copy of nothing. A step that maps, cold, a
preloaded object together with objects that define an IFUNC or reference
one of its IFUNCs rebinds too: their resolvers would run after its
constructors, not before (`standins.resolved_after`).

Where a step loads Python code (an import, `torch.ops.load_library`), the
objects that code maps are not known beforehand: each preloaded object not
yet mapped is checked against the global scope at that step. A step whose
library a preloaded object would stand for by its SONAME, where the cold
run finds another file or none, rebinds too (`maps_otherwise`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from loadfuzz.elf.read import ElfFacts
from loadfuzz.model import Flags, StepKind
from loadfuzz.model import Sequence as Steps
from loadfuzz.run.harness import HarnessStep
from loadfuzz.run.standins import (
    RESERVED,
    Key,
    StandIns,
    State,
    a_copy,
    first_definers,
    meant,
    resolved_after,
)

# A step as the cold run takes it: g (dlopen RTLD_GLOBAL), l (RTLD_LOCAL) or p (Python code,
# which may map more than the library, if any, that it loads RTLD_LOCAL); the library's path.
ColdStep = tuple[str, Path | None]
# Per preloaded object: the names it looks up that are contested, each with its server definer
# (None: none in the server's scope, so a weak reference left null).
Contested = dict[Key, dict[str, Key | None]]


class Rebinding:
    """The answers for one campaign's link map (the `StandIns` model); safe from several threads."""

    def __init__(self, model: StandIns):
        self.model = model
        self._contested: dict[tuple[HarnessStep, ...], Contested] = {}
        self._answers: dict[tuple, bool] = {}
        self._lock = threading.Lock()

    def rebinds(self, preload: Sequence[HarnessStep], steps: Sequence[ColdStep]) -> bool:
        """Whether a cold run of `steps` would bind a name an object of `preload` looks up to
        another definition than the server bound it to (True for a library the model lacks)."""
        preload = tuple(preload)
        key = (preload, tuple(steps))
        with self._lock:
            known = self._answers.get(key)
        if known is None:
            known = self._rebinds(preload, steps)
            with self._lock:
                self._answers[key] = known
        return known

    def _rebinds(self, preload: tuple[HarnessStep, ...], steps: Sequence[ColdStep]) -> bool:
        contested = self.contested(preload)
        model = self.model
        state = model.start([step for step in preload if step.mode == "g"])
        warm = model.start(preload)
        pending = set(contested)  # preloaded objects the cold run has not mapped yet
        preloaded = set(warm.loaded) - set(state.loaded)
        for mode, path in steps:
            if mode == "p" and any(self.differs(contested[obj], state.global_scope)
                                   for obj in pending):
                return True
            facts = model.by_path.get(path) if path is not None else None
            if facts is None:
                if mode != "p":
                    return True
                continue
            if self.maps_otherwise(state, warm, facts):
                return True
            load = model.open(state, facts, mode == "g")
            early = preloaded.intersection(load.new)  # cold, relocated with the step's own
            if early and resolved_after([model.facts[k] for k in early],
                                        [model.facts[k] for k in load.new if k not in early]):
                return True
            scope = model.lookup_scope(state, facts)
            mapped = pending.intersection(load.new)
            if any(self.differs(contested[obj], scope, everywhere=True) for obj in mapped):
                return True
            pending -= mapped
            state, warm = load.after, model.open(warm, facts, mode == "g").after
        return False

    def maps_otherwise(self, cold: State, warm: State, root: ElfFacts) -> bool:
        """Whether dlopen(root) would bring other objects in the server than in the cold run:
        a preloaded object answers a NEEDED name by its SONAME (ld.so shares a loaded library
        by name), which the cold run resolves to another file, or to none at all (a library
        that loads only after a sibling brought the dependency it cannot find)."""
        model = self.model
        return ({obj.identity for obj in model.search_list(cold, root)}
                != {obj.identity for obj in model.search_list(warm, root)})

    def without_contested(self, preload: Sequence[HarnessStep]) -> tuple[HarnessStep, ...]:
        """The preload's steps that map none of its objects with contested names (nor anything
        their loads need): what a trial that `rebinds` may still fork from."""
        preload = tuple(preload)
        contested = set(self.contested(preload))
        model = self.model
        kept = []
        for step in preload:
            facts = model.by_path.get(step.path)
            if facts is None or contested.isdisjoint(
                    o.identity for o in model.map.search_list(facts)[0]):
                kept.append(step)
        return tuple(kept)

    def differs(self, names: dict[str, Key | None], scope: Sequence[Key],
                everywhere: bool = False) -> bool:
        """Whether a name's first definer in `scope` is not its server definer: one found
        elsewhere (`everywhere`: `scope` is all the object's relocations see, so a name
        defined nowhere in it differs too)."""
        firsts = first_definers(scope, names, self.model.facts)
        for name, server in names.items():
            first = firsts.get(name)
            if first != server and (everywhere or first is not None):
                return True
        return False

    def contested(self, preload: tuple[HarnessStep, ...]) -> Contested:
        """Per object the preload maps RTLD_LOCAL: the names it looks up (reserved names and
        copies of one thing, `standins.a_copy`, aside) that an object of the link map other than the
        one the server bound it to defines as its own (`meant`), with that server definer;
        never a name the C library answers (first in every scope)."""
        with self._lock:
            found = self._contested.get(preload)
        if found is not None:
            return found
        model, found = self.model, {}
        everything = [(facts.identity, meant(facts)) for facts in model.facts.values()]
        state = model.start([step for step in preload if step.mode == "g"])
        for step in preload:
            facts = model.by_path.get(step.path)
            if facts is None:
                continue
            load = model.open(state, facts, step.mode == "g")
            if step.mode == "l":
                scope = model.lookup_scope(state, facts)
                for key in load.new:
                    names = self.contested_names(model.facts[key], scope, everything)
                    if names:
                        found[key] = names
            state = load.after
        with self._lock:
            self._contested[preload] = found
        return found

    def contested_names(self, obj: ElfFacts, scope: list[Key],
                        everything: list[tuple[Key, frozenset[str]]]) -> dict[str, Key | None]:
        """`contested` for one object; `everything`: each object's own definitions (`meant`)."""
        lookups = obj.undefined | obj.weak | obj.own_lookups  # (a version tag is never one)
        facts = self.model.facts
        definers: dict[str, set[Key]] = {}  # the objects that define each name as their own
        for other, own in everything:
            for name in lookups & own:
                if name not in RESERVED and not a_copy(facts[other], name):
                    definers.setdefault(name, set()).add(other)
        servers = first_definers(scope, definers, facts)
        names: dict[str, Key | None] = {}
        for name, others in definers.items():
            server = servers.get(name)
            if others - {server} and server not in self.model.first:
                names[name] = server  # (the C library's answer comes first in every scope)
        # a weak reference the server left null: any definition, a copy too, would answer it
        weak = obj.weak - names.keys() - RESERVED
        for name in weak - first_definers(scope, weak, facts).keys():
            if any(name in facts[other].defines for other, _ in everything if other != obj.identity):
                names[name] = None
        return names


def cold_steps(seq: Steps) -> tuple[ColdStep, ...]:
    """A sequence's steps as `Rebinding.rebinds` takes them."""
    steps = []
    for step in seq:
        if step.kind is StepKind.MODULE:
            steps.append(("p", None))
        elif step.kind is StepKind.IMPORT or step.flags is Flags.PYTHON:
            steps.append(("p", step.path))
        else:
            steps.append(("g" if step.flags is Flags.GLOBAL else "l", step.path))
    return tuple(steps)
