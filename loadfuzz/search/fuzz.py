"""Fuzz: explore load orders with Hypothesis and keep every distinct failure, each shrunk.

A campaign has three phases, all within one wall-clock `--budget`:

1. **replay**: the minimal sequences earlier campaigns found, kept in the
   example database (`--db`, a Hypothesis `DirectoryBasedExampleDatabase`,
   one key per target), are run first: last night's findings are re-checked
   in the first seconds.
2. **predicted**: the ordered pairs `scan` predicts to collide are run next
   (guidance: what the ELF files say is tried early).
3. **search**: Hypothesis draws sequences of 1..`--max-len` steps (a library,
   and how it is loaded: `local`, `global`, or `py:` import for a Python
   extension), in rounds of a fixed number of examples until the budget is
   spent. A failure raises an exception whose *type* is made from its
   identity, so Hypothesis tells failures apart and shrinks each one on its
   own; `target()` pulls the search towards sequences the prediction calls
   dangerous, but nothing it calls safe is skipped. A failure already known
   is not raised again, so it cannot hide the next one.

Every failure is then normalised by `simplify` (drop steps, earlier
libraries, `local` before `global`) and deduplicated on its identity:
(outcome, signature, operator, the set of libraries in its minimal sequence).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings, target
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from loadfuzz import plan, predict
from loadfuzz.campaign import Prepared, RunOnce, Watcher, run_work, summarize, write_partial
from loadfuzz.inventory import Inventory
from loadfuzz.model import Flags, Step, StepKind, TrialRecord, UsageError, sequence_key
from loadfuzz.model import Sequence as Steps
from loadfuzz.results import utc_now
from loadfuzz.search.shrink import Identity, simplicity, simplify

ROUND_EXAMPLES = 150  # examples per Hypothesis round; the budget is checked between rounds


def sequences(options: Sequence[Step], first: Sequence[Step], max_len: int) -> st.SearchStrategy:
    """Sequences of 1..max_len steps whose first step is one of `first` (this shard's)."""
    return st.builds(lambda head, tail: (head, *tail), st.sampled_from(first),
                     st.lists(st.sampled_from(options), max_size=max_len - 1))


@dataclass
class Fuzzer:
    """One campaign's search state (mutable, owned by `command`)."""

    inv: Inventory
    run: RunOnce  # every trial of the campaign goes through it
    options: list[Step]
    found: dict[Identity, TrialRecord] = field(default_factory=dict)
    origins: dict[Identity, tuple[str, float]] = field(default_factory=dict)
    failure_types: dict[tuple, type] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def keep(self, record: TrialRecord, phase: str) -> None:
        """Simplify a failing record and keep it unless its identity is already known."""
        minimal = simplify(record, self.run, self.options)
        identity = Identity.of(minimal)
        best = self.found.get(identity)
        if best is None or simplicity(minimal.sequence, self.options) < simplicity(
                best.sequence, self.options):
            self.found[identity] = minimal
        self.origins.setdefault(identity, (phase, round(time.monotonic() - self.started, 2)))

    def failure_type(self, rough: tuple) -> type:
        """One exception type per rough identity: how Hypothesis tells failures apart."""
        if rough not in self.failure_types:
            self.failure_types[rough] = type(f"LoadOrderFailure{len(self.failure_types)}",
                                             (LoadOrderFailure,), {})
        return self.failure_types[rough]

    def known(self, record: TrialRecord) -> bool:
        rough = Identity.of(record).rough(record)
        return any(i.rough(r) == rough for i, r in self.found.items())

    def search_round(self, number: int, base_seed: int, first: Sequence[Step],
                     max_len: int, until: float) -> None:
        """One Hypothesis run of ROUND_EXAMPLES examples; every failure it shrank is kept.
        Past `until` (the budget's end) no new sequence runs: the round winds down at once
        (a sequence already run answers from memory, so a failure stays a failure)."""

        @seed(base_seed + number)
        @settings(max_examples=ROUND_EXAMPLES, deadline=None, database=None,
                  phases=(Phase.generate, Phase.target, Phase.shrink),
                  report_multiple_bugs=True, suppress_health_check=list(HealthCheck),
                  print_blob=False)
        @given(sequences(self.options, first, max_len))
        def explore(seq: Steps) -> None:
            if time.monotonic() >= until and not self.run.knows(seq):
                return
            danger = predict.replay(self.inv, seq)
            target(0.0 if danger.clean else 1.0, label="predicted to fail")
            record = self.run(seq)
            if not record.clean and not self.known(record):
                identity = Identity.of(record)
                raise self.failure_type(identity.rough(record))(record)

        try:
            explore()
        except LoadOrderFailure as failure:
            self.keep(failure.record, "search")
        except BaseExceptionGroup as group:
            _, rest = group.split(LoadOrderFailure)
            for failure in leaves(group):
                if isinstance(failure, LoadOrderFailure):
                    self.keep(failure.record, "search")
            if rest is not None:
                raise rest from None


class LoadOrderFailure(Exception):
    def __init__(self, record: TrialRecord):
        super().__init__(f"{record.outcome.value} {record.signature or ''} {record.op or ''}")
        self.record = record


def leaves(group: BaseExceptionGroup) -> list[BaseException]:
    found: list[BaseException] = []
    for item in group.exceptions:
        found += leaves(item) if isinstance(item, BaseExceptionGroup) else [item]
    return found


# --- the example database: minimal sequences by target -------------------------------


def database_key(inv: Inventory) -> bytes:
    return f"loadfuzz-fuzz:{inv.name}".encode()


def replayable(inv: Inventory, db: DirectoryBasedExampleDatabase) -> tuple[list[Steps], int]:
    """Known minimal sequences of this target whose libraries are all still in it, and how many
    entries could not be read at all (garbage in the database: ignored, but said)."""
    ids = {lib.id: lib for lib in inv.libraries}
    found, unreadable = [], 0
    try:
        values = sorted(db.fetch(database_key(inv)))
    except OSError:
        return [], 1
    for value in values:
        try:
            steps = json.loads(value.decode())
            seq = tuple(Step(StepKind(s["kind"]), s["lib"], Flags(s["flags"]), ids[s["lib"]].path)
                        for s in steps)
        except KeyError:
            continue  # a library that is gone from the target
        except (ValueError, TypeError, AttributeError):
            unreadable += 1  # not written by loadfuzz, or by a version that spelled steps otherwise
            continue
        found.append(seq)
    return found, unreadable


def remember(inv: Inventory, db: DirectoryBasedExampleDatabase, record: TrialRecord) -> None:
    value = json.dumps([s.to_json() for s in record.sequence], sort_keys=True).encode()
    db.save(database_key(inv), value)


# --- the campaign --------------------------------------------------------------------


@dataclass(frozen=True)
class FuzzOptions:
    """What only a fuzz campaign is asked: its budget, sequence length, seed and database."""

    budget_s: float = 600.0
    max_len: int = 4
    seed: int | None = None  # None: one drawn at random (and reported in the summary)
    db: Path = Path("results/.hypothesis")


def run_fuzz(campaign: Prepared, options: FuzzOptions, watcher: Watcher,
             ) -> tuple[dict[str, Any], list[TrialRecord]]:
    """The three phases within the budget, into the results folder; the summary and every
    record, reports written."""
    budget_end = time.monotonic() + options.budget_s
    settings_, inv, libs = campaign.settings, campaign.inv, campaign.libs
    db = DirectoryBasedExampleDatabase(db_folder(options.db))
    base_seed = options.seed if options.seed is not None else random.SystemRandom().randrange(2**32)
    step_choices = plan.step_options(libs, settings_.flags)
    started, clock = utc_now(), time.monotonic()
    campaign.folder.open()
    warnings: list[str] = []
    try:
        with campaign.trials() as trials:
            fuzzer = Fuzzer(inv, RunOnce(trials, campaign.folder, watcher), step_choices)
            runs = fuzzer.run.runs
            try:
                rounds = explore(fuzzer, campaign, options, db, base_seed, budget_end, warnings)
            except BaseException:
                trials.close()
                write_partial(campaign, list(runs.values()), list(fuzzer.found.values()), trials,
                              started, time.monotonic() - clock, "finding", seed=base_seed,
                              warnings=warnings)
                raise
            findings = sorted(fuzzer.found.values(),
                              key=lambda r: simplicity(r.sequence, step_choices))
            for record in findings:
                remember(inv, db, record)
            found = [{"sequence": [s.to_json() for s in r.sequence],
                      "phase": fuzzer.origins[Identity.of(r)][0],
                      "after_s": fuzzer.origins[Identity.of(r)][1]} for r in findings]
            summary = summarize(campaign, runs.values(), findings, trials, started,
                                time.monotonic() - clock, seed=base_seed, rounds=rounds,
                                max_len=options.max_len, db=str(options.db), found=found,
                                warnings=warnings)
    finally:
        watcher.close()
        campaign.folder.close()
    records = list(runs.values())
    campaign.folder.write_reports(summary, records, per="finding")
    return summary, records


def explore(fuzzer: Fuzzer, campaign: Prepared, options: FuzzOptions,
            db: DirectoryBasedExampleDatabase, base_seed: int, budget_end: float,
            warnings: list[str]) -> int:
    """The three phases: replay, predicted, then Hypothesis rounds until the budget is spent;
    how many rounds ran. Every failure is kept in `fuzzer`. Sequences start with this
    shard's slice of the libraries."""
    inv, libs, settings_ = campaign.inv, campaign.libs, campaign.settings
    trials, runs, rounds = fuzzer.run.trials, fuzzer.run.runs, 0
    first_libs = {lib.id for lib in settings_.shard.take(list(libs))}
    first = [o for o in fuzzer.options if o.lib in first_libs]
    known, unreadable = replayable(inv, db)
    if unreadable:
        warnings.append(f"--db {options.db}: ignored {unreadable} unreadable entr"
                        f"{'y' if unreadable == 1 else 'ies'}")
    in_shard = [seq for seq in known if seq[0].lib in first_libs]
    predicted = [p.sequence for p in predict.predict(inv, libs, settings_.flags)
                 if p.sequence[0].lib in first_libs]
    for phase, work in (("replay", in_shard), ("predicted", predicted)):
        work = [seq for seq in work if sequence_key(seq) not in runs]
        records = run_work(work, trials, campaign.folder, settings_.run.jobs, fuzzer.run.watcher)
        runs.update((record.key(), record) for record in records)
        for record in records:
            if not record.clean:
                fuzzer.keep(record, phase)
    while time.monotonic() < budget_end and first:
        fuzzer.search_round(rounds, base_seed, first, options.max_len, budget_end)
        rounds += 1
    return rounds


def db_folder(path: Path) -> Path:
    """The --db folder; an existing file there is bad input."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"--db {path}: not a folder")
    return path
