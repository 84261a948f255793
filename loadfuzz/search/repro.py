"""Repro: from one line of a crash log to the smallest load order that reproduces it.

1. **Read the message** with the signature catalogue (the same table the
   classifier uses): which signature, which operator; in any case, when the
   line's own case matches none (a log that lowered it), the operator then
   spelled as a library of the target registers it. An unknown abort line is
   kept as text to look for, in any case, in what the trials print. A
   loadfuzz command (a record's `repro`) is no log line: it is refused, with
   what to do instead.
2. **Find the candidates**: the libraries that carry the operator (in their
   registrations, or as bytes in the file), and those whose closure holds one.
3. **Try orders** of the candidates, the ones `scan` predicts to collide
   first: each alone, then ordered pairs, then pairs after one other library
   loaded `global` (a registry only reachable through the global scope),
   each under every flags mode (`local`, `global`, `python`), until a trial ends with the same signature and
   operator (or, for an unknown line, prints it), or with the same signature in a
   candidate's step after another candidate's: the same collision, stopped at
   another of the names both copies register. The orders run on every core
   (`--jobs`), and the first one *in this order* that reproduces is the one
   kept, whichever trial ended first.
4. **Shrink** the first that does (`shrink.simplify`) and write a standalone
   `repro.sh`. When nothing reproduces, the result says what was tried.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import shlex
import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any

from loadfuzz import predict, report
from loadfuzz.campaign import Prepared, Watcher
from loadfuzz.classify import load_catalogue
from loadfuzz.elf.opnames import carries_op
from loadfuzz.inventory import Inventory, Library
from loadfuzz.model import Flags, TrialRecord, UsageError
from loadfuzz.model import Sequence as Steps
from loadfuzz.plan import dlopen, step_options
from loadfuzz.search.once import RunOnce
from loadfuzz.search.shrink import simplify

MOST_TRIALS = 2000  # a bound on the orders tried before giving up
MODES = (Flags.LOCAL, Flags.GLOBAL, Flags.PYTHON)  # every way to load a candidate, simplest first
# What makes a line of a log telling (any case): `error` but not `errors` (a test runner's
# "collected 12 items; 0 errors" is no abort line; a RuntimeError's is).
ABORT_WORDS = re.compile(r"abort|terminate|fatal|error(?!s)|re-registering|registered",
                         re.IGNORECASE)
# What a CI log adds to the lines a process printed: colour codes, and a time stamp in front
# of each line (GitHub Actions: `2026-12-05T04:12:00.1234567Z `).
COLOUR = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ISO_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"
TIME_STAMP = re.compile(rf"^{ISO_TIME}\s+", re.MULTILINE)
# What a logger puts in front of a message: Python's logging in its usual format
# (`2026-12-05 04:12:02,124 - app - ERROR - `), syslog (`Dec  5 04:12:02 host app[4242]: `,
# or with an ISO time stamp, then with the process id: `... host app[4242]: `).
LOGGER = re.compile(r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[,.]\d+)? - \S+ - (?P<level>[A-Z]+) - "
                    r"|(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^\s:\[]+(?:\[\d+\])?"
                    rf"|{ISO_TIME} \S+ [^\s:\[]+\[\d+\]): )")
SERIOUS = ("ERROR", "CRITICAL", "FATAL")  # a logger's levels that make a line telling
# pytest's mark of the lines of a failure's exception (`E   RuntimeError: ...`): an error too.
# At least 3 spaces: ExecuTorch's `E 00:00:01.634411 executorch:x.cpp:102] ` has one.
PYTEST_ERROR = re.compile(r"^E {3,}(?=\S)")
# A line quoted whole, as copied into an issue or a chat: 'undefined symbol: x'.
QUOTED = re.compile(r"""^[^\S\n]*(['"`])(.*)\1[^\S\n]*$""", re.MULTILINE)
# What a shell or CPython's faulthandler prints for a process a signal killed, which names no
# message of its own: the signal is what to reproduce. ("Aborted" comes last: an abort's own
# line, when the log has one, says more.)
CRASHES = ((re.compile(r"Segmentation fault"), signal.SIGSEGV),
           (re.compile(r"Bus error"), signal.SIGBUS),
           (re.compile(r"Illegal instruction"), signal.SIGILL),
           (re.compile(r"Floating point exception"), signal.SIGFPE),
           # a shell's word for a SIGKILL (alone, or after the pid): a watchdog's, or a hang's
           (re.compile(r"(?:^\s*|\d\s+)Killed\b"), signal.SIGKILL))
ABORTED = re.compile(r"\bAborted\b")
SPACE = re.compile(r"\s+")
# A log prefix that ends in `] `, and only at the start of a line: glog's and ExecuTorch's
# (`E1205 04:12:00.123456 4242 registry.cc:102] `, `E 00:00:01.634411 executorch:x.cpp:102] `)
# or a bracketed one (`[2026-12-05 04:12:00] `, `[ERROR] `). Never a `] ` inside the message
# (`what():  invalid shape [1, 3] aborting`).
LOG_PREFIX = re.compile(r"^\s*(?:[IWEFD] ?[\d:. ]*\d[^\]\n]*?:\d+\]|\[[^\]\n]*\])\s+")
SHOWN = 300  # characters of the message that the result shows
WORD = re.compile(r"[^\W_]{3}")  # what a message must hold to be looked for: 3 letters or digits


def plain(text: str) -> str:
    """Text as it is compared: without colour codes, any run of white space (line breaks
    too) one space."""
    return SPACE.sub(" ", COLOUR.sub("", text)).strip()


@dataclass(frozen=True)
class Message:
    """What a reported abort says."""

    text: str  # the line that matters
    signature: str | None  # None: no signature of the catalogue matched
    op: str | None
    signal: int | None = None  # a crash line without a message: the signal that killed it
    op_is_file: bool = False  # `op` is a library's path (see `Signature.op_is_file`)
    any_case: bool = False  # the signature matched only ignoring case: so is `op` compared

    def matches(self, record: TrialRecord) -> bool:
        if record.clean:
            return False
        if self.signature is not None:
            return record.signature == self.signature and self.same_op(record.op)
        if self.signal is not None:
            return record.signal == self.signal
        # Anywhere in what the trial printed, not only its one-line detail: an abort's own line
        # is seldom the last (gcc's `terminate called ...` comes before its `what(): ...`), and
        # an `exit` detail quotes none. Lines run together: two lines pasted as one are found.
        needle = plain(self.needle).casefold()
        return needle in plain(record.detail).casefold() or needle in plain(record.printed).casefold()

    def same_op(self, op: str | None) -> bool:
        """Whether a trial's `op` is the message's: a library path by its file name (the
        log may come from another machine, where the library lay elsewhere)."""
        if self.op_is_file and op is not None and self.op is not None:
            return PurePosixPath(op).name == PurePosixPath(self.op).name
        if self.any_case and op is not None and self.op is not None:
            return op.casefold() == self.op.casefold()
        return op == self.op

    def spelled(self, inv: Inventory) -> Message:
        """The message with its operator as a library of `inv` registers it, when it was read
        ignoring case (`any_case`) and one does: a log that lowered `add.Tensor` still finds
        its carriers, whose bytes hold it as it is spelled."""
        if not self.any_case or self.op is None or self.op_is_file:
            return self
        wanted = self.op.casefold()
        spelled = next((op for lib in inv.libraries for op in lib.registers
                        if op.casefold() == wanted), None)
        return self if spelled is None else replace(self, op=spelled)

    @property
    def needle(self) -> str:
        """For an unknown line: its text without the log prefix (time stamps differ)."""
        return needle_of(self.text)


def shown(line: str) -> str:
    """A line as the result shows it: a line longer than SHOWN characters (a log's base64
    blob, say) cut there, with an ellipsis."""
    return line if len(line) <= SHOWN else line[:SHOWN] + "…"


def needle_of(line: str) -> str:
    """A line as it is looked for: without a log prefix that ends in `] `, its first 120
    characters."""
    return LOG_PREFIX.sub("", line, count=1).strip()[:120]


def unprefixed(line: str) -> tuple[str, bool]:
    """A line without the time stamp a CI log, or the prefix a logger or pytest, put in front
    of it (or both), and whether that logger called it an error."""
    serious, line = False, QUOTED.sub(r"\2", line)
    while True:
        if logged := LOGGER.match(line):
            serious = serious or logged["level"] in SERIOUS
        elif logged := PYTEST_ERROR.match(line):
            serious = True
        elif not (logged := TIME_STAMP.match(line)):
            return QUOTED.sub(r"\2", line), serious
        line = line[logged.end():]


def read_message(text: str) -> Message:
    """The signature and operator of the first line the catalogue knows, else the abort line
    (either without the colour codes and time stamps a CI log adds, nor a logger's prefix)."""
    read = [unprefixed(line) for line in COLOUR.sub("", text).splitlines()]
    text = "\n".join(line for line, _ in read)
    serious = {line.strip() for line, error in read if error}
    catalogue = load_catalogue()
    for any_case, sig in itertools.product((False, True), catalogue):
        found = (sig.search_any_case if any_case else sig.search)(text)
        if found:
            op, line = found
            return Message(line, sig.name, op, op_is_file=sig.op_is_file, any_case=any_case)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise UsageError("the message is empty: give the abort line, or --log FILE")
    if len(lines) == 1 and calls_loadfuzz_run(lines[0]):
        raise UsageError("the message is a loadfuzz command (a record's repro), not a line a "
                         "crash printed: run that command itself to rerun its trial, or give "
                         "the line its trial printed")
    # A line with no word (`-`, `...`) is found in almost any output: never a message.
    lines = [line for line in lines if WORD.search(needle_of(line))]
    if not lines:
        raise UsageError("the message has no word to look for (3 letters or digits in a row): "
                         "give the abort line, or --log FILE (--log - reads it from stdin)")
    for pattern, signum in CRASHES:
        crashed = next((line for line in lines if pattern.search(line)), None)
        if crashed is not None:
            return Message(crashed, None, None, int(signum))
    telling = [line for line in lines
               if line in serious or ABORT_WORDS.search(line)]
    aborted = [line for line in telling if ABORTED.search(line)]
    if aborted and len(aborted) == len(telling):  # nothing but "Aborted (core dumped)"
        return Message(aborted[0], None, None, int(signal.SIGABRT))
    return Message((telling or lines)[0], None, None)


COMMAND_HEAD = 4 * 4096 + 16  # four words of at most PATH_MAX bytes, and the spaces between


def calls_loadfuzz_run(line: str) -> bool:
    """Whether the line is a shell command that calls `loadfuzz run` (`.../loadfuzz run ...`,
    `python -m loadfuzz run ...`, the `exec` line of a repro.sh): what a record's `repro`
    says, not what a crash printed."""
    # Only its first four words tell, each at most a path long: shlex builds a word a
    # character at a time, which takes minutes on one line of megabytes (a log with no newline)
    lexer = shlex.shlex(line[:COMMAND_HEAD], posix=True)
    lexer.whitespace_split, lexer.commenters = True, ""
    try:
        words = list(itertools.islice(lexer, 4))
    except ValueError:  # an unbalanced quote: no command
        return False
    words = words[1:] if words[:1] == ["exec"] else words
    if words and PurePosixPath(words[0]).name.startswith("python") and words[1:3] == ["-m", "loadfuzz"]:
        words = words[2:]
    return len(words) > 1 and PurePosixPath(words[0]).name == "loadfuzz" and words[1] == "run"


def carriers(inv: Inventory, message: Message) -> list[Library]:
    """The libraries that register the operator (by their registrations or by its bytes);
    for an `op` that is a library's path, that library and then every other."""
    if message.op is None:
        return list(inv.libraries)
    if message.op_is_file:  # what was loaded before the library it names made it fail
        named = named_in(inv, message)
        return named + [lib for lib in inv.libraries if lib not in named] if named else []
    return [lib for lib in inv.libraries
            if message.op in lib.registers or carries_op(lib.path, message.op)]


def named_in(inv: Inventory, message: Message) -> list[Library]:
    """The libraries a message whose `op` is a library's path names (none for another)."""
    return [lib for lib in inv.libraries if message.op_is_file and message.same_op(str(lib.path))]


def candidates_of(inv: Inventory, message: Message) -> list[Library]:
    """Carriers, then the libraries whose closure holds a carrier."""
    direct = carriers(inv, message)
    ids = {lib.id for lib in direct}
    through = [lib for lib in inv.libraries
               if lib.id not in ids and ids.intersection(lib.closure)]
    return direct + through


def same_collision(message: Message, record: TrialRecord, candidates: Sequence[Library]) -> bool:
    """Whether the trial hit the message's collision, though its registry stopped at another of
    the names both copies register (a registry aborts at the first duplicate it meets: two
    copies of 21 operators always stop at the same one): the same signature, failing in a
    candidate's step after another candidate's."""
    if message.signature is None or record.signature != message.signature or record.step is None:
        return False
    ids = {lib.id for lib in candidates}
    steps = [step.lib for step in record.sequence[:record.step + 1]]
    return steps[-1] in ids and any(lib in ids and lib != steps[-1] for lib in steps[:-1])


def orders(inv: Inventory, candidates: Sequence[Library],
           last: Sequence[Library] = ()) -> Iterator[Steps]:
    """Candidate load orders, simplest and predicted-to-collide first (with `last`, the
    library a message names, the pairs that end with it first)."""
    options = step_options(candidates, MODES)
    singles = [(o,) for o in options]
    pairs = [(a, b) for a, b in itertools.product(options, repeat=2) if a.lib != b.lib]
    ends = {lib.id for lib in last}
    pairs.sort(key=lambda seq: (bool(ends) and seq[-1].lib not in ends,
                                predict.replay(inv, seq).clean))  # predicted collisions first
    yield from singles
    yield from pairs
    others = [dlopen(lib, Flags.GLOBAL) for lib in inv.libraries]
    for before in others:
        for a, b in pairs:
            if before.lib not in (a.lib, b.lib):
                yield (before, a, b)


def reproduce(campaign: Prepared, message: Message, watcher: Watcher) -> dict[str, Any]:
    """Try the candidates' orders until one ends as the message says; the `repro --json` object.
    Every trial goes to the results folder, with summary.json and, when reproduced, repro.sh."""
    inv = campaign.inv
    message = message.spelled(inv)
    candidates = candidates_of(inv, message)
    tried = 0
    found: TrialRecord | None = None

    def result() -> dict[str, Any]:
        return {"message": shown(message.text), "signature": message.signature, "op": message.op,
                "signal": message.signal,
                "candidates": [lib.id for lib in candidates], "reproduced": found is not None,
                "record": found.to_json() if found else None, "tried": tried,
                "out": str(campaign.out)}

    def says(record: TrialRecord) -> bool:
        return message.matches(record) or same_collision(message, record, candidates)

    campaign.folder.open()
    try:
        with campaign.trials(candidates or inv.libraries, keep_printed=True) as trials:
            run = RunOnce(trials, campaign.folder, watcher)
            work = itertools.islice(orders(inv, candidates, named_in(inv, message)),
                                    MOST_TRIALS) if candidates else ()
            first = None
            with contextlib.closing(run.in_order(work, campaign.settings.run.jobs)) as records:
                for record in records:
                    tried += 1
                    if says(record):
                        first = record  # the first that reproduces in this order, as if one by one
                        break
            if first is not None:  # shrunk to an order that still says the message
                found = simplify(first, run, step_options(inv.libraries, MODES), says)
    except KeyboardInterrupt:  # stopped: what was tried so far, marked incomplete
        with contextlib.suppress(OSError):
            report.write_summary_json(campaign.out, {**result(), "incomplete": True})
        raise
    else:  # (before `finally`: the folder is still ours)
        report.write_summary_json(campaign.out, result())
        if found is not None:
            report.write_repro_script(campaign.out, found.to_json())
    finally:
        watcher.close()
        campaign.folder.close()
    return result()
