"""The command line: `parser` (the grammar), `commands` (one function per command) and
`printing` (what a terminal shows). `main` runs one command and turns every way it can end
into its exit status: bad input is one line on stderr and 2; a failure of loadfuzz itself
(not of the target, not of the input) is one line, the traceback in `error.log`, and 3."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from loadfuzz import hostenv
from loadfuzz.cli.commands import COMMANDS, CouldNotFinish
from loadfuzz.cli.parser import build_parser, too_long_message
from loadfuzz.model import Stopped, UsageError
from loadfuzz.report.view import visible

COULD_NOT_FINISH = 3
# What to do when the machine ran out of something (the rest of a failure's line says what)
ADVICE = {errno.EMFILE: "raise the open-files limit (ulimit -n) or pass fewer --jobs",
          errno.ENFILE: "the system is out of open files: pass fewer --jobs",
          errno.EAGAIN: "raise the process limit (ulimit -u) or pass fewer --jobs",
          errno.ENOMEM: "free some memory, or pass fewer --jobs",
          errno.ENOSPC: "make room, then run it again",
          errno.EDQUOT: "make room, then run it again"}


def log_failure(error: BaseException, folder: Path | None) -> Path | None:
    """Write the traceback to error.log in `folder` (else the cache folder); where it went."""
    text = "".join(traceback.format_exception(error))
    for place in (folder, hostenv.cache_folder()):
        if place is None:
            continue
        log = place / "error.log"
        existed = log.exists()
        try:
            place.mkdir(parents=True, exist_ok=True)
            with open(log, "a", encoding="utf-8") as file:
                file.write(text)
            return log
        except OSError:  # (a full disk): no empty error.log left behind
            if not existed:
                with contextlib.suppress(OSError):
                    log.unlink()
            continue
    return None


def one_line(error: BaseException) -> str:
    """The error on one line, cut at 300 characters (its traceback goes to error.log)."""
    text = " ".join(str(error).split())[:300] or type(error).__name__
    if isinstance(error, OSError) and error.errno in ADVICE:
        return f"{text}: {ADVICE[error.errno]}"
    return text if isinstance(error, OSError | RuntimeError) else f"{type(error).__name__}: {text}"


def stop_on_signals() -> Callable[[], bool]:
    """SIGINT, SIGTERM and SIGHUP (Ctrl-C, a cancelled CI job, `timeout`, a closed terminal)
    stop a command the same way: `Stopped`, once. The same stop often arrives twice at once
    (`timeout` and CI runners signal the process, then its group): a signal within
    SAME_STOP_S of the first is that one again, and ignored, so that the partial results
    are still written; one after that is not waited for politely. Returns a function that
    says whether a stop came."""
    first: list[float] = []  # when the first stop came

    def stop(signum: int, _frame: object) -> None:
        if not first:
            first.append(time.monotonic())
            raise Stopped(signum)
        if time.monotonic() - first[0] < SAME_STOP_S:
            return
        for again in STOP_SIGNALS:
            signal.signal(again, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    return lambda: bool(first)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SAME_STOP_S = 2.0


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    stopped = stop_on_signals()
    # What is printed may hold what the output's encoding cannot (a message's bytes that are
    # not UTF-8, a library path, under an ASCII locale): escaped, never an error once the
    # work is done and its results written.
    with contextlib.suppress(AttributeError, ValueError):  # not a text stream (a test's)
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        args = build_parser().parse_args(words)
        args.invocation = words
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"loadfuzz: {visible(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        signum = stop.signum if isinstance(stop, Stopped) else signal.SIGINT
        print(f"loadfuzz: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum
    except BrokenPipeError:  # what reads its output went away (`| head`): as SIGPIPE would
        with contextlib.suppress(OSError):  # and no second error when Python flushes at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as exc:  # loadfuzz could not finish: never to be read as a finding
        cause = exc.__cause__ if isinstance(exc, CouldNotFinish) and exc.__cause__ else exc
        if isinstance(cause, OSError) and cause.errno == errno.ENAMETOOLONG:
            # only a name the user gave is that long (a target, a step's library): bad input
            print(f"loadfuzz: {visible(too_long_message(str(cause.filename or '')))}",
                  file=sys.stderr)
            return 2
        folder = exc.folder if isinstance(exc, CouldNotFinish) else None
        what = exc.what if isinstance(exc, CouldNotFinish) and exc.what else one_line(cause)
        log = log_failure(cause, folder)
        where = f"; the traceback is in {log}" if log else ""
        print(f"loadfuzz: could not finish: {visible(what + where)}", file=sys.stderr)
        return COULD_NOT_FINISH
    finally:
        # A stopped command is over. The interpreter's end resets Python's handlers to the
        # default, so the stop's second copy (`timeout` sends two) would kill the process
        # after it said what it did, with another status: from here on it is ignored.
        for signum in STOP_SIGNALS if stopped() else ():
            signal.signal(signum, signal.SIG_IGN)
