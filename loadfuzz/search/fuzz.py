"""Fuzz: explore load orders with Hypothesis and keep every distinct failure, each shrunk.

A campaign has three phases, all within one wall-clock `--budget`:

1. **replay**: the minimal sequences earlier campaigns found, kept in the
   example database (`--db`, a Hypothesis `DirectoryBasedExampleDatabase`,
   one key per target), are run first: last night's findings are re-checked
   in the first seconds.
2. **predicted**: the ordered pairs `scan` predicts to collide are run next
   (guidance: what the ELF files say is tried early).
3. **search**: Hypothesis rounds (`rounds`) on every core (`workers`): `--jobs`
   processes, each exploring the sequences that start with its slice of the
   first steps, with its own fork servers, until the budget is spent.

Every failure is then normalised by `simplify` (drop steps, then load each
library the simplest way that still fails: `local` before `global`) once, in
the campaign's own process, and deduplicated on its identity: (outcome,
signature, operator, the set of libraries in its minimal sequence). Only the
findings so made are confirmed cold before they are reported; the failing
trials on the way are kept as their fork server saw them (`via`
"fork-server").
"""

from __future__ import annotations

import collections
import json
import random
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis.database import DirectoryBasedExampleDatabase

from loadfuzz import plan, predict
from loadfuzz.campaign import Prepared, Watcher, run_work, summarize, write_partial
from loadfuzz.inventory import Inventory
from loadfuzz.model import Flags, Key, Step, StepKind, TrialRecord, normal_id
from loadfuzz.model import Sequence as Steps
from loadfuzz.results import usable, utc_now
from loadfuzz.run.trials import Trials, is_python
from loadfuzz.search import workers
from loadfuzz.search.once import RunOnce
from loadfuzz.search.shrink import Identity, simplicity, simplify


@dataclass
class Findings:
    """The campaign's distinct failures, each simplified once (mutable, owned by `run_fuzz`)."""

    run: RunOnce  # every trial of the campaign's own process goes through it
    options: list[Step]
    until: float  # past this (`shrink_until`), simplifying tries only what ran already
    found: dict[Identity, TrialRecord] = field(default_factory=dict)
    origins: dict[Identity, tuple[str, float]] = field(default_factory=dict)
    confirmed: dict[Key, TrialRecord] = field(default_factory=dict)  # a finding's cold run
    started: float = field(default_factory=time.monotonic)

    def keep(self, record: TrialRecord, phase: str) -> None:
        """Simplify a failing record and keep it unless its identity is already known."""
        if self.known(record):
            return  # its failure is kept already, simplified
        minimal = simplify(record, self.run_in_budget, self.options)
        identity = Identity.of(minimal)
        best = self.found.get(identity)
        if best is None or simplicity(minimal.sequence, self.options) < simplicity(
                best.sequence, self.options):
            self.found[identity] = minimal
        self.origins.setdefault(identity, (phase, round(time.monotonic() - self.started, 2)))

    def run_in_budget(self, seq: Steps) -> TrialRecord | None:
        """The sequence's record; past `until`, only one that ran already (else None)."""
        if time.monotonic() >= self.until and not self.run.knows(seq):
            return None
        return self.run(seq)

    def known(self, record: TrialRecord) -> bool:
        """Whether this failure, as it stands, is one already kept simplified."""
        return Identity.of(record) in self.found

    def unconfirmed(self) -> list[TrialRecord]:
        """The findings not confirmed cold yet, simplest first."""
        return sorted((record for record in self.found.values()
                       if record.key() not in self.confirmed),
                      key=lambda record: simplicity(record.sequence, self.options))

    def confirm(self, record: TrialRecord) -> TrialRecord:
        """The cold confirmation of a finding (`Trials.confirm`), run once."""
        if record.key() not in self.confirmed:
            self.confirmed[record.key()] = self.run.trials.confirm(record)
        return self.confirmed[record.key()]


# --- the example database: minimal sequences by target -------------------------------


def database_key(inv: Inventory) -> bytes:
    """Where a target's findings are kept: under its name. Several targets: their names
    without versions, in any order (`torch+executorch`), so that an upgrade of one, or
    naming them in another order, still replays what earlier nights found."""
    if not inv.labels or inv.name == "env":
        return f"loadfuzz-fuzz:{inv.name}".encode()
    names = sorted(normal_id(f"{label}/").rstrip("/") for label in inv.labels)
    return f"loadfuzz-fuzz:{'+'.join(names)}".encode()


def replayable(inv: Inventory, db: DirectoryBasedExampleDatabase) -> tuple[list[Steps], int]:
    """Known minimal sequences of this target whose libraries are all still in it (several
    targets: by ids without their versions), and how many entries could not be read at all
    (garbage in the database: ignored, but said). Entries kept under the versioned key of
    earlier loadfuzz releases (`torch-2.13.0+cpu+executorch-1.5.1`) are read too."""
    normal = collections.Counter(normal_id(lib.id) for lib in inv.libraries)
    ids = {normal_id(lib.id): lib for lib in inv.libraries if normal[normal_id(lib.id)] == 1}
    ids |= {lib.id: lib for lib in inv.libraries}  # (two releases of one target: by id only)
    found, unreadable = [], 0
    try:
        values = sorted(set().union(*(db.fetch(key) for key in dict.fromkeys(
            (database_key(inv), f"loadfuzz-fuzz:{inv.name}".encode())))))
    except OSError:
        return [], 1
    for value in values:
        try:
            steps = json.loads(value.decode())
            seq = tuple(Step(StepKind(s["kind"]), lib.id, Flags(s["flags"]), lib.path)
                        for s in steps for lib in [ids.get(s["lib"]) or ids[normal_id(s["lib"])]])
        except KeyError:
            continue  # a library that is gone from the target
        except (ValueError, TypeError, AttributeError, RecursionError):
            unreadable += 1  # not written by loadfuzz, or by a version that spelled steps otherwise
            continue
        found.append(seq)
    return found, unreadable


def remember(inv: Inventory, db: DirectoryBasedExampleDatabase,
             records: Sequence[TrialRecord]) -> int:
    """Save the findings' sequences; how many cannot be read back (Hypothesis drops a save it
    cannot make without a word)."""
    values = [json.dumps([s.to_json() for s in record.sequence], sort_keys=True).encode()
              for record in records]
    key = database_key(inv)
    for value in values:
        db.save(key, value)
    kept = set(db.fetch(key)) if values else set()
    for value in [value for value in values if value not in kept]:
        # a file of its name whose content was cut short (a kill mid-write, a partial cache
        # restore): Hypothesis never writes over one, so it is removed and written again
        db.delete(key, value)
        db.save(key, value)
        kept |= set(db.fetch(key))
    return sum(value not in kept for value in values)


# --- the campaign --------------------------------------------------------------------


# Past the budget, a failure is still simplified with new trials for this long (the greater
# of the two): one found in the last round is as minimal as one found early, and one defect
# is one finding, not several unshrunk ones (nor, the next night, "new" and "gone" again).
SHRINK_GRACE_S = 30.0
SHRINK_GRACE_SHARE = 0.1


def shrink_until(budget_end: float, budget_s: float) -> float:
    """When simplifying stops trying sequences that did not run yet."""
    return budget_end + max(SHRINK_GRACE_S, SHRINK_GRACE_SHARE * budget_s)


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
    warnings: list[str] = []
    search = workers.Report()
    try:
        # Findings are confirmed cold once simplified, not every failing trial on the way. The
        # runner is made before the folder is taken (see `campaign.run_matrix`).
        with campaign.trials(confirm=False) as trials:
            campaign.folder.open()
            findings = Findings(RunOnce(trials, campaign.folder, watcher), step_choices,
                                shrink_until(budget_end, options.budget_s))
            runs = findings.run.runs
            try:
                explore(findings, campaign, options, db, base_seed, budget_end, warnings, search)
                if not search.searched:  # a green run that searched nothing must say so
                    warnings.append(f"the search ran no trial before its budget "
                                    f"({options.budget_s:g} s) ended: only the replay and "
                                    f"predicted phases ran; give it a longer --budget")
                confirmed = confirm_all(findings, settings_.run.jobs)
            except BaseException:
                trials.close()
                # every trial that reached trials.jsonl, though a phase stopped before it
                # learned them; a failure not simplified yet is kept as it is
                records = list(campaign.folder.records.values())
                for record in records:
                    if not record.clean and not findings.known(record):
                        findings.found[Identity.of(record)] = record
                        findings.origins.setdefault(Identity.of(record), ("stopped", round(
                            time.monotonic() - findings.started, 2)))
                kept = sorted(findings.found.values(),
                              key=lambda record: simplicity(record.sequence, findings.options))
                kept = [explained(trials, record) for record in kept]
                remember(inv, db, kept)  # unconfirmed: the next campaign's replay confirms them
                write_partial(campaign, records, kept, trials, started,
                              time.monotonic() - clock, "finding", seed=base_seed,
                              max_len=options.max_len, db=str(options.db),
                              warnings=warnings, found=found_entries(findings, kept),
                              **search.summary(trials, findings.run.recalled))
                raise
            if lost := remember(inv, db, confirmed):
                warnings.append(f"--db {options.db}: could not save {lost} of the findings "
                                f"there; the next campaign will not replay them")
            found = found_entries(findings, confirmed)
            summary = summarize(campaign, runs.values(), confirmed, trials, started,
                                time.monotonic() - clock, seed=base_seed, max_len=options.max_len,
                                db=str(options.db), found=found, warnings=warnings,
                                **search.summary(trials, findings.run.recalled))
        records = list(runs.values())
        campaign.folder.write_reports(summary, records, per="finding")  # the folder still ours
    finally:
        watcher.close()
        campaign.folder.close()
    return summary, records


def explained(trials: Trials, record: TrialRecord) -> TrialRecord:
    """A finding as it is, or, not confirmed (a stopped campaign's), explained from the ELF
    files: every finding of a summary has its cause."""
    if record.cause is not None or trials.explainer is None:
        return record
    return trials.explainer.explain(record, None)


def found_entries(findings: Findings, records: Sequence[TrialRecord]) -> list[dict[str, Any]]:
    """The summary's `found`: each finding's sequence, the phase that found it, and when."""
    return [{"sequence": [s.to_json() for s in r.sequence],
             "phase": findings.origins[Identity.of(r)][0],
             "after_s": findings.origins[Identity.of(r)][1]} for r in records]


def confirm_all(findings: Findings, jobs: int) -> list[TrialRecord]:
    """The findings, simplest first, each confirmed cold (`jobs` at a time; those the search
    confirmed while it waited are not run again); one the cold run calls clean is no finding
    (the disagreement is kept in the summary)."""
    ordered = sorted(findings.found.items(),
                     key=lambda item: simplicity(item[1].sequence, findings.options))
    with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        colds = list(pool.map(findings.confirm, [record for _, record in ordered]))
    confirmed = []
    for (identity, _), cold in zip(ordered, colds, strict=True):
        if not cold.clean:
            findings.origins.setdefault(Identity.of(cold), findings.origins[identity])
            confirmed.append(cold)
    return confirmed


def explore(findings: Findings, campaign: Prepared, options: FuzzOptions,
            db: DirectoryBasedExampleDatabase, base_seed: int, budget_end: float,
            warnings: list[str], search: workers.Report) -> None:
    """The three phases: replay, predicted, then the search on `--jobs` processes (started
    first, so that their start-up overlaps the other phases) until the budget is spent; what
    the search did goes into `search` as it happens (a stopped campaign reports it too). Every
    failure is kept in `findings`. Sequences start with this shard's slice of the libraries."""
    inv, libs, settings_ = campaign.inv, campaign.libs, campaign.settings
    trials = findings.run.trials
    first_libs = {lib.id for lib in settings_.shard.take(list(libs))}
    first = [o for o in findings.options if o.lib in first_libs]
    known, unreadable = replayable(inv, db)
    if unreadable:
        warnings.append(f"--db {options.db}: ignored {unreadable} unreadable entr"
                        f"{'y' if unreadable == 1 else 'ies'}")
    # a known sequence replays only as this campaign may load it: its libraries selected, each
    # step in a flags mode of --flags (a finding saved under `local` is no `global` campaign's)
    allowed = set(findings.options)
    in_shard = [seq for seq in known if seq[0].lib in first_libs and allowed.issuperset(seq)]
    predicted = [p.sequence for p in predict.predict(inv, libs, settings_.flags)
                 if p.sequence[0].lib in first_libs]
    plan_ = workers.Plan(inv, libs, settings_.run, findings.options, first, options.max_len,
                         base_seed, budget_end, tuple(sys.path))
    with workers.Workers(plan_, settings_.run.jobs, findings, search) as workers_:
        workers_.probed(probe_all(trials, findings.options, settings_.run.jobs))
        for phase, work in (("replay", in_shard), ("predicted", predicted)):
            # (once each: after an upgrade the database names one sequence by both ids)
            work = list(dict.fromkeys(seq for seq in work if not findings.run.knows(seq)))
            records = run_work(work, trials, campaign.folder, settings_.run.jobs,
                               findings.run.watcher)
            for record in records:  # all of them known before any is simplified
                findings.run.learn(record)
            for record in records:
                if not record.clean:
                    findings.keep(record, phase)
                    workers_.known(record)
        workers_.listen()


def probe_all(trials: Trials, options: Sequence[Step], jobs: int) -> dict[str, bool]:
    """Ask each Python step whether it imports torch first (`run.warm`), `jobs` at a time, once
    for the campaign's process and all its workers; the answers."""
    python_first = [(step,) for step in options if is_python(step)]
    with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        list(pool.map(trials.route_of, python_first))
    return trials.warm.answers()


def db_folder(path: Path) -> Path:
    """The --db folder; a file there, or a folder that cannot be made or written in, is bad
    input (Hypothesis would lose the findings it saves there without a word)."""
    usable(path, "--db")
    return path
