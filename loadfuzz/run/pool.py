"""Pool: the fork servers of one runner, kept by what they preloaded and reused trial after trial.

A trial takes an idle server with the preload it needs (starting one when
none is idle) and gives it back when done. A server can also be started
ahead (`prestart`), while the work is still being planned: the first trial
that needs that preload waits for it rather than starting another. A preload whose server cannot
start (a preload that fails, a harness that dies at once) is remembered as
broken, and its trials go cold from then on instead of ending the campaign.
A server started on a guess (`prestart(guess=True)`, see `ahead`) is the
exception: when it cannot start, nothing is remembered, and the first trial
that needs its preload starts a server of its own, which decides.
Cold harnesses (one per trial) are the pool's too while they run, so that
closing the pool (Ctrl-C, SIGTERM) ends every trial in flight at once.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

from loadfuzz.run.harness import Harness, HarnessDied, Preload
from loadfuzz.run.processes import sweep_scratch


@dataclass
class Usage:
    """What running the trials cost besides the trials: servers started, rows set up."""

    servers: int = 0
    server_start_s: float = 0.0
    rows_shared: int = 0
    row_start_s: float = 0.0
    rows_not_shared: dict[str, int] = field(default_factory=dict)  # why (its first clause) -> rows
    servers_failed: dict[str, str] = field(default_factory=dict)  # preload (names) -> why

    def to_json(self) -> dict:
        data = {"servers": self.servers, "server_start_s": round(self.server_start_s, 3),
                "rows_shared": self.rows_shared, "row_start_s": round(self.row_start_s, 3),
                "rows_not_shared": dict(sorted(self.rows_not_shared.items()))}
        if self.servers_failed:
            data["servers_failed"] = dict(self.servers_failed)
        return data


class ServerPool:
    """Fork servers by preload; safe to use from several threads."""

    def __init__(self) -> None:
        self.usage = Usage()
        self._idle: dict[Preload, queue.SimpleQueue[Harness]] = {}
        self._all: list[Harness] = []
        self._broken: set[Preload] = set()
        self._taken: dict[Preload, None] = {}  # preloads trials took (an ordered set)
        self._start_s: dict[Preload, float] = {}  # seconds the last server of each preload took
        self._cold: set[Harness] = set()  # cold harnesses running a trial
        self._ahead: dict[Preload, Future[Harness | None]] = {}  # started ahead, not yet taken
        self._lock = threading.Lock()
        self.closed = False
        sweep_scratch()  # what the servers of a loadfuzz killed by SIGKILL left behind

    def prestart(self, preload: Preload, guess: bool = False) -> None:
        """Start a server with this preload now, in the background (once per preload);
        `guess`: no trial is known to need it yet, so a failure to start is not remembered."""
        with self._lock:
            if self.closed or preload in self._broken or preload in self._ahead \
                    or preload in self._idle:
                return
            self._ahead[preload] = ahead = Future()

        def start() -> None:
            try:
                ahead.set_result(self._start(preload, remember_broken=not guess))
            except BaseException as exc:  # the trial that takes it sees the error
                ahead.set_exception(exc)

        threading.Thread(target=start, name="loadfuzz-prestart").start()

    def take(self, preload: Preload) -> Harness | None:
        """An idle server with this preload, else the one started ahead for it, else a new one;
        None when such a server cannot run."""
        with self._lock:
            if self.closed or preload in self._broken:
                return None
            idle = self._idle.setdefault(preload, queue.SimpleQueue())
            ahead = self._ahead.pop(preload, None)
            self._taken.setdefault(preload)
        try:
            server = idle.get_nowait()
        except queue.Empty:
            server = ahead.result() if ahead is not None else None
            # None from a guess that failed: this trial's own start decides
            return server if server is not None else self._start(preload)
        if ahead is not None:  # not needed yet: it waits with the idle ones
            ahead.add_done_callback(lambda done: self._idle_ahead(preload, done.result()))
        return server

    def _idle_ahead(self, preload: Preload, server: Harness | None) -> None:
        if server is not None:
            self.give_back(preload, server)

    def _start(self, preload: Preload, remember_broken: bool = True) -> Harness | None:
        """A new server with this preload; None when it cannot start (the preload is then
        remembered as broken, unless `remember_broken` is False), is known to be broken, or
        the pool closed meanwhile."""
        with self._lock:
            if self.closed or preload in self._broken:
                return None
        began = time.monotonic()
        try:
            server = Harness(preload)
        except HarnessDied as exc:
            if not remember_broken:
                return None
            with self._lock:
                self._broken.add(preload)
                names = " ".join(step.path.name for step in preload) or "nothing preloaded"
                self.usage.servers_failed[names] = str(exc)[:300]
            return None
        with self._lock:
            self._all.append(server)
            self._start_s[preload] = took = time.monotonic() - began
            self.usage.servers += 1
            self.usage.server_start_s += took
            if self.closed:  # closed while it started: it serves nobody
                server.close()
                return None
        return server

    def give_back(self, preload: Preload, server: Harness) -> None:
        """A server a trial took, idle again; closed instead if it died or the pool closed (the
        check and the put are one step under the lock: `close` takes every idle server once)."""
        with self._lock:
            kept = not self.closed and server.alive
            if kept:
                self._idle.setdefault(preload, queue.SimpleQueue()).put(server)
        if not kept:
            server.close()

    @property
    def preloaded(self) -> Preload:
        """Everything the servers trials took had preloaded, in first-seen order."""
        with self._lock:
            return tuple(dict.fromkeys(step for preload in self._taken for step in preload))

    @property
    def taken(self) -> dict[Preload, float]:
        """The preloads trials took a server of (broken ones left out), in first-taken order,
        each with the seconds its last server took to start."""
        with self._lock:
            return {preload: self._start_s.get(preload, 0.0) for preload in self._taken
                    if preload not in self._broken}

    @contextlib.contextmanager
    def cold(self, observe: bool = False) -> Iterator[Harness]:
        """A fresh harness with nothing preloaded, for one trial, closed afterwards;
        `observe`: the loader reports what it did (`Harness.trace`)."""
        if self.closed:
            raise RuntimeError("the pool is closed: no more trials start")
        harness = Harness(observe=observe)
        with self._lock:
            self._cold.add(harness)
            closed = self.closed
        try:
            if closed:
                raise RuntimeError("the pool is closed: no more trials start")
            yield harness
        finally:
            with self._lock:
                self._cold.discard(harness)
            harness.close()

    def close(self) -> None:
        """Close the idle servers; kill every busy server and cold harness (ending their
        trials). A busy one is closed by the thread that was using it, when that thread sees
        it die."""
        with self._lock:
            self.closed = True
            servers, self._all = self._all, []
            running = list(self._cold)
            idle = [q for q in self._idle.values()]
            ahead, self._ahead = list(self._ahead.values()), {}
        resting: list[Harness] = []
        for waiting in idle:
            with contextlib.suppress(queue.Empty):
                while True:
                    resting.append(waiting.get_nowait())
        for harness in {*servers, *running} - set(resting):
            harness.kill()
        for untaken in ahead:  # started ahead for a trial that never came: nobody else closes it
            untaken.add_done_callback(close_started)
        for server in resting:  # no trial: the end of its control pipe ends it
            server.close()


def close_started(started: Future[Harness | None]) -> None:
    """Close the server a start produced, if it produced one."""
    if started.exception() is None and (server := started.result()) is not None:
        server.close()
