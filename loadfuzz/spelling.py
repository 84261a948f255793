"""Spelling: how a sequence, a finding and its cause read for people, the same way on the
terminal, in every report and in the pytest plugin's failures; the names of signals and the
glyph of each outcome."""

from __future__ import annotations

import signal as signals
from collections.abc import Iterable, Mapping
from typing import Any

from loadfuzz.model import Outcome, step_label


def plain_dlopens(steps: Iterable[Mapping[str, Any]]) -> bool:
    """Whether every step (JSON form) is a dlopen, all with one and the same flags mode."""
    steps = list(steps)
    return len({s["flags"] for s in steps}) == 1 and all(s["kind"] == "dlopen" for s in steps)


def spell_sequence(steps: Iterable[Mapping[str, Any]]) -> str:
    """Steps (JSON form) as people read them: `a -> b @ global` when all are dlopens with one
    flags mode (the pytest plugin's test ids), else each with its prefix: `global:a -> py:b`."""
    steps = list(steps)
    if plain_dlopens(steps):
        return " -> ".join(s["lib"] for s in steps) + f" @ {steps[0]['flags']}"
    return " -> ".join(step_label(s) for s in steps)


def signal_name(number: int | None) -> str | None:
    """`SIGSEGV` for 11; None for None."""
    if number is None:
        return None
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def headline(record: Mapping[str, Any]) -> str:
    """A finding (JSON form) in one line: outcome, signature, operator, and the signal or
    exit code where that is the news: `crash SIGSEGV`, `reregister executorch-reregister op`."""
    parts = [record["outcome"], record.get("signature"), record.get("op")]
    if record["outcome"] == Outcome.CRASH.value:
        parts.append(signal_name(record.get("signal")))
    if record["outcome"] == Outcome.EXIT.value and record.get("exit_code") is not None:
        parts.append(f"exit code {record['exit_code']}")
    return " ".join(str(p) for p in parts if p)


def explanation(record: Mapping[str, Any]) -> list[str]:
    """A finding's cause and fixes (JSON form) as plain lines, for the JUnit message, the pytest
    failure, the HTML tooltip and the terminal; no lines when the record has no cause."""
    cause = record.get("cause")
    if not cause:
        return []
    lines = [f"cause: {cause['kind']} ({cause['evidence']})", cause["text"]]
    noun = "copy" if cause["kind"].startswith("duplicate") else "library"
    lines += [f"{noun}: {c['lib']} ({c['how']})" for c in cause["libraries"]]
    for symbol in cause["symbols"]:
        bound = ", ".join(f"{b['from']} -> {b['to']}" for b in symbol["bindings"])
        lines.append(f"symbol: {symbol['symbol']}" + (f", bound {bound}" if bound else ""))
    lines += [f"fix{' (last resort)' if f['last_resort'] else ''}: {f['text']}"
              for f in record.get("fixes", [])]
    return lines


# One letter per outcome, so that colour is never the only cue (terminal grid, heatmap).
GLYPHS = {"clean": ".", "reregister": "R", "abort": "A", "crash": "C", "load-error": "L",
          "exit": "E", "timeout": "T"}
