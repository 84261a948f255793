"""Classify: name what happened in a trial, from what the trial left behind.

`classify(evidence)` is a pure function of the harness's report (how the
process ended, the step trace, the step's error, the captured output). It
first reads the outcome off how the process ended, then lets the signature
catalogue (`signatures.toml`, data, not code) rename it and name the operator.
"""

from __future__ import annotations

import re
import signal as signals
import tomllib
from dataclasses import dataclass
from importlib import resources

from loadfuzz.model import Evidence, Outcome, Verdict
from loadfuzz.spelling import signal_name

DETAIL_LIMIT = 300
# Terminal colour and cursor codes (CSI sequences), which loggers put inside a message.
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


@dataclass(frozen=True)
class Signature:
    name: str
    when: frozenset[Outcome]  # the outcomes (from how the process ended) it may rename
    outcome: Outcome
    pattern: re.Pattern[str]
    environment: bool = False  # a problem of the environment under test, not of the libraries
    op_is_file: bool = False  # `op` is a library's path: its file name is what counts

    def search(self, text: str) -> tuple[str, str] | None:
        """(the operator, the whole line it was found on), or None."""
        return self._search(self.pattern, text)

    def search_any_case(self, text: str) -> tuple[str, str] | None:
        """`search`, ignoring case (a line a log lowered or raised, for `repro`)."""
        return self._search(re.compile(self.pattern.pattern, self.pattern.flags | re.IGNORECASE),
                            text)

    @staticmethod
    def _search(pattern: re.Pattern[str], text: str) -> tuple[str, str] | None:
        found = pattern.search(text)
        if found is None:
            return None
        start = text.rfind("\n", 0, found.start()) + 1
        end = text.find("\n", found.end())
        line = text[start : end if end >= 0 else len(text)].strip()
        return found.group("op"), line


def load_catalogue(text: str | None = None) -> tuple[Signature, ...]:
    """The signature table; by default the one shipped beside this module."""
    if text is None:
        text = resources.files("loadfuzz").joinpath("signatures.toml").read_text()
    return tuple(
        Signature(
            name=entry["name"],
            when=frozenset(Outcome(w) for w in entry["when"]),
            outcome=Outcome(entry["outcome"]),
            pattern=re.compile(entry["pattern"]),
            environment=entry.get("environment", False),
            op_is_file=entry.get("op_is_file", False),
        )
        for entry in tomllib.loads(text)["signature"]
    )


def environment_signatures(catalogue: tuple[Signature, ...] | None = None) -> frozenset[str]:
    """The names of the signatures that mark a problem of the environment, not a finding."""
    return frozenset(s.name for s in (catalogue or load_catalogue()) if s.environment)


def _ending(ev: Evidence) -> tuple[Outcome, int | None]:
    """The outcome read off how the process ended, and the step it ended in (None: after all)."""
    running = ev.started - 1 if ev.started > ev.done else None
    if ev.timed_out:
        return Outcome.TIMEOUT, running
    if ev.error and ev.started > ev.done:
        return Outcome.LOAD_ERROR, running
    if ev.signal == signals.SIGABRT:
        return Outcome.ABORT, running
    if ev.signal is not None:
        return Outcome.CRASH, running
    if running is not None or ev.exit_code != 0 or ev.done < ev.steps:
        return Outcome.EXIT, running
    if ev.done != ev.started:  # more steps ended than began: no harness writes that trace
        return Outcome.EXIT, None
    return Outcome.CLEAN, None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _plain_detail(outcome: Outcome, step: int | None, ev: Evidence, output: str) -> str:
    where = f"during step {step}" if step is not None else "after the last step (at exit)"
    said = _last_line(output)
    said = f": {said}" if said else ""
    if outcome is Outcome.TIMEOUT:
        return f"{'step ' + str(step) if step is not None else 'the exit'} ran past the time limit"
    if outcome is Outcome.LOAD_ERROR:  # its first line: the exception (then its chain)
        return next((line for line in ev.error.splitlines() if line.strip()), "the step failed")
    if outcome is Outcome.ABORT:
        return f"aborted {where}{said}"
    if outcome is Outcome.CRASH:
        return f"killed by {signal_name(ev.signal)} {where}{said}"
    if outcome is Outcome.EXIT and ev.done > ev.started:
        return (f"the process exited with status {ev.exit_code}, but its step trace does not add "
                f"up: {ev.done} ended, {ev.started} began")
    if outcome is Outcome.EXIT:
        return f"the process exited with status {ev.exit_code} {where}{said}"
    return "every step completed"


def classify(ev: Evidence, catalogue: tuple[Signature, ...] | None = None) -> Verdict:
    """The one outcome of a trial, with its signature, operator and one-line detail."""
    catalogue = load_catalogue() if catalogue is None else catalogue
    outcome, step = _ending(ev)
    output = ev.output.decode("utf-8", "replace")
    signature = op = None
    detail = ""
    # A step that failed is named by its error alone (a Python step's: the exception, then its
    # chain), never by what it printed before: a warning that mentions a missing module, say.
    text = ANSI.sub("", ev.error if outcome is Outcome.LOAD_ERROR else (
        f"{ev.error}\n{output}" if ev.error else output))
    for sig in catalogue:
        if outcome in sig.when and (found := sig.search(text)):
            outcome, signature, (op, detail) = sig.outcome, sig.name, found
            break
    detail = (detail or _plain_detail(outcome, step, ev, output))[:DETAIL_LIMIT]
    if ev.leftovers and outcome is not Outcome.TIMEOUT:
        detail += f" ({ev.leftovers} leftover process{'es' if ev.leftovers > 1 else ''} killed)"
    return Verdict(
        outcome=outcome,
        step=step,
        signature=signature,
        op=op,
        signal=ev.signal,
        exit_code=ev.exit_code,
        detail=detail,
    )
