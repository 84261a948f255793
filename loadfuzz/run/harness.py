"""Speak the harness protocol (docs/protocol.md) to one harness process: a fork server.

A `Harness` is one harness process, a fork server: every trial is a child forked from it, so a trial is
isolated whatever it does, and what the server preloaded (libpython, the
libtorch closure) is paid for once. A cold trial is a fresh harness with
nothing preloaded, used for one trial and closed. A server can also have its
interpreter started before it serves (a `y` step in its preload, e.g. `import
torch`): what that printed opens the output of each of its trials, as it would
open the output of a cold trial whose first step does the same.

Trials that begin with the same steps (a matrix row) can share them: inside
`with harness.sharing(prefix, limits)`, a row server forked from the server
has taken those steps once, and every trial of the row forks from it. The
record of such a trial is that of the whole sequence: its steps are counted
from the first, and what the prefix printed comes first in its output.
"""

from __future__ import annotations

import collections
import contextlib
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadfuzz import hostenv
from loadfuzz.model import DEFAULT_MEM_MB, Evidence
from loadfuzz.run import ldtrace
from loadfuzz.run.build import harness_binary
from loadfuzz.run.ldtrace import LoaderTrace
from loadfuzz.run.processes import PIPE_READ, end_group, kill_tree, own_scratch, unforkable

PROTOCOL_VERSION = 7  # harness_c/harness.c's PROTOCOL_VERSION: the greeting must say it
STARTUP_TIMEOUT_S = 120.0  # preloading libtorch on a cold disk can take a while
MARGIN_S = 30.0  # on top of the step limits, before the server itself is presumed stuck
AHEAD = 1  # trials sent to a server before the result of the first is read (see run_each)


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # per step
    mem_mb: int = DEFAULT_MEM_MB  # RLIMIT_AS of a trial
    at_exit: bool = False  # end with exit() (destructors run) instead of _exit() after the last step


@dataclass(frozen=True)
class HarnessStep:
    """One action as the harness takes it: a mode letter and a path (for `y`, Python source)."""

    mode: str  # g (dlopen RTLD_GLOBAL), l (RTLD_LOCAL) or y (run `code` as Python)
    # In a preload, `y` starts the server's interpreter and runs `code` (after libpython, g).
    path: Path  # the library the step is about (for y: only for people)
    code: str = ""

    @property
    def payload(self) -> bytes:
        return self.code.encode("utf-8", "surrogateescape") if self.mode == "y" else (
            os.fsencode(self.path))


Preload = tuple[HarnessStep, ...]  # what a server takes before it forks its first trial


def trial_environment(scratch: Path) -> dict[str, str]:
    """A loader-clean environment: nothing inherited but what loadfuzz sets on purpose."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(scratch),
        "TMPDIR": str(scratch),
        "LANG": "C.UTF-8",
        # An embedded interpreter starts as this program, so that its sys.path and site are
        # those `python -c` has in this environment.
        "LOADFUZZ_PYTHON": sys.executable,
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    torch_lib = hostenv.torch_lib_dir()
    if torch_lib is not None:  # so that libraries outside site-packages find libtorch too
        env["LD_LIBRARY_PATH"] = str(torch_lib)
    return env


def read_bounded(stream: typing.BinaryIO, head: int = 16 << 10, tail: int = 48 << 10) -> bytes:
    """What a file holds, its middle left out past head + tail bytes, as the harness keeps output."""
    size = stream.seek(0, os.SEEK_END)
    stream.seek(0)
    if size <= head + tail:
        return stream.read()
    first = stream.read(head)
    stream.seek(size - tail)
    return first + b"\n[... %d bytes not kept ...]\n" % (size - head - tail) + stream.read()


class HarnessDied(RuntimeError):
    """The harness process itself stopped answering (not a trial's doing)."""


@dataclass(frozen=True)
class SharedPrefix:
    """Steps a row server has taken, what they printed, and how long they took."""

    steps: tuple[HarnessStep, ...]
    output: bytes
    output_bytes: int
    took_s: float = 0.0


class Harness:
    """One harness process serving trials one at a time. Use as a context manager."""

    def __init__(self, preload: Sequence[HarnessStep] = (), observe: bool = False):
        """`observe`: the loader reports what it did (see `ldtrace`); read it with `trace`."""
        self.preload = tuple(preload)
        binary = harness_binary()  # first: a harness that cannot be built leaves nothing behind
        self.scratch, self._owner = own_scratch()  # locked while this object has it
        self._count = 0
        self._sent = 0  # the trial folder the last trial sent used
        self.shared: SharedPrefix | None = None
        self.unshared = ""  # why the last prefix could not be shared
        self.preface = SharedPrefix((), b"", 0)  # what a Python preload printed
        ctl_r, ctl_w = os.pipe()
        st_r, st_w = os.pipe()
        args = [str(binary), "--ctl", str(ctl_r), "--status", str(st_w)]
        args += ["--parent", str(os.getpid())]
        for step in self.preload:
            if step.mode == "y":
                args += ["--preload-python", step.code]
            else:
                args += ["--preload-global" if step.mode == "g" else "--preload", str(step.path)]
        self._ctl, self._status = ctl_w, st_r
        self._buffer = b""
        self.preload_output = b""  # what the preloads printed: it opens every trial's output
        self.preload_s = 0.0  # how long the server took to start, when it preloads anything
        began = time.monotonic()
        printed = tempfile.TemporaryFile()  # noqa: SIM115 (the server's stdout and stderr; closed below)
        try:
            self.proc = subprocess.Popen(
                args,
                pass_fds=(ctl_r, st_w),
                stdin=subprocess.DEVNULL,
                stdout=printed,
                stderr=printed,
                cwd=self.scratch,
                env=trial_environment(self.scratch) | (self._observing() if observe else {}),
                start_new_session=True,
            )
        except BaseException:
            for fd in (ctl_r, st_w, ctl_w, st_r):
                os.close(fd)
            printed.close()
            shutil.rmtree(self.scratch, ignore_errors=True)
            os.close(self._owner)
            raise
        os.close(ctl_r)
        os.close(st_w)
        try:
            with printed:
                self._greeting()
                self.preload_output = read_bounded(printed)
            self.preload_s = time.monotonic() - began if self.preload else 0.0
            pipes = {ctl_r: ctl_w, st_w: st_r}
            if self.preload and (why := unforkable(self.proc.pid, self.scratch, pipes)):
                raise HarnessDied(f"after its preloads the server {why}")
        except BaseException:  # a server that did not start leaves nothing behind
            self.close()
            raise

    def _observing(self) -> dict[str, str]:
        return {"LD_DEBUG": ldtrace.DEBUG_CATEGORIES,
                "LD_DEBUG_OUTPUT": str(self.scratch.resolve() / "ld-debug")}

    def trace(self, keep: Callable[[str, str, str], int] = ldtrace.keep_none,
              only: tuple[str, ...] | None = None) -> LoaderTrace:
        """What the loader said about this harness's trials (it was started with `observe`).
        Forked trials write to the server's file; programs they start are not read."""
        return ldtrace.read(self.scratch.resolve() / f"ld-debug.{self.proc.pid}", keep, only)

    def _greeting(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        header = self._read_line(deadline)
        if header.startswith(b"PRELOAD-ERROR"):
            error = self._read_exact(int(header.split()[1]), time.monotonic() + 5)
            raise HarnessDied(f"preloading failed: {error.decode('utf-8', 'replace')}")
        fields = header.split()
        if fields[:1] != [b"READY"] or len(fields) < 3:
            raise HarnessDied(f"unexpected greeting from the harness: {header!r}")
        if fields[1] != str(PROTOCOL_VERSION).encode():
            raise HarnessDied(f"the harness speaks protocol {fields[1].decode(errors='replace')}, "
                              f"this loadfuzz speaks {PROTOCOL_VERSION}")
        if len(fields) != 6:
            raise HarnessDied(f"unexpected greeting from the harness: {header!r}")
        total, head_len, tail_len = (int(f) for f in fields[3:])
        self.preface = SharedPrefix((), self._read_output(total, head_len, tail_len, deadline),
                                    total)

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the protocol ----------------------------------------------------------
    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([self._status], [], [], max(left, 0))
        chunk = os.read(self._status, PIPE_READ) if ready else b""
        if not chunk:
            raise HarnessDied("the harness did not answer" if not ready else "the harness died")
        self._buffer += chunk

    def _read_line(self, deadline: float) -> bytes:
        while b"\n" not in self._buffer:
            self._fill(deadline)
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _read_exact(self, size: int, deadline: float) -> bytes:
        while len(self._buffer) < size:
            self._fill(deadline)
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def _send(self, kind: bytes, steps: Sequence[HarnessStep], limits: Limits, workdir: Path) -> None:
        header = b"%s %d %d %d %d %d\n" % (kind, limits.timeout_s * 1000, limits.mem_mb,
                                           limits.at_exit, len(steps), len(bytes(workdir)))
        message = [header, bytes(workdir)]
        for step in steps:
            raw = step.payload
            message += [b"%s %d\n" % (step.mode.encode(), len(raw)), raw]
        try:
            os.write(self._ctl, b"".join(message))
        except BrokenPipeError:  # killed between trials (the OOM killer, a user's kill -9)
            raise HarnessDied("the harness died") from None

    def _trial_folder(self, name: str) -> Path:
        """A trial's working folder, empty: the folder `name`, trial after trial, while the
        trials leave it empty (a mkdir and an rmdir per trial cost 0.15 ms on ext4, a sixth
        of a light trial), else a fresh one."""
        folder = self.scratch / name
        try:
            with os.scandir(folder) as entries:
                if next(entries, None) is None:
                    return folder
        except FileNotFoundError:
            folder.mkdir()
            return folder
        except OSError:
            pass  # a trial took its permissions away
        shutil.rmtree(folder, ignore_errors=True)  # what the last trial left
        return self._trial_folder(name) if not folder.exists() else self._workdir("trial")

    def _workdir(self, kind: str) -> Path:
        self._count += 1
        workdir = self.scratch / f"{kind}-{self._count}"
        workdir.mkdir()
        return workdir

    def _read_output(self, total: int, head_len: int, tail_len: int, deadline: float) -> bytes:
        """The head and the tail of what a child printed, with the middle it did not keep marked."""
        head = self._read_exact(head_len, deadline)
        tail = self._read_exact(tail_len, deadline)
        omitted = total - head_len - tail_len
        return head + (b"\n[... %d bytes not kept ...]\n" % omitted if omitted > 0 else b"") + tail

    def _open_row(self, prefix: Sequence[HarnessStep], hidden: Sequence[HarnessStep],
                  limits: Limits, workdir: Path) -> SharedPrefix | None:
        began = time.monotonic()
        self._send(b"PREFIX", [*prefix, *hidden], limits, workdir)
        deadline = began + (len(prefix) + len(hidden)) * limits.timeout_s + MARGIN_S
        fields = self._read_line(deadline).split()
        if fields[:1] == [b"NO-ROW"] and len(fields) == 2:
            why = self._read_exact(int(fields[1]), deadline)
            self.unshared = why.decode("utf-8", "replace")  # a failed or unsharable prefix
            return None
        if fields[:1] != [b"ROW"] or len(fields) != 5:
            raise HarnessDied(f"unexpected answer from the harness: {fields!r}")
        total, head_len, tail_len = (int(f) for f in fields[2:])
        self.unshared = ""
        output = self._read_output(total, head_len, tail_len, deadline)
        return SharedPrefix(tuple(prefix), output, total, time.monotonic() - began)

    @contextlib.contextmanager
    def sharing(self, prefix: Sequence[HarnessStep], limits: Limits,
                hidden: Sequence[HarnessStep] = ()) -> Iterator[bool]:
        """Within, trials that begin with `prefix` fork from a row server that took it once.

        `hidden`: steps the row server takes after the prefix that are no step
        of the trials (a stand-in, see `standins`): their output follows the
        prefix's. Yields False, and every trial runs whole, when the harness
        could not share the prefix: one of its steps failed, or it left behind
        what a fork does not copy (a thread, a child, a timer; see NO-ROW in the harness).
        """
        assert self.shared is None, "one row at a time"
        workdir = self._workdir("row")
        try:
            self.shared = self._open_row(prefix, hidden, limits, workdir)
        except (OSError, HarnessDied):
            self.close()
            raise
        try:
            yield self.shared is not None
        finally:
            if self.shared is not None and self.alive:
                try:
                    os.write(self._ctl, b"END\n")
                except OSError:
                    self.close()
            self.shared = None
            shutil.rmtree(workdir, ignore_errors=True)

    def run(self, steps: Sequence[HarnessStep], limits: Limits, prelude: int = 0) -> Evidence:
        """Run one trial. The first `prelude` steps are prerequisites, not counted as steps."""
        return next(self.run_each([(steps, prelude)], limits))

    def run_each(self, trials: Iterable[tuple[Sequence[HarnessStep], int]], limits: Limits,
                 ) -> Iterator[Evidence]:
        """Run trials one after the other (each: its steps, and how many of them are
        prerequisites) and yield their evidence in order. The next trial is sent before a
        result is read, so the server starts it as soon as the last one ends, while the caller
        still reads that one. Left with a trial sent and not read, the server is closed: its
        result would answer the next question asked."""
        sent: collections.deque[tuple[Sequence[HarnessStep], int, SharedPrefix]] = (
            collections.deque())
        todo = iter(trials)
        try:
            while True:
                while len(sent) <= AHEAD and (trial := next(todo, None)) is not None:
                    sent.append((*trial, self._send_trial(trial[0], limits)))
                if not sent:
                    return
                yield self._result(*sent.popleft(), limits)
        finally:
            if sent:
                self.close()

    def _send_trial(self, steps: Sequence[HarnessStep], limits: Limits) -> SharedPrefix:
        """Send one trial (in the next of AHEAD + 1 trial folders); what it shares (its row)."""
        shared = self.shared or SharedPrefix((), b"", 0)
        skip = len(shared.steps)
        assert tuple(steps[:skip]) == shared.steps, "a trial of a row begins with its prefix"
        self._sent = (self._sent + 1) % (AHEAD + 1)
        try:
            self._send(b"TRIAL", steps[skip:], limits, self._trial_folder(f"trial{self._sent}"))
        except OSError:
            self.close()
            raise
        return shared

    def _result(self, steps: Sequence[HarnessStep], prelude: int, shared: SharedPrefix,
                limits: Limits) -> Evidence:
        """Read the result of the trial sent first and not read yet (the one before it ended:
        its time counts from now)."""
        try:
            # each step's limit, and the exit's after the last (the harness times it too)
            deadline = time.monotonic() + (len(steps) + 1) * limits.timeout_s + MARGIN_S
            fields = self._read_line(deadline).split()
            if not fields or fields[0] != b"RESULT":
                raise HarnessDied(f"unexpected answer from the harness: {fields!r}")
            (status, timed_out, started, done, maxrss_kb, elapsed_us, total, head_len,
             tail_len, err_len, leftovers) = (int(f) for f in fields[1:])
            output = self._read_output(total, head_len, tail_len, deadline)
            error = self._read_exact(err_len, deadline).decode("utf-8", "replace")
        except (OSError, HarnessDied):
            self.close()
            raise
        skip = len(shared.steps)
        started, done = started + skip, done + skip
        return Evidence(
            steps=len(steps) - prelude,
            started=max(started - prelude, 0),
            done=max(done - prelude, 0),
            exit_code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            timed_out=bool(timed_out),
            error=error if started > done else "",
            # what the preloads printed (their constructors, then a Python preload) comes first
            output=self.preload_output + self.preface.output + shared.output + output,
            output_bytes=(len(self.preload_output) + self.preface.output_bytes
                          + shared.output_bytes + total),
            duration_s=elapsed_us / 1e6,
            peak_rss_mb=maxrss_kb / 1024,
            leftovers=leftovers,
        )

    @property
    def spared_s(self) -> float:
        """The time a trial forked now does not spend that its cold run spends within its
        time limits: the preload's, and the row's prefix's (at most: both are measured from
        here, with the harness's own start and the pipes' round trips)."""
        return self.preload_s + (self.shared.took_s if self.shared else 0.0)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the server and its trial, from any thread: whoever is waiting on it sees it
        die (HarnessDied) and closes it. A server already closed (reaped) is left alone."""
        if self.proc.returncode is None:
            kill_tree(self.proc.pid)

    def close(self) -> None:
        """Stop the server: EOF on its control pipe, then SIGKILL for anything left. Only the
        first call does anything (a later one must not signal a process group whose number
        may have been reused)."""
        if self._ctl < 0:  # closed already: close() leaves -1 here
            return
        for fd in (self._ctl, self._status):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._ctl = self._status = -1
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:  # not reaped, so its pid is still its own
            kill_tree(self.proc.pid)
            self.proc.wait()
        # A server that ended by itself (its pid reaped, and free for another process) took
        # its trial with it. What a preload forked lives in the server's own process group
        # (its session) and is orphaned once the server is gone (a refused preload ends
        # it): that group goes too.
        end_group(self.proc.pid)
        shutil.rmtree(self.scratch, ignore_errors=True)
        os.close(self._owner)


def run_cold(steps: Sequence[HarnessStep], limits: Limits, prelude: int = 0) -> Evidence:
    """One trial in a fresh harness process with nothing preloaded."""
    with Harness() as harness:
        return harness.run(steps, limits, prelude)
