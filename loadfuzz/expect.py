"""The expectations file: which findings a campaign accepts (what is new since an earlier
campaign is `baseline`'s job).

An expectations file (TOML, see the contract) lists known collisions. Each
`[[expected]]` entry names two library-id globs, the load orders and flags
modes it covers, the outcome and, optionally, an operator glob. A finding an
entry matches is *expected*; a finding none matches is *unexpected*; an entry
that matched nothing in the campaign is *stale* (the collision went away, or
the entry no longer says what it meant to).

How an entry matches a trial record's sequence of steps:

- a pair (two steps) matches when step 0's library fits `first` and step 1's
  fits `second`; with `orders = "both"` the swapped pair matches too;
- a longer sequence (from `fuzz`) matches when some ordered pair of its
  steps i < j does (so `A, X, B` is covered by an entry for `A` then `B`);
  a one-step sequence has no pair and matches nothing;
- `flags`: every step's flags mode is in the list (an empty list: any);
- `outcome` equal; `op`, when given, a glob the record's operator fits.

Globs are `fnmatch` globs, case-sensitive (`*` also crosses `/`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from loadfuzz.model import Flags, Outcome, TrialRecord, UsageError

ORDERS = ("both", "as-written")
REQUIRED_KEYS = ("first", "second", "outcome", "why")
OPTIONAL_KEYS = ("orders", "flags", "op")


@dataclass(frozen=True)
class Expectation:
    """One `[[expected]]` entry: a collision the campaign accepts, and why."""

    first: str  # glob on the library id loaded first
    second: str  # glob on the library id loaded later
    orders: str  # "both" | "as-written"
    flags: tuple[Flags, ...]  # the modes covered; empty = any
    outcome: Outcome
    op: str | None  # glob on the record's `op`; None = any
    why: str
    source: str  # "<file name>:entry <N>", for messages

    def covers_pair(self, earlier: str, later: str) -> bool:
        """Whether the library ids `earlier` then `later` fit this entry's globs and orders."""
        if fnmatchcase(earlier, self.first) and fnmatchcase(later, self.second):
            return True
        return (
            self.orders == "both"
            and fnmatchcase(earlier, self.second)
            and fnmatchcase(later, self.first)
        )

    def matches(self, record: TrialRecord) -> bool:
        """Whether this entry accepts `record` (the rules are in the module docstring)."""
        if record.outcome is not self.outcome:
            return False
        if self.op is not None and (record.op is None or not fnmatchcase(record.op, self.op)):
            return False
        if self.flags and any(step.flags not in self.flags for step in record.sequence):
            return False
        libs = [step.lib for step in record.sequence]
        return any(
            self.covers_pair(libs[i], libs[j])
            for i in range(len(libs))
            for j in range(i + 1, len(libs))
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "first": self.first,
            "second": self.second,
            "orders": self.orders,
            "flags": [mode.value for mode in self.flags],
            "outcome": self.outcome.value,
            "op": self.op,
            "why": self.why,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Expectation:
        """The entry `to_json` gave (a summary's "expectations" keeps every entry this way)."""
        return cls(first=data["first"], second=data["second"], orders=data["orders"],
                   flags=tuple(Flags(mode) for mode in data["flags"]),
                   outcome=Outcome(data["outcome"]), op=data["op"], why=data["why"],
                   source=data["source"])


def load_expectations(path: Path) -> tuple[Expectation, ...]:
    """Read and check an expectations file; any problem is one UsageError line naming it."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM, as some editors write, is no key
    except FileNotFoundError:
        raise UsageError(f"{path}: no such expectations file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the expectations file: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # (tomllib reads nested arrays and tables recursively)
        raise UsageError(f"{path}: not valid TOML: nested too deeply") from None
    unknown = sorted(set(data) - {"expected"})
    if unknown:
        raise UsageError(
            f"{path}: unknown top-level key {unknown[0]!r} (the file holds [[expected]] entries)"
        )
    entries = data.get("expected", [])
    if not isinstance(entries, list):
        raise UsageError(f"{path}: 'expected' must be an array of tables ([[expected]])")
    return tuple(_entry(path, number, entry) for number, entry in enumerate(entries, start=1))


def _entry(path: Path, number: int, entry: Any) -> Expectation:
    where = f"{path}: entry {number}"
    if not isinstance(entry, Mapping):
        raise UsageError(f"{where}: must be a table ([[expected]])")
    unknown = sorted(set(entry) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        allowed = ", ".join(REQUIRED_KEYS + OPTIONAL_KEYS)
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (allowed: {allowed})")
    missing = [key for key in REQUIRED_KEYS if key not in entry]
    if missing:
        raise UsageError(f"{where}: missing required key {missing[0]!r}")
    for key in (*REQUIRED_KEYS, "orders", "op"):
        if key in entry and not (isinstance(entry[key], str) and entry[key].strip()):
            raise UsageError(f"{where}: {key!r} must be a non-empty string")

    orders = entry.get("orders", "both")
    if orders not in ORDERS:
        raise UsageError(f"{where}: orders {orders!r} is not one of: {', '.join(ORDERS)}")
    flags = entry.get("flags", [])
    if not isinstance(flags, list) or not all(isinstance(mode, str) for mode in flags):
        raise UsageError(f"{where}: 'flags' must be a list of modes, e.g. [\"global\", \"local\"]")
    known = {mode.value: mode for mode in Flags}
    if unknown_mode := next((mode for mode in flags if mode not in known), None):
        raise UsageError(f"{where}: unknown flags mode {unknown_mode!r} (expected "
                         f"{', '.join(known)}, one per item)")
    modes = tuple(dict.fromkeys(known[mode] for mode in flags))
    try:
        outcome = Outcome(entry["outcome"])
    except ValueError:
        names = ", ".join(o.value for o in Outcome if o is not Outcome.CLEAN)
        raise UsageError(
            f"{where}: outcome {entry['outcome']!r} is not one of: {names}"
        ) from None
    if outcome is Outcome.CLEAN:
        raise UsageError(f"{where}: outcome 'clean' cannot be expected (only findings are)")
    return Expectation(
        first=entry["first"],
        second=entry["second"],
        orders=orders,
        flags=modes,
        outcome=outcome,
        op=entry.get("op"),
        why=" ".join(entry["why"].split()),
        source=f"{path.name}:entry {number}",
    )


def match_expectations(
    findings: Iterable[TrialRecord], expectations: Iterable[Expectation]
) -> tuple[list[tuple[TrialRecord, Expectation]], list[TrialRecord], list[Expectation]]:
    """Split findings into (expected with the first entry that matched, unexpected, stale entries).

    Clean records are not findings and are skipped. An entry is stale when it
    matches none of the findings given (an entry that matches a finding an
    earlier entry took is not stale), so a caller classifying one shard of a
    campaign sees entries stale that another shard's findings would match.
    """
    entries = tuple(expectations)
    expected: list[tuple[TrialRecord, Expectation]] = []
    unexpected: list[TrialRecord] = []
    used: set[Expectation] = set()
    for record in findings:
        if record.clean:
            continue
        matching = [entry for entry in entries if entry.matches(record)]
        if matching:
            expected.append((record, matching[0]))
            used.update(matching)
        else:
            unexpected.append(record)
    stale = [entry for entry in entries if entry not in used]
    return expected, unexpected, stale


def names_nothing(entry: Mapping[str, Any], ids: Iterable[str]) -> str:
    """For a stale entry (as `Expectation.to_json` gives it) whose `first` or `second` glob fits
    no library id of the campaign (`ids`): a note that says so (a typo, or a library the
    campaign left out, where a stale entry otherwise means the collision went away); else ""."""
    ids = list(ids)
    empty = [key for key in ("first", "second")
             if not any(fnmatchcase(lib, entry.get(key, "")) for lib in ids)]
    if not empty:
        return ""
    globs = " and ".join(f'{key} = "{entry.get(key, "")}"' for key in empty)
    return f"its {globs} {'name' if len(empty) > 1 else 'names'} no library of this campaign"


def sort_findings(findings: Iterable[TrialRecord], expectations: Iterable[Expectation],
                  ) -> tuple[list[tuple[TrialRecord, Expectation]], list[TrialRecord],
                             list[Expectation], list[TrialRecord]]:
    """(expected, unexpected, stale, environment): `match_expectations` of the findings that
    count, after the problems of the environment (a missing Python module: a signature marked
    `environment`), which never count, were set apart; the one rule for every command and the
    pytest plugin."""
    from loadfuzz.classify import environment_signatures

    environmental = environment_signatures()
    findings = [r for r in findings if not r.clean]
    environment = [r for r in findings if r.signature in environmental]
    counted = [r for r in findings if r.signature not in environmental]
    return (*match_expectations(counted, expectations), environment)
