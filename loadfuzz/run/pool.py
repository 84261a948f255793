"""Pool: the fork servers of one runner, kept by what they preloaded and reused trial after trial.

A trial takes an idle server with the preload it needs (starting one when
none is idle) and gives it back when done. A preload whose server cannot
start (a preload that fails, a harness that dies at once) is remembered as
broken, and its trials go cold from then on instead of ending the campaign.
"""

from __future__ import annotations

import queue
import threading
import time
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
        if server.alive and not self.closed:
            self._idle[preload].put(server)

    @property
    def preloaded(self) -> Preload:
        """Everything some server of this pool preloaded, in first-seen order."""
        with self._lock:
            return tuple(dict.fromkeys(step for preload in self._started for step in preload))

    def close(self) -> None:
        with self._lock:
            self.closed = True
            servers, self._all = self._all, []
        for server in servers:
            server.close()
