"""Explain: why a finding happened, which libraries carry a copy of what collided, and the ways out.

`Explainer(inv).explain(record, trace)` gives a finding its `Cause`: a kind
from the catalogue `causes.toml` (data, like the signatures), the libraries
that carry a copy of what collided (each with how it got into the process:
loaded by a step, or as whose dependency), the symbols that mattered (the
registry entry point each copy bound to), one paragraph for a bug report,
and the fixes, most specific first.

The evidence is what the loader itself said about the finding's cold
confirmation run (`run.ldtrace`: which objects came in and why, where each
registering library's entry point bound, the constructor that ran last), else
(no trace, or a run that ended otherwise) the ELF files, through the static
replay of `predict`; the cause says which (`evidence`: "observed" or "static").
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from loadfuzz import predict, registries
from loadfuzz.causes import Account, CauseRule, Fields, load_causes
from loadfuzz.elf.cache import ElfCache
from loadfuzz.elf.loader import origin_path
from loadfuzz.elf.opnames import carries_string
from loadfuzz.elf.read import STD_PREFIXES, BadElf, ElfFacts, ElfReader
from loadfuzz.inventory import Inventory
from loadfuzz.model import BoundSymbol, Carrier, Cause, Fix, Outcome, StepKind, TrialRecord
from loadfuzz.run import ldtrace
from loadfuzz.run.ldtrace import LoaderTrace

# What the text says of a copy or a binding that neither the run nor the ELF files identify.
UNIDENTIFIED = {"first": "a library loaded earlier", "entry": "their registration calls",
                "first_how": "which one, neither the loader's report nor the ELF files tell",
                "owner": "the process", "more": "", "count": "?"}
SYSTEM = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/", "/usr/local/lib/")
MOST_SYMBOLS = 8


def is_system(path: str) -> bool:
    return path.startswith(SYSTEM)


def identity(path: str) -> tuple[int, int] | None:
    try:
        return (info := os.stat(path)).st_dev, info.st_ino
    except OSError:
        return None


@dataclass(frozen=True)
class Loaded:
    """One object in the trial's process: where it is, and the step and parent that brought it."""

    path: str
    identity: tuple[int, int] | None
    step: int | None
    needed_by: str | None  # the path of the object that needed it; None when a step loaded it


class Explainer:
    """Explains the findings of one campaign's libraries (one per campaign; keeps what it read)."""

    def __init__(self, inv: Inventory, reader: ElfReader | None = None,
                 names: Mapping[tuple[int, int], str] | None = None):
        """`names`: ids of files the inventory does not hold (`run --target`: the target's)."""
        self.inv = inv
        self.names = names or {}
        self._reader = reader
        self.rules = load_causes()
        self.owners = inv.by_identity
        self.files = {facts.identity: facts for facts in inv.link_map.files.values()}
        self._facts: dict[str, ElfFacts | None] = {}
        self._entries: dict[str, bool] = {}
        self._replays: dict[tuple, tuple[tuple, predict.Process] | None] = {}
        self._ids: dict[Path, str] | None = None  # inventory ids by resolved path, made once
        self._callers: dict[str, ElfFacts | None] = {}  # a caller's facts, if it is the inventory's
        self.hints = tuple(kind.hint for kind in registries.REGISTRIES)

    @property
    def reader(self) -> ElfReader:  # made on first use: most campaigns never need one
        self._reader = self._reader or ElfReader(ElfCache.default())
        return self._reader

    # -- what the confirmation run should keep of the loader's account -------------------
    def keeps(self, caller: str, symbol: str, target: str) -> int:
        """How much a binding is worth keeping (see `ldtrace.parse`): a registry entry point
        always, even to the caller itself (a copy that keeps its registrations is news too); a
        reference that a library of the inventory makes to a symbol it defines itself, bound to
        another object (interposition), while there is room. Called for every binding of the
        run (hundreds of thousands with libtorch): the cheap tests come first."""
        if self.is_entry(symbol):
            return ldtrace.ALWAYS
        if caller == target or symbol.startswith(STD_PREFIXES):
            return 0
        if caller not in self._callers:
            facts = None if is_system(caller) else self.facts(caller)
            self._callers[caller] = facts if facts and facts.identity in self.owners else None
        facts = self._callers[caller]
        return int(facts is not None and symbol in facts.defines)

    def watch(self, expected: TrialRecord) -> tuple[Callable[[str, str, str], int],
                                                     tuple[str, ...] | None]:
        """What to read of the loader's report of a run expected to end as `expected`: `keeps`,
        and, for a double registration into a registry loadfuzz models, only the bindings that
        can name its entry point (the others, hundreds of thousands with libtorch, unread)."""
        modelled = any(kind.signature == expected.signature for kind in registries.REGISTRIES)
        return self.keeps, self.hints if modelled else None

    def is_entry(self, symbol: str) -> bool:
        if not any(hint in symbol for hint in self.hints):
            return False
        if symbol not in self._entries:
            self._entries[symbol] = any(registries.entry_symbols(kind, [symbol])
                                        for kind in registries.REGISTRIES)
        return self._entries[symbol]

    def facts(self, path: str) -> ElfFacts | None:
        if path not in self._facts:
            found = self.files.get(identity(path) or (-1, -1))
            if found is None:
                try:
                    found = self.reader.facts(Path(path))
                except BadElf:
                    found = None
            self._facts[path] = found
        return self._facts[path]

    # -- the explanation ---------------------------------------------------------------
    def explain(self, record: TrialRecord, trace: LoaderTrace | None) -> TrialRecord:
        """The record with its cause (and fixes); a clean record as it is. `trace`: the loader's
        account of this very run, or None."""
        if record.clean:
            return record
        observed = trace is not None and bool(trace.arrivals)
        objects = self.observed(record, trace) if observed else self.static(record)
        account = self.account(record, objects, trace if observed else None)
        rule = self.rule(record, account)
        fields = Fields(self.common_fields(record, objects, observed))
        fields.update(account.fields)
        fixes = tuple(Fix(f.name, f.text.format_map(fields), f.last_resort)
                      for f in rule.fixes if f.when is None or f.when in account.conditions)
        cause = Cause(rule.kind, account.carriers, account.symbols, rule.text.format_map(fields),
                      "observed" if observed else "static", fixes)
        return replace(record, cause=cause)

    def rule(self, record: TrialRecord, account: Account) -> CauseRule:
        for rule in self.rules:
            if rule.kind == account.kind or (account.kind is None and (
                    record.signature in rule.signatures
                    or (record.signature is None and record.outcome.value in rule.outcomes))):
                return rule
        return next(r for r in self.rules if r.kind == "load-error")

    # -- which objects the process held, and how each came in ---------------------------
    def observed(self, record: TrialRecord, trace: LoaderTrace) -> list[Loaded]:
        steps = {identity(str(s.path)): n for n, s in enumerate(record.sequence)
                 if s.kind is not StepKind.MODULE}
        objects: dict[str, Loaded] = {}
        for arrival in trace.arrivals:
            ident = identity(arrival.path)
            if arrival.dlopened and (ident in steps or arrival.by not in objects):
                objects[arrival.path] = Loaded(arrival.path, ident, steps.get(ident), None)
            else:  # needed by an object of the trial, or dlopen()ed by one
                parent = objects.get(arrival.by)
                objects[arrival.path] = Loaded(arrival.path, ident, parent and parent.step,
                                               arrival.by)
        return list(objects.values())

    def static(self, record: TrialRecord) -> list[Loaded]:
        """The objects the static replay says the steps bring in (none when a step's library
        is not in the inventory)."""
        replayed = self.replayed(record)
        if replayed is None:
            return []
        sequence, process = replayed
        loaded: list[Loaded] = []
        for obj, step in process.arrived:
            root = self.inv.link_map.files.get(sequence[step].path)
            parent = None if root is None or obj.identity == root.identity else next(
                (str(o.path) for o, _ in process.arrived
                 if any(obj.path in self.inv.link_map.leads_to(o, n) for n in o.needed)),
                str(root.path))
            loaded.append(Loaded(str(obj.path), obj.identity, step, parent))
        return loaded

    def name(self, record: TrialRecord, path: str | None) -> str:
        """A library's id: the step's, the inventory's, else its file name."""
        if path is None:
            return "?"
        ident = identity(path)
        for step in record.sequence:
            if step.kind is not StepKind.MODULE and identity(str(step.path)) == ident:
                return step.lib
        lib = self.owners.get(ident) if ident else None
        return lib.id if lib else self.names.get(ident or (-1, -1), Path(path).name)

    def carrier(self, record: TrialRecord, objects: list[Loaded], path: str) -> Carrier:
        found = next((o for o in objects if o.path == path), None)
        if found is None:
            ident = identity(path)
            found = next((o for o in objects if ident is not None and o.identity == ident), None)
        if found is None:
            return Carrier(self.name(record, path), record.step)
        needed_by = self.name(record, found.needed_by) if found.needed_by else None
        return Carrier(self.name(record, path), found.step, needed_by)

    def failing_path(self, record: TrialRecord, trace: LoaderTrace | None) -> str | None:
        """The object whose loading failed: the constructor that ran last in an observed run
        that died in one, else the failing step's library."""
        died = record.outcome not in (Outcome.CLEAN, Outcome.LOAD_ERROR)
        if died and trace is not None and trace.last_init and not is_system(trace.last_init):
            return trace.last_init
        if record.step is None or not 0 <= record.step < len(record.sequence):
            return None
        step = record.sequence[record.step]
        return None if step.kind is StepKind.MODULE else str(step.path)

    def common_fields(self, record: TrialRecord, objects: list[Loaded], observed: bool) -> dict:
        step = record.sequence[record.step] if record.step is not None and 0 <= record.step < len(
            record.sequence) else None
        lib = step.lib if step else "?"
        how = (self.carrier(record, objects, str(step.path)).how(record.sequence)
               if step and step.kind is not StepKind.MODULE else
               f"step {record.step}" if step else "?")
        op = self.name(record, record.op) if (record.op or "").startswith("/") else record.op
        return {"op": op or "?", "lib": lib, "second": lib, "second_how": how,
                "detail": record.detail, "repro": record.repro,
                "seen": "observed: the loader's report of the run, LD_DEBUG" if observed
                else "static: read from the ELF files, as the run's loader report could not tell"}

    # -- the account of each kind -----------------------------------------------------
    def account(self, record: TrialRecord, objects: list[Loaded],
                trace: LoaderTrace | None) -> Account:
        kinds: dict[str, Callable[[], Account]] = {
            "duplicate-registration": lambda: self.duplicate(record, objects, trace),
            "duplicate-torch-library": lambda: self.duplicate(record, objects, trace),
            "duplicate-pybind11-type": lambda: self.pybind11(record, objects, trace),
            "missing-symbol": lambda: self.missing_symbol(record, objects),
            "missing-library": lambda: self.missing_library(record, objects),
        }
        if record.step is None and record.signature is None:  # after the last step: not a
            return Account("at-exit", ())  # step's constructor, whichever ran last
        rule = self.rule(record, Account(None, ()))
        if rule.kind in kinds:
            return kinds[rule.kind]()
        named = record.signature in rule.signatures  # it says what it is: a missing module
        return (None if named else self.interposed(record, objects, trace)) or self.culprit(
            record, objects, trace)

    def culprit(self, record: TrialRecord, objects: list[Loaded],
                trace: LoaderTrace | None) -> Account:
        path = self.failing_path(record, trace)
        if path is None:
            return Account(None, ())
        carrier = self.carrier(record, objects, path)
        return Account(None, (carrier,), fields={"lib": carrier.lib,
                                                 "second_how": carrier.how(record.sequence)})

    def registered(self, path: str, kind: registries.RegistryKind) -> tuple[tuple[str, ...], str]:
        """(the names the object registers into this kind of registry, its entry point)."""
        facts = self.facts(path)
        lib = self.owners.get(facts.identity) if facts else None
        entries = lib.entries if lib else registries.entry_points(facts) if facts else ()
        entry = next((e for e in entries if e.kind == kind.name), None)
        if facts is None or entry is None:
            return (), ""
        names = dict(lib.registrations if lib else registries.registrations(
            facts, (entry,), self.reader.names))
        return names.get(kind.name, ()), entry.symbol

    def duplicate(self, record: TrialRecord, objects: list[Loaded],
                  trace: LoaderTrace | None) -> Account:
        kind = next((k for k in registries.REGISTRIES if k.signature == record.signature), None)
        op = record.op or ""
        own = [o for o in objects if not is_system(o.path)]
        names = {o.path: self.registered(o.path, kind) for o in own} if kind else {}
        copies = [o.path for o in own if kind and op in names[o.path][0]]
        held = [] if len(copies) > 1 else [o.path for o in own if carries_string(o.path, op)]
        if kind is None or len(held) > 1:  # a registry loadfuzz does not model, or registered
            # other than through its entry point (a weak reference): the copies hold the name
            name = kind.title if kind else self.rule(record, Account(None, ())).registries.get(
                record.signature or "")
            return self.copies_account(record, objects, trace, held,
                                       {"registry": name or "the registry"})
        replayed = None if trace else self.replayed(record)
        calls = replayed[1].calls if replayed else []
        failing = str(calls[-1][0].path) if calls else None  # the replay's last call collided
        account = self.copies_account(record, objects, trace, copies,
                                      {"registry": kind.title}, failing)
        if len(copies) < 2:
            return account
        first, second = names[copies[0]][0], names[copies[-1]][0]
        shared = len(set(first) & set(second))
        entry = names[copies[-1]][1] or names[copies[0]][1]
        bound = self.bindings(copies, entry, trace, record)
        owner = bound.get(copies[-1]) or next(iter(bound.values()), None)
        defined_by = tuple(self.name(record, o.path) for o in objects
                           if (f := self.facts(o.path)) is not None and entry in f.defines)
        symbol = BoundSymbol(registries.qualified_name(entry) or entry, entry, defined_by,
                             tuple((self.name(record, c), self.name(record, t))
                                   for c, t in bound.items()))
        conditions = set()
        embedding = [self.name(record, c) for c in copies
                     if (f := self.facts(c)) is not None and entry in f.defines]
        if embedding:
            conditions.add("static-copy")
        for caller, target in bound.items():
            if target != caller and not self.in_closure(caller, target):
                conditions.add("flags-decide")
        fields = dict(account.fields, count=str(shared), entry=symbol.symbol,
                      embedding=" and ".join(embedding), owner=self.name(record, owner),
                      more=f" (+{shared - 1} more)" if shared > 1 else "")
        return replace(account, symbols=(symbol,), fields=fields, conditions=frozenset(conditions))

    def copies_account(self, record: TrialRecord, objects: list[Loaded], trace: LoaderTrace | None,
                       copies: list[str], fields: dict[str, str],
                       failing: str | None = None) -> Account:
        """The copies, the one whose loading failed (`failing`, else as `failing_path` says)
        last, with the fields naming the first two."""
        failing = failing or self.failing_path(record, trace)
        if failing is not None and identity(failing) not in {identity(c) for c in copies}:
            copies = [*copies, failing]
        elif failing is not None:
            copies = [c for c in copies if identity(c) != identity(failing)] + [failing]
        carriers = tuple(self.carrier(record, objects, c) for c in copies)
        fields = {**UNIDENTIFIED, **fields}
        if carriers:
            fields = dict(fields, second=carriers[-1].lib,
                          second_how=carriers[-1].how(record.sequence))
        if len(carriers) > 1:
            fields = dict(fields, first=carriers[0].lib, first_how=carriers[0].how(record.sequence))
        return Account(None, carriers, fields=fields)

    def bindings(self, copies: list[str], entry: str, trace: LoaderTrace | None,
                 record: TrialRecord) -> dict[str, str]:
        """caller -> target of the entry point, for each copy: as observed, else as replayed."""
        if trace is not None:
            bound = trace.bound(entry)
            return {c: bound[c] for c in copies if c in bound}
        found: dict[str, str] = {}
        replayed = self.replayed(record)
        if replayed is None:
            return found
        by_id = {identity(c): c for c in copies}
        for caller, symbol, copy in replayed[1].calls:
            if symbol == entry and caller.identity in by_id:
                found[by_id[caller.identity]] = str(copy.path)
        return found

    def replayed(self, record: TrialRecord) -> tuple[tuple, predict.Process] | None:
        """The record's steps by inventory id and the static replay of them, worked out once
        per sequence; None when a step loads a library the inventory does not hold."""
        key = record.key()
        if key not in self._replays:
            if self._ids is None:
                self._ids = {lib.path.resolve(): lib.id for lib in self.inv.libraries}
            sequence = tuple(replace(s, lib=self._ids.get(s.path.resolve(), s.lib))
                             if s.kind is not StepKind.MODULE else s for s in record.sequence)
            known = set(self._ids.values())
            self._replays[key] = ((sequence, predict.simulate(self.inv, sequence)[1])
                                  if all(s.kind is StepKind.MODULE or s.lib in known
                                         for s in sequence) else None)
        return self._replays[key]

    def in_closure(self, root: str, other: str) -> bool:
        facts, target = self.facts(root), identity(other)
        if facts is None or facts.path not in self.inv.link_map.files:
            return True  # unknown: do not claim the flags decide it
        order, _ = self.inv.link_map.search_list(facts)
        # ld.so gives a NEEDED name the library loaded under that SONAME, RTLD_LOCAL or not
        soname = (found := self.facts(other)) and found.soname
        return any(obj.identity == target or soname in obj.needed for obj in order)

    def pybind11(self, record: TrialRecord, objects: list[Loaded],
                 trace: LoaderTrace | None) -> Account:
        failing = self.failing_path(record, trace)
        copies = [o.path for o in objects if not is_system(o.path) and o.path != failing
                  and carries_string(o.path, record.op or "")]
        return self.copies_account(record, objects, trace, copies, {})

    def missing_symbol(self, record: TrialRecord, objects: list[Loaded]) -> Account:
        op = record.op or ""
        found = re.search(r"(?<!\S)(\S+): undefined symbol", record.detail)
        needer = found.group(1) if found else None
        loaded = [o.path for o in objects if (f := self.facts(o.path)) and op in f.defines]
        elsewhere = [str(lib.path) for lib in self.inv.libraries
                     if op in self.inv.link_map.files[lib.path].defines]
        providers = list(dict.fromkeys(loaded + elsewhere))
        # the libraries in the process: a provider that is not (a later step's, which never
        # ran) is named in the text, not said to be loaded
        carriers = tuple(self.carrier(record, objects, p) for p in [*filter(None, [needer]),
                                                                     *loaded[:3]])
        conditions = {"provider-known"} if providers else {"no-provider"}
        if loaded:
            conditions.add("provider-loaded-local")
        provider = self.name(record, providers[0]) if providers else None
        note = (f"{provider} defines it, but is not where {self.name(record, needer)} looks"
                if provider else "No library here defines it")
        return Account(None, carriers, fields={"needer": self.name(record, needer),
                                               "provider": provider or "?",
                                               "provider_note": note},
                       conditions=frozenset(conditions))

    def missing_library(self, record: TrialRecord, objects: list[Loaded]) -> Account:
        op = Path(record.op or "").name
        needers = [o.path for o in objects if (f := self.facts(o.path)) and op in f.needed]
        needer = needers[0] if needers else self.failing_path(record, None)
        carriers = (self.carrier(record, objects, needer),) if needer else ()
        fields = {"needer": self.name(record, needer), "op": op}
        if needer is None or (shipped := self.inv.link_map.shipped(op)) is None:
            return Account(None, carriers, fields=fields, conditions=frozenset({"not-shipped"}))
        fields |= {"shipped": self.name(record, str(shipped)),
                   "origin": origin_path(shipped.parent, Path(needer))}
        return Account(None, carriers, fields=fields, conditions=frozenset({"shipped"}))

    def interposed(self, record: TrialRecord, objects: list[Loaded],
                   trace: LoaderTrace | None) -> Account | None:
        """Interposition: the failing step's libraries' references to symbols they define
        themselves, bound to an object an earlier `global` step brought in."""
        if trace is None or record.step is None:
            return None
        step_of = {o.path: o.step for o in objects}
        global_steps = {n for n, s in enumerate(record.sequence)
                        if n < record.step and s.flags.value == "global"}
        seen = [b for b in trace.bindings if not self.is_entry(b.symbol)
                and step_of.get(b.caller) == record.step and step_of.get(b.target) in global_steps
                and not is_system(b.target)]
        if not seen:
            return None
        target, caller = seen[0].target, seen[0].caller
        symbols = tuple(BoundSymbol(registries.qualified_name(b.symbol) or b.symbol, b.symbol,
                                    (self.name(record, b.caller), self.name(record, b.target)),
                                    ((self.name(record, b.caller), self.name(record, b.target)),))
                        for b in seen[:MOST_SYMBOLS])
        first, second = (self.carrier(record, objects, p) for p in (target, caller))
        names = ", ".join(s.symbol for s in symbols[:3]) + (
            f" (+{len(seen) - 3} more)" if len(seen) > 3 else "")
        return Account("interposition", (first, second), symbols, fields={
            "first": first.lib, "first_how": first.how(record.sequence), "lib": second.lib,
            "second": second.lib, "second_how": second.how(record.sequence), "symbols": names})
