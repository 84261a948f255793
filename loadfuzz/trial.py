"""Trial: one sequence end to end: execute it, classify it, and make its record.

`Trials` is what every command uses to run sequences. By default each trial
is forked from a fork server that has preloaded what is not under test; every
finding is then confirmed in a cold, fresh process before it is believed, and
a disagreement between the two is kept, never hidden. With `cold=True` every
trial is a fresh process.

`run_all` runs a work list on `jobs` threads. Sequences that share a server
and their first step (a matrix row) go together, as one batch: a row server
takes that step once and each trial of the row forks from it.
"""

from __future__ import annotations

import contextlib
import queue
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path

from loadfuzz import hostenv
from loadfuzz.classify import Signature, classify, load_catalogue
from loadfuzz.execute import Harness, HarnessDied, HarnessStep, Limits, run_cold
from loadfuzz.model import Sequence, StepKind, TrialRecord, Verdict


def loadfuzz_command() -> list[str]:
    """How to call loadfuzz again from a shell: the console script beside this interpreter."""
    script = Path(sys.executable).parent / "loadfuzz"
    return [str(script)] if script.exists() else [sys.executable, "-m", "loadfuzz"]


def repro_command(seq: Sequence, limits: Limits) -> str:
    """One shell command that reruns exactly this trial, cold."""
    words = [*loadfuzz_command(), "run", "--cold", "--timeout", f"{limits.timeout_s:g}"]
    words += [step.spelling() for step in seq]
    return " ".join(shlex.quote(word) for word in words)


def harness_steps(seq: Sequence, needs_python: bool) -> tuple[list[HarnessStep], int]:
    """The harness's steps for a sequence, and how many of them are prerequisites.

    A sequence that imports a module or holds a library with undefined Python
    symbols gets libpython loaded first, RTLD_GLOBAL, as a Python process has it.
    """
    steps = [HarnessStep.of(s.kind, s.flags, s.path) for s in seq]
    wants_python = needs_python or any(s.kind is StepKind.IMPORT for s in seq)
    libpython = hostenv.libpython_path() if wants_python else None
    if libpython is None:
        return steps, 0
    return [HarnessStep("g", libpython), *steps], 1


def make_record(seq: Sequence, verdict: Verdict, duration_s: float, peak_rss_mb: float,
                limits: Limits, via: str) -> TrialRecord:
    return TrialRecord(
        sequence=seq,
        outcome=verdict.outcome,
        step=verdict.step,
        signature=verdict.signature,
        op=verdict.op,
        signal=verdict.signal,
        exit_code=verdict.exit_code,
        detail=verdict.detail,
        duration_s=duration_s,
        peak_rss_mb=peak_rss_mb,
        repro=repro_command(seq, limits),
        via=via,
    )


def same_verdict(a: TrialRecord, b: TrialRecord) -> bool:
    return (a.outcome, a.step, a.signature, a.op) == (b.outcome, b.step, b.signature, b.op)


@dataclass(frozen=True)
class Disagreement:
    fast: TrialRecord
    cold: TrialRecord

    def to_json(self) -> dict:
        return {"fast": self.fast.to_json(), "cold": self.cold.to_json()}


DEFAULT_LIMITS = Limits()
# A row server costs about one trial (a fork, the first step, the END); below
# this many trials a row does not win that back.
MIN_ROW = 4


class TrialsClosed(RuntimeError):
    """The runner was closed (the campaign is ending): no more trials start."""


@dataclass
class Usage:
    """What running the trials cost besides the trials: servers started, rows set up."""

    servers: int = 0
    server_start_s: float = 0.0
    rows_shared: int = 0
    row_start_s: float = 0.0
    rows_not_shared: dict[str, int] = field(default_factory=dict)  # why (its first clause) -> rows

    def to_json(self) -> dict:
        return {"servers": self.servers, "server_start_s": round(self.server_start_s, 3),
                "rows_shared": self.rows_shared, "row_start_s": round(self.row_start_s, 3),
                "rows_not_shared": dict(sorted(self.rows_not_shared.items()))}


class Trials:
    """Runs sequences and returns their records; safe to call from several threads."""

    def __init__(
        self,
        limits: Limits = DEFAULT_LIMITS,
        needs_python: Callable[[Sequence], bool] = lambda seq: False,
        preload: Iterable[HarnessStep] | Callable[[Sequence], tuple[HarnessStep, ...]] = (),
        cold: bool = False,
    ):
        """`preload`: what every fork server loads first, or a function giving it per trial.

        A function lets a trial fork from a server that preloaded only what that
        trial's own libraries need (a lighter process forks and exits faster);
        one pool of servers is kept per distinct preload.
        """
        self.limits = limits
        self.needs_python = needs_python
        fixed = tuple(() if callable(preload) else preload)
        self.preload_of = preload if callable(preload) else (lambda seq: fixed)
        self.cold = cold
        self.catalogue: tuple[Signature, ...] = load_catalogue()
        self.disagreements: list[Disagreement] = []
        self.usage = Usage()
        self._idle: dict[tuple[HarnessStep, ...], queue.SimpleQueue[Harness]] = {}
        self._all: list[Harness] = []
        self._lock = threading.Lock()
        self._closed = False

    @property
    def preload(self) -> tuple[HarnessStep, ...]:
        """Everything some fork server of this runner preloaded, in first-seen order."""
        with self._lock:
            steps = [step for server in self._all for step in server.preload]
        return tuple(dict.fromkeys(steps))

    def __enter__(self) -> Trials:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            servers, self._all = self._all, []
        for server in servers:
            server.close()

    def _record(self, seq: Sequence, via: str, server: Harness | None) -> TrialRecord:
        if self._closed:
            raise TrialsClosed("the runner is closed")
        steps, prelude = harness_steps(seq, self.needs_python(seq))
        evidence = run_cold(steps, self.limits, prelude) if server is None else server.run(steps, self.limits, prelude)
        verdict = classify(evidence, self.catalogue)
        return make_record(seq, verdict, evidence.duration_s, evidence.peak_rss_mb,
                           self.limits, via)

    def run_cold(self, seq: Sequence) -> TrialRecord:
        return self._record(seq, "cold", None)

    def _server(self, preload: tuple[HarnessStep, ...]) -> Harness:
        with self._lock:
            if self._closed:
                raise TrialsClosed("the runner is closed")
            idle = self._idle.setdefault(preload, queue.SimpleQueue())
        try:
            return idle.get_nowait()
        except queue.Empty:
            began = time.monotonic()
            server = Harness(preload)
            with self._lock:
                self._all.append(server)
                self.usage.servers += 1
                self.usage.server_start_s += time.monotonic() - began
            return server

    def _fast(self, seq: Sequence, via: str, server: Harness) -> TrialRecord | None:
        """The trial from `server`, or None when the server (not the trial) failed."""
        try:
            return self._record(seq, via, server)
        except HarnessDied:
            return None

    def _confirm(self, seq: Sequence, fast: TrialRecord) -> TrialRecord:
        """A clean fast trial stands; a finding is believed only once a cold run agrees."""
        if fast.clean:
            return fast
        cold = self.run_cold(seq)
        if not same_verdict(fast, cold):
            with self._lock:
                self.disagreements.append(Disagreement(fast, cold))
            return replace(cold, detail=f"{cold.detail} [{fast.via} said: {fast.outcome.value}"
                                        f" {fast.signature or ''} {fast.detail}]".strip())
        return replace(cold, via=f"{fast.via}, confirmed cold")

    def run(self, seq: Sequence) -> TrialRecord:
        if self.cold:
            return self.run_cold(seq)
        preload = tuple(self.preload_of(seq))
        server = self._server(preload)
        fast = self._fast(seq, "fork-server", server)
        if fast is None:  # the cold path decides
            return self.run_cold(seq)
        self._idle[preload].put(server)
        return self._confirm(seq, fast)

    def row_key(self, seq: Sequence) -> tuple | None:
        """What the trials that can share one row server have in common: their fork
        server's preload and their first step (after libpython, when they need it).
        None for a sequence of one step, and when every trial is cold."""
        if self.cold or len(seq) < 2:
            return None
        steps, prelude = harness_steps(seq, self.needs_python(seq))
        return tuple(self.preload_of(seq)), tuple(steps[:prelude + 1])

    def run_row(self, row: Sequence[Sequence]) -> Iterator[TrialRecord]:
        """The records of sequences of one row key, in order, each forked from a row
        server that took their first step once. A prefix that cannot be shared (see
        `Harness.sharing`) or a server that dies sends the rest the usual way."""
        preload, prefix = self.row_key(row[0])
        assert all(self.row_key(seq) == (preload, prefix) for seq in row), "one row key"
        server = self._server(preload)
        left = list(row)
        with contextlib.ExitStack() as stack:
            began = time.monotonic()
            try:
                shared = stack.enter_context(server.sharing(prefix, self.limits))
            except HarnessDied:  # the server could not start the row
                shared = False
            self._count_row(shared, server.unshared, time.monotonic() - began)
            while shared and left:
                fast = self._fast(left[0], "shared prefix", server)
                if fast is None:  # the server died: the rest go the usual way
                    break
                record = self._confirm(left[0], fast)
                left.pop(0)
                yield record
        if server.alive:
            self._idle[preload].put(server)
        for seq in left:
            yield self.run(seq)

    def _count_row(self, shared: bool, why: str, took_s: float) -> None:
        with self._lock:
            self.usage.row_start_s += took_s
            if shared:
                self.usage.rows_shared += 1
            else:
                why = why.split(":")[0]
                self.usage.rows_not_shared[why] = self.usage.rows_not_shared.get(why, 0) + 1

    def batches(self, work: Iterable[Sequence]) -> list[list[Sequence]]:
        """The work in batches, in first-seen order: a row of at least MIN_ROW
        sequences with one row key is one batch, any other sequence its own."""
        rows: dict[object, list[Sequence]] = {}
        for position, seq in enumerate(work):
            rows.setdefault(self.row_key(seq) or position, []).append(seq)
        return [batch for row in rows.values()
                for batch in ([row] if len(row) >= MIN_ROW else [[seq] for seq in row])]

    def run_batch(self, batch: Sequence[Sequence]) -> Iterator[TrialRecord]:
        if len(batch) == 1:
            yield self.run(batch[0])
        else:
            yield from self.run_row(batch)


def run_all(trials: Trials, work: Iterable[Sequence], jobs: int,
            keep: Callable[[TrialRecord], None]) -> None:
    """Run every sequence, `jobs` batches at a time; `keep(record)` as each trial ends,
    one call at a time. On any exception (Ctrl-C) the servers close, ending their trials."""
    lock = threading.Lock()

    def run_batch(batch: Sequence[Sequence]) -> None:
        for record in trials.run_batch(batch):
            with lock:
                keep(record)

    with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        pending = {pool.submit(run_batch, batch) for batch in trials.batches(work)}
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    future.result()
        except BaseException:
            for future in pending:
                future.cancel()
            trials.close()
            raise
