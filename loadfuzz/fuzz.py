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

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings, target
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from loadfuzz import cli, plan, predict
from loadfuzz.campaign import (
    Campaign,
    Progress,
    ResultsFolder,
    RunOnce,
    default_out,
    exit_status,
    run_work,
    sequence_key,
    summarize,
    utc_now,
    write_results,
)
from loadfuzz.inventory import Inventory, Library
from loadfuzz.model import Flags, Role, Step, StepKind, TrialRecord, UsageError
from loadfuzz.model import Sequence as Steps

ROUND_EXAMPLES = 150  # examples per Hypothesis round; the budget is checked between rounds


def step_options(libs: Sequence[Library], flags: Sequence[Flags]) -> list[Step]:
    """Every way to load one library, simplest first: earlier library, `local`, `global`, `py:`."""
    order = [mode for mode in (Flags.LOCAL, Flags.GLOBAL) if mode in flags]
    options = []
    for lib in libs:
        options += [Step(StepKind.DLOPEN, lib.id, mode, lib.path) for mode in order]
        if lib.role is Role.PYTHON_EXTENSION:
            options.append(Step(StepKind.IMPORT, lib.id, Flags.LOCAL, lib.path))
    return options


def sequences(options: Sequence[Step], first: Sequence[Step], max_len: int) -> st.SearchStrategy:
    """Sequences of 1..max_len steps whose first step is one of `first` (this shard's)."""
    return st.builds(lambda head, tail: (head, *tail), st.sampled_from(first),
                     st.lists(st.sampled_from(options), max_size=max_len - 1))


def simplicity(seq: Steps, options: Sequence[Step]) -> tuple:
    """Shortlex order: fewer steps first, then earlier options (earlier library, local)."""
    return (len(seq), [options.index(s) if s in options else len(options) for s in seq])


@dataclass(frozen=True)
class Identity:
    """What makes two failures the same failure."""

    outcome: str
    signature: str | None
    op: str | None
    libraries: frozenset[str]

    @classmethod
    def of(cls, record: TrialRecord) -> Identity:
        libs = frozenset(s.lib for s in record.sequence[:(record.step or 0) + 1])
        return cls(record.outcome.value, record.signature, record.op, libs)

    def rough(self, record: TrialRecord) -> tuple:
        """Before shrinking, the set is not known yet: the failing step's library stands in."""
        return (self.outcome, self.signature, self.op, record.sequence[record.step or 0].lib)


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
                     max_len: int) -> None:
        """One Hypothesis run of ROUND_EXAMPLES examples; every failure it shrank is kept."""

        @seed(base_seed + number)
        @settings(max_examples=ROUND_EXAMPLES, deadline=None, database=None,
                  phases=(Phase.generate, Phase.target, Phase.shrink),
                  report_multiple_bugs=True, suppress_health_check=list(HealthCheck),
                  print_blob=False)
        @given(sequences(self.options, first, max_len))
        def explore(seq: Steps) -> None:
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


def simplify(record: TrialRecord, run: Callable[[Steps], TrialRecord],
             options: Sequence[Step]) -> TrialRecord:
    """Greedy shrink to a fixpoint, keeping (outcome, signature, op): cut the steps after the
    failing one, drop steps, move to earlier options (earlier library, `local` before
    `global`). Hypothesis has shrunk search findings already; this normalises the others."""

    def same(candidate: TrialRecord) -> bool:
        return (candidate.outcome, candidate.signature, candidate.op) == (
            record.outcome, record.signature, record.op)

    best = record
    if best.step is not None and best.step + 1 < len(best.sequence):
        cut = run(best.sequence[:best.step + 1])
        best = cut if same(cut) else best
    improved = True
    while improved:
        improved = False
        seq = best.sequence
        candidates = [seq[:i] + seq[i + 1:] for i in range(len(seq)) if len(seq) > 1]
        for i, current in enumerate(seq):
            simpler = [o for o in options[:options.index(current)]
                       if o.lib == current.lib] if current in options else []
            candidates += [(*seq[:i], o, *seq[i + 1:]) for o in simpler]
        for candidate in candidates:
            tried = run(candidate)
            if same(tried):
                best, improved = tried, True
                break
    return best


# --- the example database: minimal sequences by target -------------------------------


def database_key(inv: Inventory) -> bytes:
    return f"loadfuzz-fuzz:{inv.name}".encode()


def replayable(inv: Inventory, db: DirectoryBasedExampleDatabase) -> list[Steps]:
    """Known minimal sequences of this target whose libraries are all still in it."""
    ids = {lib.id: lib for lib in inv.libraries}
    found = []
    for value in sorted(db.fetch(database_key(inv))):
        try:
            steps = json.loads(value.decode())
            seq = tuple(Step(StepKind(s["kind"]), s["lib"], Flags(s["flags"]), ids[s["lib"]].path)
                        for s in steps)
        except (ValueError, KeyError, TypeError):
            continue  # written by another version, or a library that is gone
        found.append(seq)
    return found


def remember(inv: Inventory, db: DirectoryBasedExampleDatabase, record: TrialRecord) -> None:
    value = json.dumps([s.to_json() for s in record.sequence], sort_keys=True).encode()
    db.save(database_key(inv), value)


# --- the command ---------------------------------------------------------------------


def command(args: argparse.Namespace) -> int:
    budget_end = time.monotonic() + args.budget
    inv = cli.load_inventory(args)
    libs = inv.select(args.select)
    expectations = cli.expectations_of(args)
    base_seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    out = args.out or default_out(inv.name, inv.version)
    folder = ResultsFolder(out, False, inv.locate)
    db = DirectoryBasedExampleDatabase(db_folder(args.db))
    options = step_options(libs, args.flags)
    first_libs = {lib.id for lib in args.shard.take(list(libs))}  # this shard's first steps
    first = [o for o in options if o.lib in first_libs]
    campaign = Campaign("fuzz", inv.target, inv.name, inv.version, tuple(lib.id for lib in libs),
                        args.flags, expectations, out,
                        shard=None if args.shard == plan.WHOLE else str(args.shard))
    started, clock = utc_now(), time.monotonic()
    folder.open()
    rounds = 0
    try:
        with cli.trials_for(inv, libs, args) as trials:
            progress = Progress(0, "fuzz")
            fuzzer = Fuzzer(inv, RunOnce(trials, folder, progress), options)
            runs = fuzzer.run.runs
            in_shard = [seq for seq in replayable(inv, db) if seq[0].lib in first_libs]
            predicted = [p.sequence for p in predict.predict(inv, libs, args.flags)
                         if p.sequence[0].lib in first_libs]
            for phase, work in (("replay", in_shard), ("predicted", predicted)):
                work = [seq for seq in work if sequence_key(seq) not in runs]
                records = run_work(work, trials, folder, args.jobs, progress)
                runs.update((record.key(), record) for record in records)
                for record in records:
                    if not record.clean:
                        fuzzer.keep(record, phase)
            while time.monotonic() < budget_end and first:
                fuzzer.search_round(rounds, base_seed, first, args.max_len)
                rounds += 1
            progress.finish()
            findings = sorted(fuzzer.found.values(), key=lambda r: simplicity(r.sequence, options))
            for record in findings:
                remember(inv, db, record)
            elapsed = time.monotonic() - clock
            campaign.extra.update(
                seed=base_seed, rounds=rounds, max_len=args.max_len, db=str(args.db),
                found=[{"sequence": [s.to_json() for s in r.sequence],
                        "phase": fuzzer.origins[Identity.of(r)][0],
                        "after_s": fuzzer.origins[Identity.of(r)][1]} for r in findings])
            summary = summarize(campaign, runs.values(), findings, trials, started,
                                elapsed)
    except KeyboardInterrupt:
        print(f"interrupted: the trials run so far are in {folder.trials_path}", file=sys.stderr)
        return 130
    finally:
        folder.close()
    write_results(folder, summary, list(runs.values()), per="finding")
    cli.print_summary(summary, args.json)
    return exit_status(summary)


def db_folder(path: Path) -> Path:
    """The --db folder; an existing file there is bad input."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"--db {path}: not a folder")
    return path

