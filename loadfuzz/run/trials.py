"""Trials: one sequence end to end: execute it, classify it, confirm it, and make its record.

`Trials` is what every command uses to run sequences. By default each trial
is forked from a fork server (see `pool` and `tiers`) that has preloaded what
is not under test; every finding is then confirmed in a cold, fresh process
before it is believed, and a disagreement between the two is kept, never
hidden. With `cold=True` every trial is a fresh process. A trial whose first
step is Python forks from a server whose interpreter is already started
(see `warm`).

`schedule.run_all` runs a work list on `jobs` threads. Sequences that share a route
(`tiers.Route`: a server, their first step, a stand-in after it; a matrix
row) go together, as one batch: a row server takes that step once and each
trial of the row forks from it.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
import threading
import time
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from loadfuzz import hostenv
from loadfuzz.classify import Signature, classify, load_catalogue
from loadfuzz.model import Evidence, Flags, Key, Sequence, Step, StepKind, TrialRecord, Verdict, sequence_key
from loadfuzz.run import pycode
from loadfuzz.run.harness import Harness, HarnessDied, HarnessStep, Limits
from loadfuzz.run.ldtrace import LoaderTrace
from loadfuzz.run.pool import Preload, ServerPool, Usage
from loadfuzz.run.schedule import MIN_ROW, Batch
from loadfuzz.run.tiers import NO_TIERS, Route, Tiers
from loadfuzz.run.warm import WarmPython

if TYPE_CHECKING:
    from loadfuzz.explain import Explainer


def loadfuzz_command() -> list[str]:
    """How to call loadfuzz again from a shell: the console script beside this interpreter."""
    script = Path(sys.executable).parent / "loadfuzz"
    return [str(script)] if script.exists() else [sys.executable, "-m", "loadfuzz"]


def repro_command(seq: Sequence, limits: Limits, loadfuzz: Sequence[str] = ()) -> str:
    """One shell command that reruns exactly this trial, cold (`loadfuzz`: how to call
    loadfuzz, when the caller knows it already; else `loadfuzz_command()`)."""
    words = [*(loadfuzz or loadfuzz_command()), "run", "--cold", "--timeout", f"{limits.timeout_s:g}"]
    if limits.mem_mb != DEFAULT_LIMITS.mem_mb:
        words += ["--mem", str(limits.mem_mb)]
    if limits.at_exit:
        words.append("--at-exit")
    words += [step.spelling() for step in seq]
    return " ".join(shlex.quote(word) for word in words)


def harness_step(step: Step, tiers: Tiers) -> HarnessStep:
    """One step as the harness takes it: a dlopen, or Python source (see `pycode`)."""
    if step.kind is StepKind.DLOPEN and step.flags is not Flags.PYTHON:
        return HarnessStep("g" if step.flags is Flags.GLOBAL else "l", step.path)
    code = pycode.source(step, tiers.reaches_torch(step), hostenv.python_paths())
    return HarnessStep("y", step.path, code)


def is_python(step: Step) -> bool:
    return step.kind is not StepKind.DLOPEN or step.flags is Flags.PYTHON


def harness_steps(seq: Sequence, tiers: Tiers, python: bool = False,
                  ) -> tuple[list[HarnessStep], int]:
    """The harness's steps for a sequence, and how many of them are prerequisites.

    A sequence with a Python step, or with a library whose undefined Python
    symbols only libpython defines, gets libpython loaded first, RTLD_GLOBAL,
    as a Python process has it; so does one run with `python` (one that
    `Tiers.python_inert` allows, joining a row whose trials need it).
    """
    steps = [harness_step(s, tiers) for s in seq]
    wants_python = python or tiers.needs_python(seq) or any(is_python(s) for s in seq)
    libpython = tiers.libpython if wants_python else None
    if libpython is None:
        return steps, 0
    return [HarnessStep("g", libpython), *steps], 1


def make_record(seq: Sequence, verdict: Verdict, duration_s: float, peak_rss_mb: float,
                limits: Limits, via: str, loadfuzz: Sequence[str] = (),
                printed: str = "") -> TrialRecord:
    return TrialRecord(
        sequence=seq, outcome=verdict.outcome, step=verdict.step, signature=verdict.signature,
        op=verdict.op, signal=verdict.signal, exit_code=verdict.exit_code, detail=verdict.detail,
        duration_s=duration_s, peak_rss_mb=peak_rss_mb, repro=repro_command(seq, limits, loadfuzz),
        via=via, printed=printed)


def same_verdict(a: TrialRecord, b: TrialRecord) -> bool:
    return (a.outcome, a.step, a.signature, a.op) == (b.outcome, b.step, b.signature, b.op)


@dataclass(frozen=True)
class Disagreement:
    fast: TrialRecord
    cold: TrialRecord

    def to_json(self) -> dict:
        return {"fast": self.fast.to_json(), "cold": self.cold.to_json()}


DEFAULT_LIMITS = Limits()
STEP_NUMBER = re.compile(r"^step \d+ of the prefix")


class Trials:
    """Runs sequences and returns their records; safe to call from several threads."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS, tiers: Tiers = NO_TIERS, cold: bool = False,
                 confirm: bool = True, explainer: Explainer | None = None,
                 pool: ServerPool | None = None, keep_printed: bool = False):
        """`tiers`: what each sequence needs (libpython first?) and which server it forks from.
        `confirm` False: a finding of a fork server is returned as it is (via "fork-server"),
        for a search that confirms only the findings it reports (`confirm`).
        `explainer`: gives each finding its cause, from a cold run the loader reports on.
        `pool`: the fork servers (default: a new pool), closed with this runner.
        `keep_printed`: each record keeps what its trial printed (`printed`), for `repro`."""
        self.limits = limits
        self.explainer = explainer
        self.tiers = tiers
        self.cold = cold
        self.confirm_each = confirm
        self.keep_printed = keep_printed
        self.catalogue: tuple[Signature, ...] = load_catalogue()
        self.loadfuzz = loadfuzz_command()  # for every record's repro command (a stat: once)
        self.disagreements: list[Disagreement] = []
        self.pool = pool or ServerPool()
        torch_lib = hostenv.torch_lib_dir()
        torch_root = torch_lib.parent if torch_lib is not None else None
        self.warm = WarmPython(tiers.libpython, torch_root is not None and any(
            path.is_relative_to(torch_root) for path in tiers.tiers))
        self.joined: set[Key] = set()  # sequences run with libpython first though inert to it
        self._lock = threading.Lock()

    @property
    def usage(self) -> Usage:
        return self.pool.usage

    @property
    def preload(self) -> tuple[HarnessStep, ...]:
        """Everything some fork server of this runner preloaded, in first-seen order."""
        return self.pool.preloaded

    @property
    def closed(self) -> bool:
        return self.pool.closed

    def __enter__(self) -> Trials:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every server, ending the trials they run; no trial starts after this."""
        self.pool.close()

    def _record(self, seq: Sequence, via: str, server: Harness | None,
                observe: TrialRecord | None = None) -> TrialRecord:
        """One trial: from `server`, else in a fresh harness; `observe` (how an earlier run of it
        ended): the loader reports on the run, and a finding gets its cause from that report."""
        steps, prelude = self._steps(seq, server is not None)
        trace: LoaderTrace | None = None
        if server is not None:
            evidence = server.run(steps, self.limits, prelude)
        else:
            with self.pool.cold(observe is not None) as harness:
                evidence = harness.run(steps, self.limits, prelude)
                if observe is not None and self.explainer is not None:
                    trace = harness.trace(*self.explainer.watch(observe))
        record = self._as_record(seq, evidence, via)
        if observe is not None and self.explainer is not None and not record.clean:
            record = self.explainer.explain(record, trace)
        return record

    def _steps(self, seq: Sequence, forked: bool) -> tuple[list[HarnessStep], int]:
        """A trial's harness steps and prerequisites (`forked`: from a server, where it may
        join a row with libpython first); refused once the runner is closed."""
        if self.closed:
            raise RuntimeError("the runner is closed: no more trials start")
        return harness_steps(seq, self.tiers, forked and self.joins(seq))

    def repro(self, seq: Sequence) -> str:
        """The command that reruns this sequence cold, as its record would say."""
        return repro_command(seq, self.limits, self.loadfuzz)

    def _as_record(self, seq: Sequence, evidence: Evidence, via: str) -> TrialRecord:
        """The record of a trial that left this evidence: classified, with its repro command."""
        verdict = classify(evidence, self.catalogue)
        printed = (f"{evidence.error}\n{evidence.output.decode('utf-8', 'replace')}"
                   if self.keep_printed else "")
        return make_record(seq, verdict, evidence.duration_s, evidence.peak_rss_mb, self.limits,
                           via, self.loadfuzz, printed)

    def run_cold(self, seq: Sequence) -> TrialRecord:
        """One trial in a fresh process; a finding is explained by a second run that the loader
        reports on (reporting slows the loader down, so it does not decide the verdict)."""
        record = self._record(seq, "cold", None)
        if record.clean or self.explainer is None:
            return record
        observed = self._observed(seq, record)
        if observed is not None and same_verdict(observed, record):
            return observed
        return self.explainer.explain(record, None)

    def _observed(self, seq: Sequence, expected: TrialRecord) -> TrialRecord | None:
        """A cold run that the loader reports on, explained from that report; None when its
        harness died (the report is a file of megabytes: a file size limit can kill it)."""
        try:
            return self._record(seq, "cold", None, observe=expected)
        except HarnessDied:
            return None

    def _fast(self, seq: Sequence, via: str, server: Harness) -> TrialRecord | None:
        """The trial from `server`, or None when the server (not the trial) failed."""
        try:
            return self._record(seq, via, server)
        except HarnessDied:
            return None

    def _in_time(self, fast: TrialRecord, spared_s: float) -> TrialRecord:
        """A clean fast trial, unless it came so close to its time limit that the time its
        server spared it (a preload, a row's first step: the cold run spends it in its steps)
        could have taken it past: then its cold run decides."""
        if fast.clean and fast.duration_s + spared_s >= self.limits.timeout_s:
            return self.run_cold(fast.sequence)
        return fast

    def _cold_for(self, seq: Sequence, fast: TrialRecord) -> TrialRecord:
        """The cold run that confirms a fast finding (or not), explained. The loader reports on
        it; should that run end otherwise, a plain cold run decides."""
        if self.explainer is None:
            return self.run_cold(seq)
        observed = self._observed(seq, fast)
        if observed is not None and same_verdict(observed, fast):
            return observed
        plain = self._record(seq, "cold", None)
        if observed is not None and same_verdict(plain, observed):
            return observed
        return plain if plain.clean else self.explainer.explain(plain, None)

    def confirm(self, fast: TrialRecord) -> TrialRecord:
        """A clean fast trial stands; a finding is believed only once a cold run agrees: the
        cold record, with what the fast one said when they disagree (kept in `disagreements`)."""
        if fast.clean or fast.via == "cold" or "confirmed cold" in fast.via:
            return fast
        cold = self._cold_for(fast.sequence, fast)
        if not same_verdict(fast, cold):
            with self._lock:
                self.disagreements.append(Disagreement(fast, cold))
            return replace(cold, detail=f"{cold.detail} [{fast.via} said: {fast.outcome.value}"
                                        f" {fast.signature or ''} {fast.detail}]".strip())
        return replace(cold, via=f"{fast.via}, confirmed cold")

    def _confirm(self, fast: TrialRecord) -> TrialRecord:
        return self.confirm(fast) if self.confirm_each else fast

    def route_of(self, seq: Sequence) -> Route:
        """Where a trial forks from (`tiers.Route`: its tier's server, maybe with a stand-in),
        the interpreter started there (and torch imported) when its first step is Python (see
        `warm`; stand-ins never precede a Python step). Its tier's server is the way back.
        Under a memory ceiling of the user's own, a server that preloads nothing."""
        python = self.joins(seq)
        steps, prelude = harness_steps(seq, self.tiers, python)
        if self.limits.mem_mb != DEFAULT_LIMITS.mem_mb:
            # a server preloads outside the trial's ceiling (RLIMIT_AS is set in the trial):
            # under a ceiling of the user's own, what the cold run maps counts against it, so
            # nothing is preloaded, and a row server takes its prefix under the ceiling
            return Route((), tuple(steps[:prelude + 1]))
        route = self.tiers.route(seq, steps, prelude, python)
        heavy = any(self.tiers.reaches_torch(s) for s in seq if s.kind is not StepKind.MODULE)
        warm = self.warm.preload(route.preload, steps, prelude, heavy, self._probe)
        return route if warm == route.preload else replace(route, preload=warm)

    def _probe(self, preload: Preload, step: HarnessStep) -> bytes:
        """The output of one step run in a server with this preload (nothing when none runs)."""
        server = self.pool.take(preload)
        if server is None:
            return b""
        try:
            evidence = server.run([step], self.limits)
        except HarnessDied:
            return b""
        self.pool.give_back(preload, server)
        return evidence.output

    def run(self, seq: Sequence) -> TrialRecord:
        """One trial: from a fork server when one can run it (its route's, else its tier's),
        else cold."""
        if self.cold:
            return self.run_cold(seq)
        route = self.route_of(seq)
        for preload in dict.fromkeys((route.preload, route.tier)):
            server = self.pool.take(preload)
            if server is None:
                continue
            try:
                fast, spared_s = self._fast(seq, "fork-server", server), server.spared_s
            finally:  # back to the pool, which closes it if it died
                self.pool.give_back(preload, server)
            if fast is None:  # it died under the trial: the cold path decides
                return self.run_cold(seq)
            return self._confirm(self._in_time(fast, spared_s))
        return self.run_cold(seq)

    def row_key(self, seq: Sequence) -> Route | None:
        """What the trials that can share one row server have in common: their route (the
        fork server's preload, their first step after libpython when they need it, a
        stand-in after it). None for a sequence of one step, and when every trial is cold."""
        if self.cold or len(seq) < 2:
            return None
        return self.route_of(seq)

    def run_row(self, row: Sequence[Sequence]) -> Iterator[TrialRecord]:
        """The records of sequences of one row key (checked), in order, each forked from a row
        server that took their first step once. A prefix that cannot be shared (see
        `Harness.sharing`) or a server that dies sends the rest the usual way."""
        route = self.row_key(row[0])
        assert route is not None and all(self.row_key(seq) == route for seq in row), "one row key"
        return self._run_row(route, row)

    def _run_row(self, route: Route, row: Sequence[Sequence]) -> Iterator[TrialRecord]:
        """`run_row`, for a row whose key is known (a `Batch`'s)."""
        server = self.pool.take(route.preload)
        left = list(row)
        if server is not None:
            try:  # given back even when the caller leaves early (a stopped campaign)
                yield from self._shared_row(route, server, left)
            finally:
                self.pool.give_back(route.preload, server)
        for seq in left:
            yield self.run(seq)

    def _shared_row(self, route: Route, server: Harness, left: list[Sequence],
                    ) -> Iterator[TrialRecord]:
        """The records of the row's sequences, from a row server on `server`, each taken off
        `left` as it is done; stops early (the rest left) when the row cannot be shared."""
        with contextlib.ExitStack() as stack:
            began = time.monotonic()
            try:
                shared = stack.enter_context(server.sharing(route.prefix, self.limits,
                                                            route.hidden))
            except HarnessDied:  # the server could not start the row
                shared = False
            self._count_row(shared, server.unshared, time.monotonic() - began)
            if not shared:
                return
            row = list(left)
            results = stack.enter_context(contextlib.closing(server.run_each(
                (self._steps(seq, True) for seq in row), self.limits)))
            for seq in row:
                try:
                    evidence = next(results)
                except HarnessDied:  # the server died: the rest go the usual way
                    return
                record = self._confirm(self._in_time(self._as_record(seq, evidence, "shared prefix"),
                                                     server.spared_s))
                left.pop(0)
                yield record

    def _count_row(self, shared: bool, why: str, took_s: float) -> None:
        usage = self.pool.usage
        with self._lock:
            usage.row_start_s += took_s
            if shared:
                usage.rows_shared += 1
            else:  # (its first clause; the harness numbers the prefix's own steps from 1, with
                # libpython and a stand-in among them: no step number a user knows)
                why = STEP_NUMBER.sub("a step of the prefix", why.split(":")[0])
                usage.rows_not_shared[why] = usage.rows_not_shared.get(why, 0) + 1

    def joins(self, seq: Sequence) -> bool:
        """Whether this sequence forks with libpython loaded first though it does not need it
        (see `batches`); a cold run never has it."""
        return sequence_key(seq) in self.joined

    def batches(self, work: Iterable[Sequence]) -> list[Batch]:
        """The work in batches, in first-seen order: a row of at least MIN_ROW
        sequences with one row key (2 when its row server maps a heavy library) is
        one batch, any other sequence its own.

        A row's first step is taken once per row key, and a sequence that needs
        libpython has a key of its own. So a sequence that does not need it joins
        the row of those that do, with the same first step, when libpython would
        change nothing for it (`Tiers.python_inert`): the first step (libtorch_cpu,
        for a torch plugin) is paid once instead of twice."""
        rows: dict[object, list[Sequence]] = {}
        for position, seq in enumerate(work):
            rows.setdefault(self.row_key(seq) or position, []).append(seq)
        for key, row in list(rows.items()):
            if isinstance(key, Route) and len(key.prefix) == 1 and (
                    twin := self._python_twin(row, rows)) is not None:
                with self._lock:
                    self.joined.update(sequence_key(seq) for seq in row)
                rows[twin] += rows.pop(key)
        for key in rows:  # they start while the first batches wait for them
            if isinstance(key, Route):
                self.pool.prestart(key.preload)
        return [batch for key, row in rows.items() for batch in (
            [Batch(tuple(row), key)] if len(row) >= self.min_row(key) and isinstance(key, Route)
            else [Batch((seq,)) for seq in row])]

    def _python_twin(self, row: list[Sequence], keys: Container[object]) -> Route | None:
        """The row key these sequences would have with libpython first, when it is one key, one
        of `keys` (a row that is there), and libpython is inert to every one of them. Asks
        sequence by sequence, and stops at the first that says no."""
        twin: Route | None = None
        for seq in row:
            if not self.tiers.python_inert(seq):
                return None
            steps, prelude = harness_steps(seq, self.tiers, True)
            key = self.tiers.route(seq, steps, prelude, True)
            if key not in keys or twin not in (None, key):
                return None
            twin = key
        return twin

    @staticmethod
    def min_row(key: object) -> int:
        return 2 if isinstance(key, Route) and key.costly else MIN_ROW

    def run_batch(self, batch: Batch) -> Iterator[TrialRecord]:
        if batch.route is None:
            yield self.run(batch[0])
        else:
            yield from self._run_row(batch.route, batch.sequences)
