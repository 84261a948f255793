"""Stand-ins: which library may be loaded ahead of a step without the step noticing.

A trial that reaches libtorch_cpu.so spends ~200 ms in that one dlopen. When
a step would load a heavy library L anyway (L is in its dependency closure),
a fork server (or a row server, after the row's first step) can load L once,
RTLD_LOCAL, *in front of* the step, and the trials fork from there. This
module decides, from the link map alone, when that leaves the process
exactly as the step would have left it. It replays glibc's `dlopen` on the
model of the link map (search lists, the constructor sort, the lookup scope
of every relocation) and accepts L in front of step S in a state P only when:

1. **same objects**: every object L's load adds in P is one S's load adds in P;
2. **same constructors, same order**: S's cold constructor order (glibc's
   depth-first sort of S's search list, `_dl_sort_maps_dfs`) begins with
   exactly L's constructor order, and what runs after is the rest of it
   (the C library's own objects, libc, libdl, libpthread, librt, libm,
   ld.so, are left out of the comparison: their constructors observe
   nothing of the others');
3. **same bindings**: every symbol name the objects of L define or
   reference, weakly too (a weak reference binds wherever a definition is in
   scope, and stays null where none is), but `_edata`, `_end`, `__bss_start`,
   `_init`, `_fini` and version tags such as `GLIBC_2.2.5`, which no
   relocation names, has the same first definer (the one ld.so binds to) in
   the scope its relocations are looked up in: global scope + L's search
   list when preloaded, global scope + S's search list in the cold run; or,
   in the cold run, another copy of one thing, which the tiers take to be
   the same as well (C++'s one-definition rule, `rebinding`): a weak
   definition of a C++ name (an inline function, a template instance), the
   C++ runtime's names and type_info objects (`ODR_COPIES`, `a_copy`). A
   plugin that repeats libtorch_cpu's template instances makes libtorch_cpu
   bind to the plugin's copies in the cold run and to its own when
   preloaded: the same code. A copy that would answer a reference nothing
   answers in the preloaded scope does not count as one;
4. **same IFUNC resolutions**: no object S maps besides L's defines an IFUNC
   or references one of L's objects' (`resolved_after`): cold, ld.so
   resolves them before L's constructors ran, ahead after.

The global scope is then the same either way: `dlopen(S, RTLD_GLOBAL)` adds
S's whole search list in its breadth-first order, already loaded objects
included; RTLD_LOCAL adds nothing. A later step sees the same objects in the
same global scope. Not modelled (documented in docs/protocol.md): the order
of the link map itself (`dl_iterate_phdr`, TLS module ids), `dlsym(RTLD_NEXT)`
or `dlsym(RTLD_DEFAULT)` from inside a preloaded object, static TLS placement,
and symbol versions beyond their names (a hidden, non-default version counts
as a definer, where ld.so skips it).
"""

from __future__ import annotations

import collections
import itertools
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadfuzz.elf.loader import LinkMap
from loadfuzz.elf.read import ElfFacts
from loadfuzz.run.harness import HarnessStep

# Names the linker defines in every object and no relocation looks up. (Version tags such as
# GLIBC_2.2.5, one absolute symbol per version an object defines, are never read in:
# `elf.read.version_tags`.)
RESERVED = frozenset({"_edata", "_end", "__bss_start", "_init", "_fini"})
# The C library's own objects: their constructors observe nothing of the others'.
C_LIBRARY = ("libc.so", "libdl.so", "libpthread.so", "librt.so", "libm.so", "ld-linux")
# What every name libpython exports begins with.
PYTHON_NAMES = ("Py", "_Py")
# Below this many bytes of files to map, a load is cheap: no stand-in is worth a server.
HEAVY_BYTES = 32 << 20
# In every harness process before any step: the executable's own dependencies.
STARTS_LOADED = ("libc.so.6", "ld-linux")
# Copies of one thing by definition: the C++ runtime's names (namespaces std and __gnu_cxx, and
# their vtables, guard variables and functions' local statics), the ABI's __cxa_ functions,
# the unwinder's; and any type's type_info object and name (the ABI compares type_info by name).
ODR_COPIES = re.compile(r"_Z(N|NK)?(St|9__gnu_cxx|11__gnu_debug)|_Z(T[VHW]|GV|Z)N?K?(St|9__gnu_cxx)"
                        r"|_ZT[IS]|__cxa_|__gxx_|_Unwind_")
# The ABI's and the unwinder's names, and what a C++ runtime (libstdc++, libsupc++, linked in
# statically or not) always defines: a strong ABI name elsewhere is a hook of the library's own.
ABI_NAMES = ("__cxa_", "__gxx_", "_Unwind_")
PERSONALITY = "__gxx_personality_v0"

Key = tuple[int, int]  # ElfFacts.identity


@dataclass(frozen=True)
class State:
    """What the model says a process holds: loaded objects (in load order) and the global scope."""

    loaded: tuple[Key, ...]
    global_scope: tuple[Key, ...]


@dataclass(frozen=True)
class Load:
    """What one dlopen did in the model."""

    new: tuple[Key, ...]  # objects mapped by it, in search-list order
    inits: tuple[Key, ...]  # constructors it ran, in order
    after: State


class StandIns:
    """The stand-in decisions for one campaign's link map; safe to use from several threads."""

    def __init__(self, link_map: LinkMap, candidates: Iterable[Path],
                 python_brings: Callable[[], Sequence[ElfFacts]] = tuple):
        """`candidates`: the libraries that may stand in (the campaign's and their
        dependencies, by path);
        `python_brings`: what loading libpython maps besides itself and what every harness
        process has (libm), asked the first time `avoids_python` needs it."""
        self.map = link_map
        self._python_brings = python_brings
        # per object libpython brings: the names it would add to the global scope
        self._brought: tuple[tuple[Key, frozenset[str]], ...] | None = None
        self.facts = {facts.identity: facts for facts in link_map.files.values()}
        self.by_path = {path: facts for path, facts in link_map.files.items()}
        wanted = {Path(path) for path in candidates}
        self.candidates = [f for p, f in link_map.files.items() if p in wanted]
        # how many candidates reach each candidate (itself included): each closure worked out once
        reached = collections.Counter(key for c in self.candidates
                                      for key in {o.identity for o in link_map.search_list(c)[0]})
        self.reach = {lib.identity: reached[lib.identity] for lib in self.candidates}
        # those that may lead a step (another candidate reaches them), the most reached first
        self.leads = sorted((c for c in self.candidates if self.reach[c.identity] >= 2),
                            key=lambda c: -self.reach[c.identity])
        self._cache: dict[tuple, Path | None] = {}
        self._opened: dict[tuple[State, Key, bool], Load] = {}  # the model's dlopen, replayed once
        self._started: dict[tuple[HarnessStep, ...], State] = {}
        self._lists: dict[tuple[State, Key], list[ElfFacts]] = {}  # search lists, by state
        self._sizes: dict[Key, int] = {}
        self._deps: dict[Key, list[ElfFacts]] = {}
        self._pythonish: dict[Key, bool] = {}
        self.first = tuple(f.identity for f in self.facts.values()
                           if f.path.name.startswith(STARTS_LOADED))
        self._lock = threading.Lock()

    # -- the model of ld.so ---------------------------------------------------------------
    def start(self, preload: Sequence[HarnessStep]) -> State:
        """A harness process once it has taken these preloads (files outside the link map,
        libpython, count as loaded and, with `g`, global: they precede every search list)."""
        preload = tuple(preload)
        if preload not in self._started:
            state = State(self.first, self.first)
            for step in preload:
                state = self.after(state, step)
            self._started[preload] = state
        return self._started[preload]

    def after(self, state: State, step: HarnessStep) -> State:
        facts = self.by_path.get(step.path)
        if facts is None:  # libpython, or a file the campaign does not reach: opaque
            return state
        return self.open(state, facts, step.mode == "g").after

    def search_list(self, state: State, root: ElfFacts) -> list[ElfFacts]:
        """dlopen(root)'s search list in this state (worked out once per state and root)."""
        found = self._lists.get((state, root.identity))
        if found is None:
            loaded = {}
            for key in state.loaded:
                facts = self.facts[key]
                for name in (facts.soname, facts.path.name):
                    if name:
                        loaded.setdefault(name, facts)
            found = self._lists[(state, root.identity)] = self.map.search_list(root, loaded)[0]
        return found

    def deps(self, obj: ElfFacts) -> list[ElfFacts]:
        """The objects the object's NEEDED entries may name, once each, in their order (more
        than one for a name where it depends on who loaded `obj`: a caller keeps those its
        process holds)."""
        found = self._deps.get(obj.identity)
        if found is None:
            paths = [p for name in obj.needed for p in sorted(self.map.leads_to(obj, name))]
            found = self._deps[obj.identity] = list(
                {self.by_path[p].identity: self.by_path[p] for p in paths}.values())
        return found

    def open(self, state: State, root: ElfFacts, is_global: bool) -> Load:
        """dlopen(root, RTLD_NOW | (RTLD_GLOBAL if is_global else RTLD_LOCAL)) in the model;
        each (state, root, flags) is worked out once (a matrix asks for the same ones per row)."""
        key = (state, root.identity, is_global)
        found = self._opened.get(key)
        if found is None:
            found = self._opened[key] = self._open(state, root, is_global)
        return found

    def _open(self, state: State, root: ElfFacts, is_global: bool) -> Load:
        order = self.search_list(state, root)
        done = set(state.loaded)
        new = tuple(o.identity for o in order if o.identity not in done)
        placed: list[Key] = []  # _dl_sort_maps_dfs: post-order, the list walked from its end
        seen: set[Key] = set()
        held = {o.identity for o in order}  # (a name's other file, had another loaded it: not)

        def visit(obj: ElfFacts) -> None:
            seen.add(obj.identity)
            for dep in self.deps(obj):
                if dep.identity in held and dep.identity not in seen:
                    visit(dep)
            placed.append(obj.identity)

        for obj in reversed(order):
            if obj.identity not in seen:
                visit(obj)
        placed.remove(root.identity)  # the object opened is initialised last, whatever cycles
        placed.append(root.identity)
        inits = tuple(key for key in placed if key not in done)
        scope = state.global_scope
        if is_global:
            scope += tuple(o.identity for o in order if o.identity not in scope)
        return Load(new, inits, State(state.loaded + new, scope))

    def avoids_python(self, path: Path) -> bool:
        """Whether no object dlopen(path) can map (its closure) defines or references a name
        libpython could define (CPython exports nothing but names that begin with `Py` or
        `_Py`: its build checks it, Tools/build/smelly.py), nor one that an object libpython
        brings along (its libm) defines and the C library does not, unless the closure maps
        that very object itself: loaded RTLD_GLOBAL, libpython puts them all in the global
        scope, where they would resolve a library that forgot `-lm`. False for a file the
        model lacks."""
        key = ("avoids python", path)
        with self._lock:
            if key in self._cache:
                return self._cache[key] is not None
            if self._brought is None:
                everywhere = frozenset().union(*(self.facts[k].defines for k in self.first))
                self._brought = tuple(
                    (obj.identity, frozenset(name for name in obj.defines - everywhere
                                             if name not in RESERVED))
                    for obj in self._python_brings())
            brought = self._brought
        facts = self.by_path.get(path)
        order = self.map.search_list(facts)[0] if facts is not None else []
        mapped = {obj.identity for obj in order}
        foreign = frozenset().union(*(names for key, names in brought if key not in mapped))
        clear = facts is not None and not any(map(self.names_python, order)) and all(
            foreign.isdisjoint(names) for obj in order
            for names in (obj.defines, obj.undefined, obj.weak))
        with self._lock:
            self._cache[key] = path if clear else None
        return clear

    def names_python(self, obj: ElfFacts) -> bool:
        """Whether the object defines or references (weakly too: a library may ask whether it
        is in a Python process) a name that begins with `Py` or `_Py`."""
        if obj.identity not in self._pythonish:  # libtorch_cpu alone has ~300,000 names
            self._pythonish[obj.identity] = any(
                name.startswith(PYTHON_NAMES)
                for name in itertools.chain(obj.defines, obj.undefined, obj.weak))
        return self._pythonish[obj.identity]

    # -- the rule ---------------------------------------------------------------------------
    def lookup_scope(self, state: State, root: ElfFacts) -> list[Key]:
        """Where the relocations of what dlopen(root) maps look symbols up: the global scope,
        then root's search list (what the global scope already holds counts once, first)."""
        return [*state.global_scope, *(o.identity for o in self.search_list(state, root)
                                       if o.identity not in state.global_scope)]

    def stands_in(self, state: State, lib: ElfFacts, step: ElfFacts, is_global: bool) -> bool:
        """Whether dlopen(lib, RTLD_LOCAL) then the step leaves what the step alone leaves."""
        alone = self.open(state, step, is_global)
        ahead = self.open(state, lib, False)
        if not set(ahead.new) <= set(alone.new):
            return False
        then = self.open(ahead.after, step, is_global)
        if resolved_after([self.facts[k] for k in ahead.new], [self.facts[k] for k in then.new]):
            return False
        if self.ordered(ahead.inits + then.inits) != self.ordered(alone.inits) \
                or then.after.global_scope != alone.after.global_scope:
            return False
        return same_definers([self.facts[k] for k in ahead.new], self.lookup_scope(state, lib),
                             self.lookup_scope(state, step), self.facts)

    def ordered(self, inits: Iterable[Key]) -> list[Key]:
        """Constructors whose order can matter: all but the C library's own."""
        return [k for k in inits if not self.facts[k].path.name.startswith(C_LIBRARY)]

    def weighs(self, state: State, step: HarnessStep) -> int:
        """Bytes of the files the step would map in this state (0 for a step the model lacks)."""
        facts = self.by_path.get(step.path)
        return self.weight(state, facts) if step.mode in "gl" and facts else 0

    def weight(self, state: State, lib: ElfFacts) -> int:
        """Bytes of the files dlopen(lib) would map in this state."""
        done = set(state.loaded)
        return sum(self.size(o) for o in self.search_list(state, lib) if o.identity not in done)

    def size(self, obj: ElfFacts) -> int:
        if obj.identity not in self._sizes:
            self._sizes[obj.identity] = obj.path.stat().st_size
        return self._sizes[obj.identity]

    def choose(self, state: State, step: HarnessStep) -> Path | None:
        """The library to load ahead of `step` in `state`, or None: among the heavy libraries
        the step would load, the one the most campaign libraries reach that passes the rule."""
        facts = self.by_path.get(step.path)
        if step.mode not in "gl" or facts is None or not self.leads:
            return None
        key = (state, step.mode, step.path)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        closure = {o.identity for o in self.search_list(state, facts)}
        found = None
        for lib in (c for c in self.leads if c.identity in closure):
            if self.weight(state, lib) >= HEAVY_BYTES \
                    and self.stands_in(state, lib, facts, step.mode == "g"):
                found = lib.path
                break
        with self._lock:
            self._cache[key] = found
        return found

def shared(names: frozenset[str], objects: list[ElfFacts]) -> set[str]:
    """Those of the names that the objects define or reference, strongly or weakly (a weak
    reference binds where a definition is in scope), reserved names aside."""
    return {name for obj in objects
            for name in (names & obj.defines) | (names & obj.undefined) | (names & obj.weak)
            if name not in RESERVED}


def first_definers(scope: Iterable[Key], names: Iterable[str],
                   facts: dict[Key, ElfFacts]) -> dict[str, Key]:
    """For each of the names, the object of a lookup scope that a reference to it binds to
    (the first that defines it, as ld.so looks); a name none defines is left out (a weak
    reference stays null, a strong one fails). The scope is walked once, not once a name."""
    left, found = set(names), {}
    for key in scope:
        if not left:
            break
        hits = left & facts[key].defines
        found.update(dict.fromkeys(hits, key))
        left -= hits
    return found


def resolves_late(obj: ElfFacts) -> bool:
    """Whether the object defines an IFUNC whose resolver may see what a constructor did (the
    C library's objects' resolvers read the CPU's features only)."""
    return bool(obj.ifuncs) and not obj.path.name.startswith(C_LIBRARY)


def resolved_after(early: list[ElfFacts], fresh: list[ElfFacts]) -> bool:
    """Whether relocating `fresh` may run an IFUNC resolver that sees `early`'s constructors,
    where the cold run relocates both before any of their constructors (ld.so runs a load's
    resolvers while it relocates, then its constructors): an IFUNC `fresh` defines, or one of
    `early`'s that `fresh` references."""
    names = frozenset().union(*(obj.ifuncs for obj in early if resolves_late(obj)))
    return any(resolves_late(obj) or names & (obj.undefined | obj.weak) for obj in fresh)


def a_copy(obj: ElfFacts, name: str) -> bool:
    """Whether the object's definition of the name is a copy of one thing, which binding to
    it instead of the definition it would bind otherwise cannot tell apart (C++'s
    one-definition rule): a weak definition of a C++ name (an inline function, a template
    instance), or one of ODR_COPIES; but the C++ ABI's and the unwinder's functions
    (`__cxa_throw`, ...) only in an object that carries a C++ runtime of its own (it defines
    the personality routine, `__gxx_personality_v0`): elsewhere a strong one is a hook."""
    if name.startswith(ABI_NAMES) and name in obj.strong:
        return PERSONALITY in obj.defines
    return bool(ODR_COPIES.match(name)) or (name.startswith("_Z") and name not in obj.strong)


def meant(obj: ElfFacts) -> frozenset[str]:
    """The definitions of an object that are its own, not copies of one thing: the strong
    ones, and the weak ones of C names (a weak default hook is code of its own; only C++'s
    inline functions and template instances, mangled `_Z...`, are one thing by the ODR)."""
    return obj.strong | frozenset(name for name in obj.defines - obj.strong
                                  if not name.startswith("_Z"))


def same_definers(ahead: list[ElfFacts], warm: list[Key], cold: list[Key],
                  facts: dict[Key, ElfFacts]) -> bool:
    """Whether every name the `ahead` objects define or reference binds alike in both lookup
    scopes: to the same first definer (the one ld.so binds to), or, cold, to another copy of
    one thing (`a_copy`: what the tiers take as the same, `rebinding`).

    `warm` holds a subset of `cold`'s objects, so a name can bind otherwise
    only where an object only `cold` has defines it, or where two objects both
    define it and the scopes order them differently: only those names are looked
    up."""
    in_warm = set(warm)
    names = set().union(*(shared(facts[key].defines, ahead) for key in cold if key not in in_warm))
    common = [k for k in cold if k in in_warm]
    position = {k: i for i, k in enumerate(warm)}
    for i, a in enumerate(common):
        for b in common[i + 1:]:
            if position[a] > position[b]:
                names |= shared(facts[a].defines & facts[b].defines, ahead)
    here_of, there_of = first_definers(warm, names, facts), first_definers(cold, names, facts)
    for name in names:  # (`warm` is within `cold`: where `warm` has a definer, `cold` has one)
        here, there = here_of.get(name), there_of.get(name)
        if here != there and (here is None or there is None or not a_copy(facts[there], name)):
            return False  # (a weak reference left null warm is no copy of anything)
    return True
