"""Workers: the search phase on every core, one search process per slice of the first steps.

`Workers` starts `--jobs` worker processes (`python -m loadfuzz.search.workers`)
before the replay and predicted phases, so that their start-up overlaps them.
Worker *i* runs Hypothesis rounds (`rounds.Search`) over the sequences whose
first step is in its slice of this shard's first steps (every jobs-th one),
with its own fork servers and its own seeds, so no two workers ever run the
same sequence. It sends each trial's record and each new failure, as
Hypothesis found it, to the campaign's process over a pipe of its own (its
descriptor is its one argument); the campaign's process is the only writer of
the results folder, so every record reaches `trials.jsonl` whole, and it
simplifies each failure once (`Findings.keep`) as they come. On the worker's
stdin come its assignment, the probes' answers (which Python steps import
torch first, `run/warm.py`) when the campaign has them, and the (rough)
identity of each failure another worker found, so that it does not raise it
again. Every message is a
length-prefixed pickle.

Stopping: at the budget's end every worker finishes its trial and says
`done`. On Ctrl-C, SIGTERM or any error the campaign's process sends each
worker SIGTERM (a worker ignores SIGINT and SIGHUP: its campaign decides), which
closes its fork servers, ending their trials; SIGKILL follows after a few
seconds. A worker whose campaign's process is gone (even killed) stops at its
next trial, and its fork servers end when its pipes close.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loadfuzz.campaign import Quiet
from loadfuzz.inventory import Inventory, Library
from loadfuzz.merge import added
from loadfuzz.model import Step, Stopped, TrialRecord
from loadfuzz.run.processes import PIPE_READ
from loadfuzz.search.once import RunOnce
from loadfuzz.search.rounds import Search
from loadfuzz.search.shrink import Identity
from loadfuzz.settings import RunSettings

if TYPE_CHECKING:
    from loadfuzz.run.trials import Trials
    from loadfuzz.search.fuzz import Findings

STOP_WAIT_S = 5.0  # after SIGTERM, before SIGKILL
HEADER = struct.Struct("!Q")


@dataclass(frozen=True)
class Plan:
    """What every worker of a search is given (pickled): the libraries, how trials run, the
    step choices, this shard's first steps, the sequence length, the seed and the budget's
    end (a `time.monotonic()` instant: CLOCK_MONOTONIC is the same in every process)."""

    inv: Inventory
    libs: tuple[Library, ...]
    run: RunSettings
    options: Sequence[Step]
    first: Sequence[Step]
    max_len: int
    seed: int
    until: float
    sys_path: tuple[str, ...]  # the campaign's: a Python step is the same import in every process


@dataclass(frozen=True)
class Assignment:
    """One worker's part: its index and the first steps it starts sequences with."""

    plan: Plan
    index: int
    first: tuple[Step, ...]
    parent: int  # the campaign's process id: a worker outliving it stops


@dataclass
class Report:
    """What the workers did, for the summary: rounds, their fork servers, the wall clock."""

    jobs: int = 0
    rounds: int = 0
    searched: int = 0  # trials the workers ran
    recalled: int = 0  # sequences the workers answered from memory (see `search.once.RunOnce`)
    search_s: float = 0.0
    usage: list[dict] = field(default_factory=list)  # each worker's `Usage.to_json()`
    preload: list[str] = field(default_factory=list)  # each worker's servers' preloads

    def summary(self, trials: Trials, recalled: int = 0) -> dict[str, Any]:
        """The summary's `rounds`, `jobs`, `search_s`, `recalled` (with the campaign's own
        process's `recalled`), and `servers` and `preload` of the campaign's own process and
        every worker together."""
        servers = added([trials.usage.to_json(), *self.usage])
        preload = [str(step.path) for step in trials.preload] + self.preload
        return {"rounds": self.rounds, "jobs": self.jobs, "search_s": round(self.search_s, 2),
                "recalled": self.recalled + recalled,
                "servers": servers, "preload": list(dict.fromkeys(preload))}


# --- messages, both ways -----------------------------------------------------------------


def send(fd: int, kind: str, payload: object) -> None:
    """One message, whole: its length, then its pickle."""
    data = pickle.dumps((kind, payload))
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


@dataclass
class Inbox:
    """The reading end of a pipe of messages, and what was read of the next one."""

    fd: int
    buffer: bytes = b""

    def read(self) -> list[tuple] | None:
        """The whole messages that one read gives (call when readable); None at end of file."""
        chunk = os.read(self.fd, PIPE_READ)
        if not chunk:
            return None
        self.buffer += chunk
        found = []
        while len(self.buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self.buffer)
            if len(self.buffer) < HEADER.size + size:
                break
            found.append(pickle.loads(self.buffer[HEADER.size:HEADER.size + size]))
            self.buffer = self.buffer[HEADER.size + size:]
        return found

    def ready(self) -> bool:
        return bool(select.select([self.fd], [], [], 0)[0])


# --- the campaign's side -----------------------------------------------------------------


QUIET = {signal.SIGINT, signal.SIGHUP}  # the campaign's process stops the workers itself


def start_worker(messages_fd: int) -> subprocess.Popen:
    """A worker process, its messages to `messages_fd`. It starts with SIGINT and SIGHUP
    blocked, and ignores them before it unblocks them: a Ctrl-C that reaches the whole process
    group while it is still importing (a third of a second) must not print its traceback."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, QUIET)
    try:
        return subprocess.Popen([sys.executable, "-m", "loadfuzz.search.workers", str(messages_fd)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                pass_fds=(messages_fd,))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class Worker:
    """One worker process: its stdin (`tell`, one message at a time), and a thread that reads
    its messages into the campaign's queue as they come, so that a worker never waits for the
    campaign to read. Its assignment (the inventory: megabytes) is written by a thread too,
    so that the campaign goes on while the worker starts up."""

    def __init__(self, assignment: Assignment, messages: queue.SimpleQueue):
        read, write = os.pipe()
        try:
            self.proc = start_worker(write)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        self.inbox, self.done = Inbox(read), False
        self.telling = threading.Lock()
        self.reader = threading.Thread(target=self._read, args=(messages,), daemon=True)
        self.reader.start()
        threading.Thread(target=self.tell, args=("assignment", assignment), daemon=True).start()

    def _read(self, messages: queue.SimpleQueue) -> None:
        """Every message, then (self, None) at the end of the pipe: the worker has ended."""
        while (got := self.inbox.read()) is not None:
            for message in got:
                messages.put((self, message))
        messages.put((self, None))

    def tell(self, kind: str, payload: object) -> None:
        assert self.proc.stdin is not None
        # it has ended (its own message says how), or it is being stopped
        with self.telling, contextlib.suppress(BrokenPipeError, ValueError, OSError):
            send(self.proc.stdin.fileno(), kind, payload)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL when it has not ended within STOP_WAIT_S; reaped either way,
        and its pipe read to the end before it is closed."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout=STOP_WAIT_S)
        if not self.reader.is_alive():  # else something still holds the pipe: leave it open
            os.close(self.inbox.fd)
        if self.proc.stdin is not None:
            with self.telling, contextlib.suppress(BrokenPipeError):  # no message half-written
                self.proc.stdin.close()


class Workers:
    """The search's worker processes, started on entering (before the replay and predicted
    phases, so that their start-up overlaps them) and stopped on leaving, whatever happens."""

    def __init__(self, plan: Plan, jobs: int, findings: Findings, report: Report):
        """`report`: what the workers did, kept up to date as they say it (the partial summary
        of a stopped campaign reads it too)."""
        self.plan, self.findings = plan, findings
        self.jobs = min(jobs, len(plan.first))
        self.report = report
        report.jobs = self.jobs
        self.messages: queue.SimpleQueue = queue.SimpleQueue()
        self.running: list[Worker] = []
        self.began = time.monotonic()

    def __enter__(self) -> Workers:
        try:
            for index in range(self.jobs):
                assignment = Assignment(self.plan, index, tuple(self.plan.first[index::self.jobs]),
                                        os.getpid())
                self.running.append(Worker(assignment, self.messages))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for worker in self.running:
            worker.stop()
        self.report.search_s = time.monotonic() - self.began

    def probed(self, answers: dict[str, bool]) -> None:
        """Give every worker the probes' answers (see `run.warm`), so that no step is probed
        twice; a worker takes them between rounds."""
        for worker in self.running:
            worker.tell("probes", answers)

    def known(self, record: TrialRecord) -> None:
        """Tell every worker about a failure, so that none raises it again."""
        for worker in self.running:
            worker.tell("known", Identity.of(record).rough(record))

    def listen(self) -> Report:
        """Take the workers' messages until every one has ended, having said `done`; while
        none is waiting, simplify the failures they found (with the campaign's own trials),
        and while there is nothing to simplify either, confirm the findings cold, so that
        few are left to confirm once the budget is spent."""
        waiting: list[TrialRecord] = []
        live = list(self.running)
        while live or waiting:
            unconfirmed = [] if waiting else self.findings.unconfirmed()
            try:
                worker, message = self.messages.get(block=not waiting,
                                                    timeout=0.2 if unconfirmed else 1.0)
            except queue.Empty:
                if waiting:
                    self.findings.keep(waiting.pop(0), "search")
                elif unconfirmed and time.monotonic() < self.plan.until:
                    self.findings.confirm(unconfirmed[0])
                continue
            if message is None:
                live.remove(worker)
                if not worker.done:
                    raise RuntimeError(f"a search worker ended unexpectedly "
                                       f"(status {worker.proc.wait()})")
                continue
            handle(message, worker, self.findings, self.report, waiting)
            if message[0] == "failure":
                self.known(message[1])
        return self.report


def handle(message: tuple, worker: Worker, findings: Findings, report: Report,
           waiting: list[TrialRecord]) -> None:
    kind, payload = message
    if kind == "trial":
        report.searched += 1
        findings.run.take(payload)
    elif kind == "failure":
        waiting.append(payload)
    elif kind == "round":
        report.rounds += 1
    elif kind == "done":
        worker.done = True
        report.recalled += payload["recalled"]
        report.usage.append(payload["usage"])
        report.preload += payload["preload"]
    elif kind == "error":
        raise RuntimeError(f"a search worker failed: {payload}")


# --- the worker's side ---------------------------------------------------------------------


@dataclass(frozen=True)
class Outbox:
    """A worker's end of its pipe; also what its `RunOnce` appends each record to."""

    fd: int
    parent: int
    stopping: threading.Event  # set by SIGTERM (see `stop_on_sigterm`)

    def send(self, kind: str, payload: object) -> None:
        send(self.fd, kind, payload)

    def append(self, record: TrialRecord) -> None:
        """Send a record; Stopped when the campaign's process is gone or stopped this worker
        (so is the search)."""
        if os.getppid() != self.parent or self.stopping.is_set():
            raise Stopped(signal.SIGTERM)
        self.send("trial", record)


def work(assignment: Assignment, inbox: Inbox, outbox: Outbox, news: list[tuple]) -> None:
    """Hypothesis rounds until the budget's end; each new failure is sent as it is found.
    `news`: the messages read with the assignment. Until the campaign's probes answer (see
    `Workers.probed`), a Python step is taken as not importing torch first."""
    plan = assignment.plan
    with plan.run.trials(plan.inv, plan.libs, confirm=False) as trials:
        trials.warm.probing = False  # the campaign's process asks, once for all

        def found_elsewhere() -> list[tuple]:
            """The failures other processes found since last asked; the probes' answers are
            taken in passing."""
            got = news + (inbox.read() or [] if inbox.ready() else [])
            news.clear()
            for kind, payload in got:
                if kind == "probes":
                    trials.warm.learn(payload)
            return [payload for kind, payload in got if kind == "known"]

        rounds = Search(plan.inv, RunOnce(trials, outbox, Quiet()),  # type: ignore[arg-type]
                        list(plan.options), found_elsewhere)
        number = 0
        while time.monotonic() < plan.until:
            rounds.elsewhere.update(found_elsewhere())
            seed = round_seed(plan.seed, assignment.index, number)
            for failure in rounds.round(seed, assignment.first, plan.max_len, plan.until):
                outbox.send("failure", failure)
            outbox.send("round", None)
            number += 1
        outbox.send("done", {"recalled": rounds.run.recalled,
                             "usage": trials.usage.to_json(),
                             "preload": [str(step.path) for step in trials.preload]})


def round_seed(seed: int, worker: int, number: int) -> int:
    """The seed of round `number` of worker `worker` in a campaign seeded `seed`: a hash of
    the three, so that no two campaigns share a round (a nightly job seeded with its run
    number, `seed + r` would make night N+1's round r night N's round r+1)."""
    digest = hashlib.blake2b(f"{seed}:{worker}:{number}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def stop_on_sigterm() -> threading.Event:
    """Make SIGTERM end this worker by unwinding (its fork servers close on the way out).

    The handler raises Stopped wherever the main thread happens to be: a
    KeyboardInterrupt, which Hypothesis lets through at once (a SystemExit it
    would take for a failure of the test, replay and report). Where Python
    cannot raise (a gc callback, such as Hypothesis's, a `__del__`, a weakref
    callback), the exception is dropped as "unraisable": that is not printed,
    and the returned event, set by the handler, stops the worker at its next
    trial (`Outbox.append`). `main` ends quietly on Stopped."""
    stopping = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        stopping.set()
        raise Stopped(signum)

    default = sys.unraisablehook

    def unraisable(report: Any) -> None:
        if not (stopping.is_set() and isinstance(report.exc_value, Stopped)):
            default(report)

    sys.unraisablehook = unraisable
    signal.signal(signal.SIGTERM, handler)
    return stopping


def main() -> None:
    for signum in QUIET:  # blocked since the start (`start_worker`): what came is dropped
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, QUIET)
    stopping = stop_on_sigterm()
    try:
        serve(stopping)
    except Stopped:
        raise SystemExit(0) from None  # stopped: the campaign's process says so, not this one


def serve(stopping: threading.Event) -> None:
    """Read the assignment, then search until the budget's end; a failure goes to the
    campaign's process as an "error" message."""
    inbox = Inbox(sys.stdin.fileno())
    messages: list[tuple] = []
    while not messages:
        got = inbox.read()
        if got is None:
            return  # the campaign ended before it gave this worker anything to do
        messages = got
    (_, assignment), *news = messages
    sys.path[:] = assignment.plan.sys_path
    outbox = Outbox(int(sys.argv[1]), assignment.parent, stopping)
    try:
        work(assignment, inbox, outbox, news)
    except Exception:
        outbox.send("error", traceback.format_exc(limit=20))
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
