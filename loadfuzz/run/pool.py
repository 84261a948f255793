"""Pool: the fork servers of one runner, kept by what they preloaded and reused trial after trial.

A trial takes an idle server with the preload it needs (starting one when
none is idle) and gives it back when done. A preload whose server cannot
start (a preload that fails, a harness that dies at once) is remembered as
broken, and its trials go cold from then on instead of ending the campaign.
Cold harnesses (one per trial) are the pool's too while they run, so that
closing the pool (Ctrl-C, SIGTERM) ends every trial in flight at once.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from loadfuzz.run.harness import Harness, HarnessDied, HarnessStep

Preload = tuple[HarnessStep, ...]


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
        self._started: list[Preload] = []  # the preload of every server started, kept after close
        self._cold: set[Harness] = set()  # cold harnesses running a trial
        self._lock = threading.Lock()
        self.closed = False

    def take(self, preload: Preload) -> Harness | None:
        """An idle server with this preload, or a new one; None when such a server cannot run."""
        with self._lock:
            if self.closed or preload in self._broken:
                return None
            idle = self._idle.setdefault(preload, queue.SimpleQueue())
        try:
            return idle.get_nowait()
        except queue.Empty:
            pass
        began = time.monotonic()
        try:
            server = Harness(preload)
        except HarnessDied as exc:
            with self._lock:
                self._broken.add(preload)
                names = " ".join(step.path.name for step in preload) or "nothing preloaded"
                self.usage.servers_failed[names] = str(exc)[:300]
            return None
        with self._lock:
            self._all.append(server)
            self._started.append(preload)
            self.usage.servers += 1
            self.usage.server_start_s += time.monotonic() - began
            if self.closed:  # closed while it started: it serves nobody
                server.close()
                return None
        return server

    def give_back(self, preload: Preload, server: Harness) -> None:
        if self.closed or not server.alive:
            server.close()
        else:
            self._idle[preload].put(server)

    @property
    def preloaded(self) -> Preload:
        """Everything some server of this pool preloaded, in first-seen order."""
        with self._lock:
            return tuple(dict.fromkeys(step for preload in self._started for step in preload))

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
        """Kill every server and cold harness (ending their trials); close the idle ones. A busy
        one is closed by the thread that was using it, when that thread sees it die."""
        with self._lock:
            self.closed = True
            servers, self._all = self._all, []
            running = list(self._cold)
            idle = [q for q in self._idle.values()]
        for harness in [*servers, *running]:
            harness.kill()
        for waiting in idle:
            with contextlib.suppress(queue.Empty):
                while True:
                    waiting.get_nowait().close()
