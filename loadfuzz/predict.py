"""Static prediction: replay a load order against the inventory and say whether it should abort.

No library is loaded. A `Process` keeps what the dynamic loader keeps: which
files are in, under which names, and the global scope. Each step loads a
library's dependency list (the loader's breadth-first search list, shared
with `elf.loader.LinkMap`), runs the constructors of the objects it brought
in, dependencies first, and each constructor that registers operators calls
its registry's entry point. That call binds the way ld.so binds it:

- to the caller's own definition when it binds to itself (DT_SYMBOLIC or a
  protected symbol);
- else to the first definition in the global scope (the program and every
  object loaded `global` so far), then in the step's own search list.

The registry a call reaches is the copy in the object it binds to. Two
registrations of one operator name into the same copy abort the process:
that is the prediction. `global` therefore matters for later steps (a copy
in the global scope wins every later binding); `local` keeps each library's
calls inside its own closure, where a shared dependency (loaded once, by
name) is still shared.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from loadfuzz.elf.read import LOADER_HOOKS, STD_PREFIXES, ElfFacts
from loadfuzz.inventory import Inventory, Library
from loadfuzz.model import Flags, Outcome, Step, StepKind, TrialRecord
from loadfuzz.plan import load
from loadfuzz.registries import REGISTRY_BY_NAME, RegistryKind, qualified_name


@dataclass(frozen=True)
class Prediction:
    """What one load order should do. `step` is None when it should run clean."""

    sequence: tuple[Step, ...]
    outcome: Outcome
    step: int | None = None
    op: str | None = None
    signature: str | None = None
    why: str = ""
    confidence: str = "high"  # "high", "medium" or "low": see CONFIDENCE
    evidence: tuple[str, ...] = ()  # the facts of the ELF files the prediction rests on

    @property
    def clean(self) -> bool:
        return self.outcome is Outcome.CLEAN

    def pair_json(self) -> dict:
        """The contract's `predicted` entry for an ordered pair."""
        first, second = self.sequence
        return {"first": first.lib, "second": second.lib, "flags": first.flags.value,
                "outcome": self.outcome.value, "op": self.op, "why": self.why,
                "confidence": self.confidence, "evidence": list(self.evidence)}


CONFIDENCE = ("high", "medium", "low")
READ_FROM = {"kernel-names": "read from the kernel table strings of its read-only data",
             "schemas": "read from the operator schemas in its read-only data"}
PYTHON_STEPS = ("Python steps are replayed as RTLD_LOCAL loads: what their import runs "
                "(other imports, torch.ops.load_library) is not modelled")


@dataclass
class Process:
    """The loader's state in one simulated process (mutable, private to one `replay`)."""

    inv: Inventory
    by_name: dict[str, ElfFacts] = field(default_factory=dict)  # names answered by loaded objects
    loaded: dict[tuple[int, int], ElfFacts] = field(default_factory=dict)
    global_scope: list[ElfFacts] = field(default_factory=list)
    # (registry kind, identity of the copy) -> what was registered into it, in order:
    # (id of the library, the operators it registered there)
    registries: dict[tuple[str, tuple[int, int]], list[tuple[str, frozenset[str]]]] = field(
        default_factory=dict)
    owners: Mapping[tuple[int, int], Library] = field(default_factory=dict)
    # What happened, for explanations: (object, the step that brought it in), in load order,
    # and each registering call: (caller, entry point symbol, the copy it bound to).
    arrived: list[tuple[ElfFacts, int]] = field(default_factory=list)
    calls: list[tuple[ElfFacts, str, ElfFacts]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.owners = self.inv.by_identity

    def copy(self) -> Process:
        """Another process in this one's state, to go on from separately."""
        return replace(self, by_name=dict(self.by_name), loaded=dict(self.loaded),
                       global_scope=list(self.global_scope), arrived=list(self.arrived),
                       calls=list(self.calls),
                       registries={key: list(held) for key, held in self.registries.items()})

    def name_of(self, obj: ElfFacts) -> str:
        lib = self.owners.get(obj.identity)
        return lib.id if lib else obj.path.name

    def library(self, obj: ElfFacts) -> Library | None:
        return self.owners.get(obj.identity)

    def how_bound(self, caller: ElfFacts, copy: ElfFacts) -> str:
        if copy.identity == caller.identity:
            return "its own copy"
        if any(obj.identity == copy.identity for obj in self.global_scope):
            return "the first definition in the global scope"
        return "the first definition in its own dependency closure"

    def bind(self, caller: ElfFacts, symbol: str, local: Sequence[ElfFacts]) -> ElfFacts | None:
        if caller.binds_to_itself(symbol):
            return caller
        return next((obj for obj in itertools.chain(self.global_scope, local)
                     if symbol in obj.defines), None)

    def load(self, index: int, step: Step) -> Prediction | None:
        """Do one step; a Prediction when it should end the process. A module imported by name
        is not in the inventory: nothing is predicted of it (it is taken as clean)."""
        if step.kind is StepKind.MODULE:
            return None
        root = self.inv.link_map.files[self.inv.get(step.lib).path]
        order, missing = self.inv.link_map.search_list(root, self.by_name)
        if missing:
            return Prediction((), Outcome.LOAD_ERROR, index,
                              why=f"{step.lib} needs {missing[0]}, which nobody provides",
                              evidence=(f"{step.lib}'s dependency closure names {missing[0]}",
                                        "no folder of its search path (RUNPATH, LD_LIBRARY_PATH, "
                                        "ld.so.conf, the system folders) holds it"))
        new = [obj for obj in order if obj.identity not in self.loaded]
        if (lacking := unresolved(self.inv, new, [*self.global_scope, *order])) is not None:
            obj, name = lacking
            return Prediction((), Outcome.LOAD_ERROR, index,
                              why=f"{self.name_of(obj)} needs the symbol {name}, which nothing "
                                  "in its lookup scope defines",
                              evidence=(f"{self.name_of(obj)} references {name} (a strong "
                                        "undefined dynamic symbol)",
                                        "no object of the global scope nor of the step's "
                                        "dependency closure exports it"))
        self.arrived += [(obj, index) for obj in new]
        needed_as = self.needed_as(order)
        for obj in order:
            self.loaded.setdefault(obj.identity, obj)
            for name in filter(None, (obj.soname, *needed_as.get(obj.identity, ()))):
                self.by_name.setdefault(name, obj)
        for obj in self.init_order(new):
            ended = self.construct(index, obj, order)
            if ended:
                return ended
        if step.flags is Flags.GLOBAL and step.kind is StepKind.DLOPEN:
            known = {obj.identity for obj in self.global_scope}
            self.global_scope += [obj for obj in order if obj.identity not in known]
        return None

    def needed_as(self, order: Sequence[ElfFacts]) -> dict[tuple[int, int], list[str]]:
        """The NEEDED names under which this step loaded each object, by identity. With its
        SONAME, the names a later NEEDED entry finds it by, as ld.so keeps them; never its file
        name: a library opened by its path is found again only by its SONAME, or as the same
        file on disk."""
        here = {obj.identity for obj in order}
        names: dict[tuple[int, int], list[str]] = {}
        for parent in order:
            for name in parent.needed:
                # (the file it leads to in this process: which, can depend on who loaded parent)
                for found in {obj.identity for obj in self.inv.link_map.held(parent, name, here)}:
                    names.setdefault(found, []).append(name)
        return names

    def init_order(self, new: Sequence[ElfFacts]) -> list[ElfFacts]:
        """The order ld.so runs the constructors of the objects a step brought in (glibc's
        depth-first `_dl_sort_maps`): from the last of them in load order to the first, each
        object's dependencies (in DT_NEEDED order) before the object. Not the load order
        reversed: a library loaded early can depend on one loaded after it."""
        pending = {obj.identity for obj in new}
        done: list[ElfFacts] = []
        seen: set[tuple[int, int]] = set()

        link_map = self.inv.link_map
        here = {obj.identity: obj for obj in new}

        def visit(obj: ElfFacts) -> None:
            seen.add(obj.identity)
            for name in obj.needed:
                found = link_map.held(obj, name, here)
                dep = here[found[0].identity] if found else self.by_name.get(name)
                if dep is not None and dep.identity in pending and dep.identity not in seen:
                    visit(dep)
            done.append(obj)

        for obj in reversed(new):
            if obj.identity not in seen:
                visit(obj)
        return done

    def construct(self, index: int, obj: ElfFacts, local: Sequence[ElfFacts]) -> Prediction | None:
        lib = self.library(obj)
        if lib is None:
            return None
        entries = {entry.kind: entry for entry in lib.entries}
        for kind_name, ops in lib.registrations:
            kind = REGISTRY_BY_NAME[kind_name]
            copy = self.bind(obj, entries[kind_name].symbol, local)
            if copy is None:
                continue
            self.calls.append((obj, entries[kind_name].symbol, copy))
            registry = self.registries.setdefault((kind_name, copy.identity), [])
            owner = self.library(copy)
            mentions = (owner.registered.get(kind_name, frozenset())
                        if kind.owner_names_are_mentions and owner and owner is not lib
                        else frozenset())
            names = lib.registered[kind_name]
            names = names - mentions if mentions else names
            if len(lib.registered[kind_name]) == len(ops) and all(
                    names.isdisjoint(earlier) for _, earlier in registry):
                registry.append((lib.id, names))  # nothing registered twice
                continue
            return self.collision(index, kind, lib, ops, mentions, registry, copy)
        return None

    def collision(self, index: int, kind: RegistryKind, lib: Library, ops: Sequence[str],
                  mentions: frozenset[str], registry: Sequence[tuple[str, frozenset[str]]],
                  copy: ElfFacts) -> Prediction:
        """The prediction when `lib` registers `ops` into a copy that already holds one: the
        first operator registered twice, who registered it first, and how many more."""
        first: dict[str, str] = {}  # operator -> the library that registered it first
        for lib_id, names in registry:
            for op in names:
                first.setdefault(op, lib_id)
        for op in ops:
            if op in mentions:
                continue  # the owner's own operator: spelled here, defined there
            if op in first:
                shared = sum(1 for other in ops if other in first)
                more = f" (+{shared - 1} more)" if shared > 1 else ""
                caller, entry, _ = self.calls[-1]
                return Prediction(
                    (), Outcome.REREGISTER, index, op, kind.signature,
                    f"{first[op]} and {lib.id} both register {op}{more} into "
                    f"{kind.title}, and both bind its entry point to the copy in "
                    f"{self.name_of(copy)}", kind.confidence,
                    (f"{first[op]} registers {op} ({READ_FROM[kind.names]})",
                     f"{lib.id} registers {op}{more} too",
                     f"{lib.id} binds {qualified_name(entry)} to {self.name_of(copy)}"
                     f" ({self.how_bound(caller, copy)})"))
            first[op] = lib.id
        raise AssertionError("a collision without an operator registered twice")


FirstSteps = dict[Step, tuple["Process", "Prediction | None"]]


def simulate(inv: Inventory, sequence: Sequence[Step], firsts: FirstSteps | None = None,
             ) -> tuple[Prediction, Process]:
    """The predicted outcome of running `sequence` (steps by library id) in one fresh process,
    and the simulated process as it was when it ended. `firsts`: the processes after a first
    step, kept by step across calls (a matrix replays each first step many times)."""
    process, start, ended = Process(inv), 0, None
    if firsts is not None and sequence:
        if sequence[0] not in firsts:
            first = Process(inv)
            firsts[sequence[0]] = (first, first.load(0, sequence[0]))
        first, ended = firsts[sequence[0]]
        process, start = (first if ended else first.copy()), 1
    python = any(s.kind is not StepKind.DLOPEN or s.flags is Flags.PYTHON for s in sequence)
    for index, step in enumerate(sequence[start:], start):
        if ended is not None:
            break
        ended = process.load(index, step)
    if ended is not None:
        if python:
            ended = replace(ended, confidence="low", evidence=(*ended.evidence, PYTHON_STEPS))
        return replace(ended, sequence=tuple(sequence)), process
    return clean_prediction(tuple(sequence), process, python), process


def clean_prediction(sequence: tuple[Step, ...], process: Process | None,
                     python: bool) -> Prediction:
    """Nothing should fail: how sure that is, and why (`process` None: nothing registered)."""
    kinds = {kind for kind, _ in process.registries} if process is not None else set()
    if python:
        return Prediction(sequence, Outcome.CLEAN, confidence="low", evidence=(PYTHON_STEPS,))
    if not kinds:
        return Prediction(sequence, Outcome.CLEAN, evidence=(
            "no library the steps bring in registers operators",))
    names = sum(len(ops) for held in process.registries.values() for _, ops in held)
    worst = max((REGISTRY_BY_NAME[k].confidence for k in kinds), key=CONFIDENCE.index)
    return Prediction(sequence, Outcome.CLEAN, confidence=worst, evidence=(
        f"{names} operator names registered into {len(process.registries)} registry copies, "
        "none of them twice into the same copy",))


def replay(inv: Inventory, sequence: Sequence[Step]) -> Prediction:
    """The predicted outcome of running `sequence` (steps by library id) in one fresh process."""
    return simulate(inv, sequence)[0]


def predict(inv: Inventory, libraries: Iterable[Library] | None = None,
            flags: Sequence[Flags] = (Flags.GLOBAL, Flags.LOCAL)) -> tuple[Prediction, ...]:
    """Every ordered pair under each flags mode that should not run clean. A pair of quiet
    libraries (`quiet`) runs clean without a replay: an environment of thousands of
    libraries, most of them quiet, has millions of pairs."""
    libs = sorted(inv.libraries if libraries is None else libraries,
                  key=lambda lib: (lib.id, str(lib.path)))  # the order of `plan.pairs`
    calm, firsts = quiet(inv, libs), {}
    noisy = [lib for lib in libs if lib.id not in calm]
    found = (simulate(inv, (load(first, mode), load(second, mode)), firsts)[0]
             for mode in flags for first in libs
             for second in (noisy if first.id in calm else libs) if second.id != first.id)
    return tuple(p for p in found if not p.clean)


def calm_prediction(sequence: Sequence[Step], calm: frozenset[str]) -> Prediction | None:
    """What `simulate` predicts of a load order of quiet libraries alone (`quiet`), without
    the replay; None for any other."""
    if not all(step.kind is not StepKind.MODULE and step.lib in calm for step in sequence):
        return None
    python = any(s.kind is not StepKind.DLOPEN or s.flags is Flags.PYTHON for s in sequence)
    return clean_prediction(tuple(sequence), None, python)


def quiet(inv: Inventory, libraries: Iterable[Library]) -> frozenset[str]:
    """The ids of the libraries that load alone with every NEEDED name found, and whose
    dependency closure holds no library that registers anything. A load order of quiet
    libraries alone runs clean: nothing in it is missing (a library loaded before only
    answers names), and nothing registers, so nothing collides."""
    registering = {identity for identity, lib in inv.by_identity.items() if lib.registrations}
    calm = set()
    for lib in libraries:
        order, missing = inv.link_map.search_list(inv.link_map.files[lib.path])
        if not missing and not any(obj.identity in registering for obj in order) \
                and unresolved(inv, order, order) is None:
            calm.add(lib.id)
    return frozenset(calm)


def unresolved(inv: Inventory, new: Sequence[ElfFacts],
               scope: Sequence[ElfFacts]) -> tuple[ElfFacts, str] | None:
    """The first of the new objects with a strong undefined symbol that no object of `scope`
    (its lookup scope: the global scope, then the step's search list) defines, and that
    symbol: RTLD_NOW fails the load on it ("undefined symbol: ..."). Only the names an
    object's own closure lacks are looked for (`Inventory.lacking`)."""
    for obj in new:
        if left := set(inv.lacking(obj)):
            for other in scope:
                left -= other.defines
            if left:
                return obj, min(left)
    return None


def shared_definitions(first: ElfFacts, second: ElfFacts, limit: int = 8) -> tuple[str, ...]:
    """Exported symbols both define (not the C++ library's): what `global` lets one take from the other."""
    both = {name for name in first.defines & second.defines
            if not name.startswith(STD_PREFIXES) and name not in LOADER_HOOKS}
    return tuple(sorted(both)[:limit])


def interposition(inv: Inventory, records: Iterable[TrialRecord]) -> list[dict]:
    """Pairs whose outcome differs between `global` and `local`, with the symbols both define.

    Those symbols are why the flags matter: under `global` the second library's
    calls to them bind to the first library's copy.
    """
    trials = ((r.sequence[0].lib, r.sequence[0].flags.value, r.sequence[1].lib,
               r.sequence[1].flags.value, r.outcome.value) for r in records if len(r.sequence) == 2)
    return [{"first": first, "second": second, **outcomes, "shared_symbols": list(
                shared_definitions(*(inv.link_map.files[inv.get(lib).path] for lib in (first, second))))}
            for (first, second), outcomes in flags_decide(trials).items()]


def flags_decide(trials: Iterable[tuple[str, str, str, str, str]],
                 ) -> dict[tuple[str, str], dict[str, str]]:
    """(first, second) -> {"global": outcome, "local": outcome}, in order, for the pairs whose
    outcome differs between the two modes; each trial given as (first library, its flags,
    second library, its flags, outcome). Other modes (`python`, mixed) are left out."""
    modes: dict[tuple[str, str], dict[str, str]] = {}
    for first, first_flags, second, second_flags, outcome in trials:
        if first_flags == second_flags and first_flags in (Flags.GLOBAL.value, Flags.LOCAL.value):
            modes.setdefault((first, second), {})[first_flags] = outcome
    return {pair: outcomes for pair, outcomes in sorted(modes.items())
            if len(outcomes) == 2 and len(set(outcomes.values())) == 2}


MOST_DISAGREEMENTS = 100  # listed in a summary; the count is always whole


def agreement(inv: Inventory, records: Iterable[TrialRecord]) -> dict:
    """How the static prediction fared against what the trials did: the summary's `prediction`.
    A trial agrees when its outcome and operator are the predicted ones (clean when nothing
    is predicted; a predicted load-error names no operator, so its outcome alone); the
    prediction names no crash, exit or timeout, so those always disagree."""
    agree, disagree = 0, []
    by_confidence = {level: {"agree": 0, "disagree": 0} for level in CONFIDENCE}
    firsts: FirstSteps = {}
    calm = quiet(inv, inv.libraries)
    for record in records:
        predicted = calm_prediction(record.sequence, calm) or simulate(
            inv, record.sequence, firsts)[0]
        agreed = predicted.outcome is record.outcome and (
            predicted.op == record.op
            or (predicted.outcome is Outcome.LOAD_ERROR and predicted.op is None))
        by_confidence[predicted.confidence]["agree" if agreed else "disagree"] += 1
        if agreed:
            agree += 1
        else:
            disagree.append({"sequence": [s.to_json() for s in record.sequence],
                             "predicted": {"outcome": predicted.outcome.value, "op": predicted.op,
                                           "why": predicted.why,
                                           "confidence": predicted.confidence},
                             "observed": {"outcome": record.outcome.value, "op": record.op}})
    return {"agree": agree, "disagree_count": len(disagree),
            "disagree": disagree[:MOST_DISAGREEMENTS], "by_confidence": by_confidence}
