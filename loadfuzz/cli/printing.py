"""What the commands print on a terminal: tables, the pair grid, summaries, and the progress line.

`--json` output is the same data as JSON; every other line is for people.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadfuzz.expect import names_nothing
from loadfuzz.model import TrialRecord, step_label
from loadfuzz.report.view import visible
from loadfuzz.spelling import GLYPHS, explanation, spell_sequence

if TYPE_CHECKING:  # only named in annotations: printing stays cheap to import
    from loadfuzz.inventory import Inventory, Library
    from loadfuzz.predict import Prediction


def json_text(data: Any) -> str:
    """JSON as every command prints it: UTF-8 whatever a path holds (a byte of a file name that
    is not UTF-8 is a lone surrogate here, written as its `\\udcXX` escape, as in the results
    folder's files)."""
    text = json.dumps(data, indent=2, ensure_ascii=False)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def print_json(data: Any) -> None:
    print(json_text(data))


# --- scan ------------------------------------------------------------------------------


def scan_json(inv: Inventory, predictions: Sequence[Prediction]) -> dict:
    """The `scan --json` object (with `version`, `targets`, `warnings` and each library's
    `missing`)."""
    return {
        "target": inv.target,
        "version": inv.version,
        "targets": list(inv.labels),
        "libraries": [lib.to_json() for lib in inv.libraries],
        "predicted": [p.pair_json() for p in predictions],
        "warnings": list(inv.warnings),
    }


def registry_column(lib: Library) -> str:
    if lib.registry_owner:
        return "owner"
    return ", ".join(f"{kind}:{len(ops)}" for kind, ops in lib.registrations if ops) or "-"


def scan_text(inv: Inventory, predictions: Sequence[Prediction]) -> str:
    """A table of the libraries, then the predicted collisions with their reasons."""
    version = f" {inv.version}" if inv.version else ""
    lines = [f"{inv.name}{version}: {len(inv.libraries)} libraries under {inv.root}", ""]
    shown = {lib.id: visible(lib.id) for lib in inv.libraries}  # a row per library, aligned
    width = max(map(len, shown.values()))
    lines.append(f"{'library':<{width}}  {'role':<16} {'closure':>7}  {'python':<6}  registers")
    for lib in inv.libraries:
        flags = "yes" if lib.needs_python else "-"
        lines.append(f"{shown[lib.id]:<{width}}  {lib.role.value:<16} {len(lib.closure):>7}  "
                     f"{flags:<6}  {registry_column(lib)}")
        if lib.missing:
            lines.append(f"{'':<{width}}  missing: {', '.join(lib.missing)}")
    lines.append("")
    lines.append("registers: owner = defines a registry's entry point; kind:N = N operators "
                 "registered into that registry (executorch or torch)")
    lines.append("")
    if not predictions:
        lines.append("predicted collisions: none (every ordered pair should load clean)")
    else:
        lines.append(f"predicted collisions: {len(predictions)} (ordered pair @ flags)")
        for p in predictions:
            first, second = p.sequence[0], p.sequence[1]
            lines.append(f"  {first.lib} -> {second.lib} @ {first.flags.value}: "
                         f"{p.outcome.value} {p.op or ''} ({p.confidence} confidence)")
            lines.append(f"      {p.why}")
    lines += [f"warning: {warning}" for warning in inv.warnings]
    return "\n".join(map(visible, lines))  # (a row's id is escaped already, for its width)


# --- run -------------------------------------------------------------------------------


def describe_run(record: TrialRecord) -> str:
    """One line per step (done, where it ended, not reached), then the verdict and the repro."""
    lines = []
    for index, step in enumerate(record.sequence):
        state = "done"
        if record.step == index:
            state = f"<- {record.outcome.value}"
        elif record.step is not None and index > record.step:
            state = "not reached"
        lines.append(f"step {index}  {step.kind.value:<6} {step.flags.value:<6} {step.lib}  {state}")
    lines.append(f"outcome: {record.outcome.value}"
                 + (f"  signature: {record.signature}" if record.signature else "")
                 + (f"  op: {record.op}" if record.op else ""))
    lines.append(f"detail: {record.detail}")
    lines += explanation(record.to_json())
    lines.append(f"time: {record.duration_s:.3f} s, peak RSS {record.peak_rss_mb:.1f} MB")
    lines.append(f"repro: {record.repro}")
    return "\n".join(map(visible, lines))  # a name or a message cannot drive the terminal


# --- campaigns -------------------------------------------------------------------------


def matrix_text(summary: dict, records: Sequence[TrialRecord]) -> str:
    """The pair matrix on a terminal: one grid per flags mode, rows first, columns second;
    a shard's grid has the rows it ran in that mode (`?`: a pair of such a row it did not),
    and a mode it ran no pair of has none."""
    libs = summary["libraries"]
    cells = {(r.sequence[0].lib, r.sequence[1].lib, r.sequence[0].flags.value): r.outcome.value
             for r in records if len(r.sequence) == 2}
    ran = {(first, mode) for first, _, mode in cells}
    legend = ", ".join(f"{glyph} {outcome}" for outcome, glyph in GLYPHS.items())
    lines = []
    for mode in summary["flags"]:
        if summary.get("shard") and not any(ran_mode == mode for _, ran_mode in ran):
            continue  # a shard whose slice holds no pair of this mode: no empty grid
        lines.append(f"{mode}: row = loaded first, column = loaded second ({legend})")
        lines.append("     " + "".join(f"{n % 100:>3}" for n in range(len(libs))))
        for row, first in enumerate(libs):
            if summary.get("shard") and (first, mode) not in ran:
                continue
            marks = (" " if first == second else GLYPHS.get(cells.get((first, second, mode), ""), "?")
                     for second in libs)  # one character each, in a column three wide
            lines.append(f"{row:>3}    " + "  ".join(marks) + f"  {visible(first)}")
    return "\n".join(lines)


def say(line: str) -> None:
    """Print one line for people, control characters and undecodable bytes as escapes: a
    library's name or a trial's message cannot break a line or drive the terminal."""
    print(visible(line))


def print_summary(summary: dict) -> None:
    """A campaign's summary for people: counts, each finding on a line, where the report is."""
    findings, unexpected = summary["findings"], summary["unexpected"]
    shard = f" (shard {summary['shard']})" if summary.get("shard") else ""
    say(f"{summary['command']} {summary['target']}{shard}: {summary['trials']} trials, "
          f"{len(findings)} findings, {len(unexpected)} unexpected, "
          f"{len(summary['stale'])} stale expectations")
    if summary.get("baseline"):
        say(baseline_line(summary["baseline"]))
    if summary.get("throughput") is not None:  # (0.0 too: a search that ran nothing)
        say(f"throughput: {summary['throughput']} trials/s")
    if summary.get("prediction"):
        prediction = summary["prediction"]
        total = prediction["agree"] + prediction["disagree_count"]
        shards = (" the shards ran (their tallies added: a trial two shards ran counts twice)"
                  if summary.get("merged_from") and total != summary["trials"] else "")
        say(f"prediction: {prediction['agree']} of {total} trials{shards} ended as scan "
            "predicted")
    for record in findings:
        mark = ("UNEXPECTED" if record in unexpected
                else "environ.  " if record in summary.get("environment", []) else "expected  ")
        what = record["signature"] or record["outcome"]
        op = f" {record['op']}" if record["op"] else ""
        say(f"  {mark} {record['outcome']:<10} {spell_sequence(record['sequence'])}  [{what}{op}]")
    for entry in summary.get("interposition", []):
        say(f"  flags matter: {entry['first']} -> {entry['second']}: global {entry['global']}, "
              f"local {entry['local']}; both define {', '.join(entry['shared_symbols']) or '-'}")
    for entry in summary["stale"]:  # `->`: an entry for that order only (orders = as-written)
        between = "->" if entry.get("orders") == "as-written" else "x"
        note = names_nothing(entry, summary.get("libraries", []))
        say(f"  stale expectation: {entry['first']} {between} {entry['second']} "
              f"({entry['source']}{'; ' + note if note else ''})")
    if shard and summary["stale"]:
        say("  (stale in this shard's slice only: `loadfuzz merge` decides over the whole "
              "campaign)")
    say(f"report: {Path(summary['out']) / 'report.md'}  (matrix.html, junit.xml, repro/)")


def baseline_line(baseline: dict) -> str:
    """`baseline <folder>: N new, M gone, K still` (and what it could not compare)."""
    scope = f", {baseline['out_of_scope']} out of scope" if baseline.get("out_of_scope") else ""
    return (f"baseline {baseline['folder']}: {len(baseline['new'])} new, "
            f"{len(baseline['gone'])} gone, {len(baseline['still'])} still{scope}")


def print_repro(result: dict, inv: Inventory) -> None:
    what = (f"{result['signature']} {result['op']}" if result["signature"]
            else f"killed by {signal.Signals(result['signal']).name}" if result.get("signal")
            else "an unknown line")
    say(f"message: {result['message']}  [{what}]")
    if not result["candidates"]:
        say(f"not reproduced: no library of {inv.target} carries {result['op']}")
        return
    say(f"candidates: {', '.join(result['candidates'])}")
    record = result["record"]
    if record is None:
        say(f"not reproduced: {result['tried']} load orders of the candidates tried, under "
              f"every flags mode; none ended that way (trials: {result['out']}/trials.jsonl)")
        return
    seq = " -> ".join(step_label(s) for s in record["sequence"])
    say(f"reproduced after {result['tried']} orders; minimal sequence: {seq}")
    say(f"  {record['outcome']} at step {record['step']}: {record['detail']}")
    if result["op"] and record["op"] and record["op"] != result["op"]:
        # (only where a library registers the message's operator: a line cut short,
        # `add.ou`, still finds its collision, but no copy carries `add.ou`)
        carried = any(result["op"] in lib.registers for lib in inv.libraries
                      if lib.id in result["candidates"])
        say(f"  the same collision: the registry stopped at {record['op']}, the first duplicate "
              f"it met" + (f"; the copies also both carry {result['op']}" if carried else ""))
    say(f"repro: {record['repro']}")
    say(f"script: {Path(result['out']) / 'repro.sh'}")


REDRAW_S = 0.1  # a terminal's progress line is drawn again at most this often (a log of a pty
# took a line a trial: 23 KB/s on a fast corpus)


class Progress:
    """done / total, findings so far and the rate, on a terminal only (a campaign's Watcher)."""

    def __init__(self, label: str, total: int = 0, stream: Any = sys.stderr):
        self.total, self.label, self.stream = total, label, stream
        self.enabled = bool(getattr(stream, "isatty", lambda: False)())
        self.started = self.drawn = time.monotonic()
        self.done = self.failed = 0

    def planned(self, count: int) -> None:
        self.total = count

    def skipped(self, count: int) -> None:
        self.done += count

    def finished(self, record: TrialRecord) -> None:
        self.done += 1
        self.failed += not record.clean
        if self.enabled and time.monotonic() - self.drawn >= REDRAW_S:
            self._draw()

    def _draw(self) -> None:
        """The line, again (failed trials: not the findings, which are known at the end)."""
        self.drawn = time.monotonic()
        rate = self.done / max(self.drawn - self.started, 1e-9)
        total = f"/{self.total}" if self.total else ""
        self.stream.write(f"\r{self.label}: {self.done}{total} trials, "
                          f"{self.failed} failed, {rate:.1f} trials/s ")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.done:
            self._draw()
            self.stream.write("\n")

