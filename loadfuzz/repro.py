"""Repro: from one line of a crash log to the smallest load order that reproduces it.

1. **Read the message** with the signature catalogue (the same table the
   classifier uses): which signature, which operator. An unknown abort line
   is kept as text to look for in what the trials print.
2. **Find the candidates**: the libraries that carry the operator (in their
   registrations, or as bytes in the file), and those whose closure holds one.
3. **Try orders** of the candidates, the ones `scan` predicts to collide
   first: each alone, then ordered pairs, then pairs after one other library
   loaded `global` (a registry only reachable through the global scope),
   each under both flags modes, until a trial ends with the same signature and
   operator (or, for an unknown line, prints it).
4. **Shrink** the first that does (`fuzz.simplify`), print it with its repro
   command and write a standalone `repro.sh`. When nothing reproduces, say
   what was tried.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadfuzz import cli, predict, report
from loadfuzz.campaign import ResultsFolder, RunOnce, default_out
from loadfuzz.classify import load_catalogue
from loadfuzz.fuzz import simplify, step_options
from loadfuzz.inventory import Inventory, Library
from loadfuzz.model import Flags, Step, StepKind, TrialRecord, UsageError
from loadfuzz.model import Sequence as Steps

MOST_TRIALS = 2000  # a bound on the orders tried before giving up
ABORT_WORDS = ("abort", "terminate", "fatal", "error", "re-registering", "registered")


@dataclass(frozen=True)
class Message:
    """What a reported abort says."""

    text: str  # the line that matters
    signature: str | None  # None: no signature of the catalogue matched
    op: str | None

    def matches(self, record: TrialRecord) -> bool:
        if record.clean:
            return False
        if self.signature is not None:
            return (record.signature, record.op) == (self.signature, self.op)
        return self.needle in record.detail

    @property
    def needle(self) -> str:
        """For an unknown line: its text without the log prefix (time stamps differ)."""
        words = self.text.split("] ", 1)
        return words[-1].strip()[:120]


def read_message(text: str) -> Message:
    """The signature and operator of the first line the catalogue knows, else the abort line."""
    for sig in load_catalogue():
        found = sig.search(text)
        if found:
            op, line = found
            return Message(line, sig.name, op)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise UsageError("the message is empty: give the abort line, or --log FILE")
    telling = [line for line in lines if any(w in line.lower() for w in ABORT_WORDS)]
    return Message((telling or lines)[0], None, None)


def message_of(args: argparse.Namespace) -> str:
    if (args.message is None) == (args.log is None):
        raise UsageError("give either a MESSAGE or --log FILE (not both)")
    if args.log is None:
        return args.message
    try:
        return args.log.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"--log {args.log}: {exc.strerror or exc}") from None


def carriers(inv: Inventory, message: Message) -> list[Library]:
    """The libraries that register the operator (by their registrations or by its bytes)."""
    if message.op is None:
        return list(inv.libraries)
    needle = message.op.encode()
    return [lib for lib in inv.libraries
            if message.op in lib.registers or needle in lib.path.read_bytes()]


def candidates_of(inv: Inventory, message: Message) -> list[Library]:
    """Carriers, then the libraries whose closure holds a carrier."""
    direct = carriers(inv, message)
    ids = {lib.id for lib in direct}
    through = [lib for lib in inv.libraries
               if lib.id not in ids and ids.intersection(lib.closure)]
    return direct + through


def orders(inv: Inventory, candidates: Sequence[Library]) -> Iterator[Steps]:
    """Candidate load orders, simplest and predicted-to-collide first."""
    options = step_options(candidates, (Flags.LOCAL, Flags.GLOBAL))
    singles = [(o,) for o in options]
    pairs = [(a, b) for a, b in itertools.product(options, repeat=2) if a.lib != b.lib]
    pairs.sort(key=lambda seq: predict.replay(inv, seq).clean)  # predicted collisions first
    yield from singles
    yield from pairs
    others = [Step(StepKind.DLOPEN, lib.id, Flags.GLOBAL, lib.path) for lib in inv.libraries]
    for before in others:
        for a, b in pairs:
            if before.lib not in (a.lib, b.lib):
                yield (before, a, b)


def command(args: argparse.Namespace) -> int:
    message = read_message(message_of(args))
    inv = cli.load_inventory(args)
    candidates = candidates_of(inv, message)
    stamped = default_out(inv.name, inv.version)
    out = args.out or stamped.with_name(f"{stamped.name}-repro")
    folder = ResultsFolder(out, False, inv.locate)
    tried = 0
    found: TrialRecord | None = None
    folder.open()
    try:
        with cli.trials_for(inv, candidates or inv.libraries, args) as trials:
            run = RunOnce(trials, folder)
            for seq in itertools.islice(orders(inv, candidates), MOST_TRIALS) if candidates else ():
                tried += 1
                record = run(seq)
                if message.matches(record):
                    options = step_options(inv.libraries, (Flags.LOCAL, Flags.GLOBAL))
                    found = simplify(record, run, options)
                    break
    finally:
        folder.close()
    result = {"message": message.text, "signature": message.signature, "op": message.op,
              "candidates": [lib.id for lib in candidates], "reproduced": found is not None,
              "record": found.to_json() if found else None, "tried": tried, "out": str(out)}
    report.write_summary_json(out, result)
    if found is not None:
        report.write_repro_script(out, found.to_json())
    print_result(result, args.json, inv)
    return 0 if found is not None else 1


def print_result(result: dict, as_json: bool, inv: Inventory) -> None:
    if as_json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return
    what = f"{result['signature']} {result['op']}" if result["signature"] else "an unknown line"
    print(f"message: {result['message']}  [{what}]")
    if not result["candidates"]:
        print(f"not reproduced: no library of {inv.target} carries {result['op']}")
        return
    print(f"candidates: {', '.join(result['candidates'])}")
    record = result["record"]
    if record is None:
        print(f"not reproduced: {result['tried']} load orders of the candidates tried, under "
              f"both flags modes; none ended that way (trials: {result['out']}/trials.jsonl)")
        return
    seq = " -> ".join(f"{s['flags']}:{s['lib']}" if s["kind"] == "dlopen" else f"py:{s['lib']}"
                      for s in record["sequence"])
    print(f"reproduced after {result['tried']} orders; minimal sequence: {seq}")
    print(f"  {record['outcome']} at step {record['step']}: {record['detail']}")
    print(f"repro: {record['repro']}")
    print(f"script: {Path(result['out']) / 'repro.sh'}")


