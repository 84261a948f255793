"""Writes a campaign's results folder: report.md, matrix.html, junit.xml, repro/*.sh, summary.json.

Rendering only. Every writer takes the campaign's JSON data, the `matrix
--json` summary (with the optional keys the driver adds: "command",
"version", "expected", "preload", "servers", "throughput", "disagreements",
"started", "finished", "shard") and the trial records as dicts (as in trials.jsonl), so a
folder can be re-rendered later from its own summary.json and trials.jsonl.

Which finding is expected comes from the summary, never from re-matching: a
finding listed in "unexpected" is unexpected, any other finding is expected
(with the "why" of the entry in "expected" when the summary has one).

Library ids can hold spaces, newlines, `<`, `&`, non-ASCII and even bytes
that are not UTF-8 (lone surrogates): HTML is escaped with html.escape,
Markdown puts ids in code spans, XML drops nothing but escapes what XML 1.0
cannot hold, and shell comments show control characters as escapes.
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Key = tuple[tuple[str, str, str], ...]  # a trial's sequence: (kind, lib, flags) per step

# How each outcome reads; the order is the legend's and the outcome table's.
OUTCOME_ORDER = ("clean", "reregister", "abort", "crash", "load-error", "exit", "timeout")

# Heatmap cell states: glyph (so colour is not the only cue), colour, legend text.
CELL_STYLES: dict[str, tuple[str, str, str]] = {
    "clean": ("", "#cfe8d4", "clean"),
    "reregister": ("R", "#d7263d", "reregister (operator registered twice)"),
    "abort": ("A", "#f08a24", "abort (SIGABRT, other reason)"),
    "crash": ("C", "#7b2cbf", "crash (other signal)"),
    "load-error": ("L", "#f4c430", "load-error (dlopen failed)"),
    "exit": ("E", "#2a6fdb", "exit (a constructor exited)"),
    "timeout": ("T", "#5c4033", "timeout (killed)"),
    "not-run": ("", "#ffffff", "not run"),
    "diagonal": ("", "#9e9e9e", "same library twice (not a pair)"),
}

FLAGS_MEANING = {"global": "RTLD_NOW | RTLD_GLOBAL", "local": "RTLD_NOW | RTLD_LOCAL"}

# Characters XML 1.0 cannot carry at all, even as references.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# Characters shown as escapes wherever text must stay on one visible line.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_SCRIPT_NAME = re.compile(r"^\d{3,}\.sh$")


# --- the campaign, as the writers see it ------------------------------------------


def _key(record: Mapping[str, Any]) -> Key:
    return tuple((s["kind"], s["lib"], s["flags"]) for s in record["sequence"])


@dataclass(frozen=True)
class _Campaign:
    """The summary plus every trial, with each finding's number and status looked up once."""

    summary: Mapping[str, Any]
    records: dict[Key, Mapping[str, Any]]  # last record per sequence; summary findings win
    findings: list[Mapping[str, Any]]  # the summary's findings, numbered from 1 in this order
    number: dict[Key, int]
    unexpected: frozenset[Key]
    why: dict[Key, str]

    @classmethod
    def of(cls, summary: Mapping[str, Any], trials: Iterable[Mapping[str, Any]]) -> _Campaign:
        findings = list(summary.get("findings", []))
        records = {_key(r): r for r in trials}
        records.update((_key(r), r) for r in findings)
        return cls(
            summary=summary,
            records=records,
            findings=findings,
            number={_key(r): n for n, r in reversed(list(enumerate(findings, start=1)))},
            unexpected=frozenset(_key(r) for r in summary.get("unexpected", [])),
            why={_key(e["record"]): e.get("why", "") for e in summary.get("expected", [])},
        )

    def status(self, record: Mapping[str, Any]) -> str:
        """One of clean, expected, unexpected. A finding the summary lists nowhere counts as
        unexpected: nothing vouched for it."""
        key = _key(record)
        if record["outcome"] == "clean":
            return "clean"
        if key in self.unexpected:
            return "unexpected"
        return "expected" if key in self.number or key in self.why else "unexpected"

    def title(self) -> str:
        summary = self.summary
        name = f"{summary.get('target', '?')} {summary.get('version') or ''}".strip()
        return f"loadfuzz {summary.get('command', 'matrix')}: {name}"

    def verdict(self) -> str:
        unexpected = sum(self.status(r) == "unexpected" for r in self.findings)
        stale = len(self.summary.get("stale", []))
        parts = [f"{_count(len(self.findings), 'finding')}, {len(self.findings) - unexpected}"
                 " of them expected" if self.findings else "every trial was clean"]
        if stale:
            parts.append(_count(stale, "stale expectation"))
        head = _count(unexpected, "unexpected finding") if unexpected else "Nothing unexpected"
        return f"{head}: " + ", ".join(parts)

    def outcome_counts(self) -> Counter[str]:
        return Counter(r["outcome"] for r in self.records.values())

    def libraries(self) -> list[str]:
        """The summary's libraries, then any library a pair trial names that it lacks."""
        named = (s["lib"] for r in self.pair_records() for s in r["sequence"])
        return list(dict.fromkeys([*self.summary.get("libraries", []), *named]))

    def flags_modes(self) -> list[str]:
        """The summary's flags modes, then any mode a pair trial was run under that it lacks."""
        ran = map(_mode, self.pair_records())
        return list(dict.fromkeys([*self.summary.get("flags", []), *ran]))

    def pair_records(self) -> list[Mapping[str, Any]]:
        return [r for r in self.records.values() if len(r["sequence"]) == 2]

    def pairs(self) -> dict[tuple[str, str, str], Mapping[str, Any]]:
        """(first, second, flags mode) -> the record of that two-step trial."""
        return {
            (r["sequence"][0]["lib"], r["sequence"][1]["lib"], _mode(r)): r
            for r in self.pair_records()
        }


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _mode(record: Mapping[str, Any]) -> str:
    """The flags mode a trial ran under: its steps' mode, or "global/local" if they differ."""
    return "/".join(dict.fromkeys(s["flags"] for s in record["sequence"]))


# --- text helpers ------------------------------------------------------------------


def _visible(text: str) -> str:
    """`text` on one line: control characters and undecodable bytes shown as escapes."""
    return _INVISIBLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _step_label(step: Mapping[str, Any]) -> str:
    """A step the way `loadfuzz run` spells it, with the library id: `global:lib/x.so`."""
    prefix = "py" if step["kind"] == "import" else step["flags"]
    return f"{prefix}:{step['lib']}"


def _plain_dlopens(record: Mapping[str, Any]) -> bool:
    """Whether every step of the trial is a dlopen with one and the same flags mode."""
    steps = record["sequence"]
    return len({s["flags"] for s in steps}) == 1 and all(s["kind"] == "dlopen" for s in steps)


def sequence_label(record: Mapping[str, Any]) -> str:
    """`a -> b @ global` for plain dlopens (the pytest plugin's test id form), else each
    step spelled with its own prefix: `global:a -> py:b`."""
    steps = record["sequence"]
    if _plain_dlopens(record):
        return " -> ".join(s["lib"] for s in steps) + f" @ {steps[0]['flags']}"
    return " -> ".join(_step_label(s) for s in steps)


def _signal_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _headline(record: Mapping[str, Any]) -> str:
    """outcome, signature, op (and the signal or exit code where that is the news)."""
    parts = [record["outcome"], record.get("signature"), record.get("op")]
    if record["outcome"] == "crash":
        parts.append(_signal_name(record.get("signal")))
    if record["outcome"] == "exit" and record.get("exit_code") is not None:
        parts.append(f"exit code {record['exit_code']}")
    return " ".join(str(p) for p in parts if p)


def _ended_in(record: Mapping[str, Any]) -> str | None:
    step = record.get("step")
    if step is None or not 0 <= step < len(record["sequence"]):
        return None
    return f"step {step} ({_step_label(record['sequence'][step])})"


def script_name(number: int, total: int) -> str:
    """repro/NNN.sh name of finding `number` (1-based) of `total`: 001.sh, ..., 1000.sh."""
    return f"{number:0{max(3, len(str(total)))}d}.sh"


def _repro_path(campaign: _Campaign, record: Mapping[str, Any]) -> str | None:
    number = campaign.number.get(_key(record))
    return None if number is None else f"repro/{script_name(number, len(campaign.findings))}"


# --- report.md ---------------------------------------------------------------------


def _md_code(text: str) -> str:
    """An inline code span that holds `text` whatever backticks it contains."""
    text = _visible(text)
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text[:1] in "` " or text[-1:] in "` " else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_block(text: str, lang: str = "") -> str:
    """A fenced code block that holds `text` (which may span lines) verbatim."""
    longest = max((len(run) for run in re.findall("^ *(`{3,})", text, re.M)), default=2)
    fence = "`" * (longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


def _md_text(text: str) -> str:
    """Prose from a user (an expectation's why) as one escaped Markdown line."""
    return html.escape(" ".join(_visible(text).split()), quote=False)


def _md_finding(campaign: _Campaign, number: int, record: Mapping[str, Any]) -> list[str]:
    steps = record["sequence"]
    title = " then ".join(_md_code(s["lib"]) for s in steps)
    lines = [f"### {number}. {record['outcome']}: {title} ({_md_code(_mode(record))})", ""]
    if not _plain_dlopens(record):  # else the title says it all
        lines.append("- Sequence: " + " -> ".join(_md_code(_step_label(s)) for s in steps))
    facts = [
        ("Ended in", _ended_in(record)),
        ("Signature", record.get("signature")),
        ("Operator", record.get("op")),
        ("Signal", _signal_name(record.get("signal"))),
        ("Exit code", record.get("exit_code")),
        ("Detail", record.get("detail")),
    ]
    lines += [f"- {name}: {_md_code(str(value))}" for name, value in facts if value is not None]
    if campaign.status(record) == "expected":
        why = campaign.why.get(_key(record)) or "covered by the expectations file"
        lines.append(f"- Expected: {_md_text(why)}")
    else:
        lines.append("- Unexpected: no expectation covers it.")
    where = _repro_path(campaign, record)
    lines += ["", f"Reproduce{f' (also {_md_code(where)})' if where else ''}:", ""]
    lines += [_md_block(record.get("repro", ""), "sh"), ""]
    return lines


def _md_stale(entry: Mapping[str, Any]) -> str:
    flags = ", ".join(entry.get("flags") or []) or "any flags"
    what = f"{entry.get('outcome')}" + (f", op {_md_code(entry['op'])}" if entry.get("op") else "")
    pair = f"{_md_code(entry.get('first', '?'))} x {_md_code(entry.get('second', '?'))}"
    line = f"- {pair} ({entry.get('orders', 'both')} orders, {flags}): {what}"
    line += f" — {_md_text(entry.get('why', ''))}"
    return line + (f" ({_md_code(entry['source'])})" if entry.get("source") else "")


def _md_rows(servers: dict | None) -> str | None:
    """How many matrix rows forked from a row server, and why the others did not."""
    if not servers or not (servers.get("rows_shared") or servers.get("rows_not_shared")):
        return None
    why = "; ".join(f"{_md_text(reason)}: {count}"
                    for reason, count in servers.get("rows_not_shared", {}).items())
    return f"{servers.get('rows_shared', 0)} rows" + (f" (not shared: {why})" if why else "")


def _markdown(campaign: _Campaign) -> str:
    summary = campaign.summary
    libraries = campaign.libraries()
    lines = [f"# {_md_text(campaign.title())}", "", f"**{campaign.verdict()}.**", ""]

    lines += ["## What was tested", ""]
    tested = [
        ("Target", _md_code(str(summary.get("target", "?")))),
        ("Version", summary.get("version") and _md_code(str(summary["version"]))),
        ("Command", _md_code(str(summary.get("command", "matrix")))),
        ("Flags modes", ", ".join(_md_code(m) for m in campaign.flags_modes()) or None),
        ("Libraries", str(len(libraries))),
        ("Preloaded", ", ".join(_md_code(str(p)) for p in summary.get("preload", [])) or None),
        ("Trials", str(summary.get("trials", len(campaign.records)))),
        ("Started", summary.get("started")),
        ("Finished", summary.get("finished")),
        ("Throughput", summary.get("throughput") and f"{summary['throughput']:.1f} trials/s"),
        ("Shared prefixes", _md_rows(summary.get("servers"))),
        ("Results folder", summary.get("out") and _md_code(str(summary["out"]))),
    ]
    lines += [f"- {name}: {value}" for name, value in tested if value]
    counts = campaign.outcome_counts()
    lines += ["", "| outcome | trials |", "|---|---:|"]
    ordered = [o for o in OUTCOME_ORDER if counts[o]] + sorted(set(counts) - set(OUTCOME_ORDER))
    lines += [f"| {outcome} | {counts[outcome]} |" for outcome in ordered]
    lines += ["", "<details><summary>Libraries</summary>", ""]
    lines += [f"{n}. {_md_code(lib)}" for n, lib in enumerate(libraries, start=1)]
    lines += ["", "</details>", ""]

    for status in ("unexpected", "expected"):
        numbered = [(n, r) for n, r in enumerate(campaign.findings, 1)
                    if campaign.status(r) == status]
        lines += [f"## {status.capitalize()} findings ({len(numbered)})", ""]
        if not numbered:
            lines += ["None.", ""]
        for number, record in numbered:
            lines += _md_finding(campaign, number, record)

    stale = summary.get("stale", [])
    lines += [f"## Stale expectations ({len(stale)})", ""]
    if stale:
        lines += ["These entries of the expectations file matched no finding:", ""]
        lines += [_md_stale(entry) for entry in stale]
    else:
        lines.append("None.")
    lines.append("")

    interposed = summary.get("interposition", [])
    if interposed:
        lines += [f"## Where the flags matter ({len(interposed)})", "",
                  "Pairs whose outcome differs between `global` and `local`, and the exported "
                  "symbols both define: under `global` the second library's calls to them bind "
                  "to the first library's copy.", ""]
        lines += [f"- {_md_code(e['first'])} then {_md_code(e['second'])}: global "
                  f"{e['global']}, local {e['local']}; both define "
                  + (", ".join(_md_code(name) for name in e["shared_symbols"]) or "nothing exported")
                  for e in interposed]
        lines.append("")

    disagreements = summary.get("disagreements", [])
    if disagreements:
        lines += [f"## Disagreements ({len(disagreements)})", ""]
        lines += [_md_block(json.dumps(disagreements, indent=2, ensure_ascii=False), "json"), ""]
    return "\n".join(lines)


def markdown_summary(summary: Mapping[str, Any], trials: Iterable[Mapping[str, Any]]) -> str:
    """The text of report.md (the driver also appends it to $GITHUB_STEP_SUMMARY)."""
    return _markdown(_Campaign.of(summary, trials))


def write_report_md(
    out: Path, summary: Mapping[str, Any], trials: Iterable[Mapping[str, Any]]
) -> Path:
    return _write(out / "report.md", markdown_summary(summary, trials))


# --- matrix.html -------------------------------------------------------------------

_CSS = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 18px 0 6px; }
.verdict { font-weight: bold; margin: 4px 0; }
.verdict.bad { color: #b00020; }
.meta { color: #555; margin: 2px 0; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; margin: 10px 0; align-items: center; }
.legend span.item { display: inline-flex; align-items: center; gap: 5px; }
.legend .count { color: #555; }
.swatch { display: inline-block; width: 16px; height: 16px; border: 1px solid #888;
  font: bold 11px/16px monospace; text-align: center; color: #fff; }
#details { position: sticky; top: 0; z-index: 2; background: #fffbe6; border: 1px solid #d8c98a;
  padding: 6px 10px; margin: 8px 0; min-height: 3.2em; font: 12px/1.35 monospace;
  white-space: pre-wrap; word-break: break-all; }
#details.pinned { border-color: #b8860b; box-shadow: 0 0 0 2px #e6c35c; }
.panels { display: flex; flex-wrap: wrap; gap: 8px 32px; align-items: flex-start; }
table.matrix { border-collapse: collapse; }
table.matrix th { font-weight: normal; }
table.matrix th.row { text-align: right; white-space: nowrap; padding: 0 6px 0 0;
  font: 12px/22px monospace; }
table.matrix th.col { vertical-align: bottom; padding: 0 0 4px; width: 22px; }
table.matrix th.col div { writing-mode: vertical-rl; transform: rotate(180deg);
  white-space: nowrap; font: 12px/22px monospace; margin: 0 auto; }
table.matrix th.corner { vertical-align: bottom; text-align: right; padding: 0 6px 4px 0;
  color: #666; font-size: 12px; }
.num { color: #888; }
.dir { color: #888; }
table.matrix td { width: 22px; height: 22px; min-width: 22px; padding: 0; border: 1px solid #fff;
  text-align: center; font: bold 12px/20px monospace; color: #fff; cursor: pointer; }
table.matrix td.expected { opacity: 0.45; }
table.matrix td.unexpected { box-shadow: inset 0 0 0 2px #000; }
table.matrix td.not-run { border: 1px dashed #ccc; }
table.matrix td.diagonal { background-image: repeating-linear-gradient(45deg, transparent 0 3px,
  rgba(255,255,255,.5) 3px 5px); }
table.matrix td.clean, table.matrix td.load-error { color: #222; }
table.matrix tr:hover th.row, table.matrix th.hl { background: #fff0b3; }
table.matrix td:hover { outline: 2px solid #222; }
table.findings { border-collapse: collapse; width: 100%; }
table.findings th, table.findings td { border: 1px solid #ddd; padding: 4px 6px;
  vertical-align: top; text-align: left; }
table.findings tr.unexpected:not(.repro) td:nth-child(2) { color: #b00020; font-weight: bold; }
table.findings td:nth-child(4) { min-width: 48ch; }
table.findings .none { color: #888; }
table.findings td:nth-child(5) { min-width: 32ch; }
table.findings tr.repro td { border-top: none; background: #fafafa; }
table.findings code, table.findings pre { font: 12px monospace; white-space: pre-wrap;
  overflow-wrap: anywhere; margin: 0; }
table.findings code.ended { font-weight: bold; }
""" + "".join(
    f"table.matrix td.{state}, .swatch.{state} {{ background-color: {colour}; }}\n"
    for state, (_glyph, colour, _text) in CELL_STYLES.items()
)

# Hover shows a cell's tooltip in #details, a click pins it there (another click unpins)
# so that its repro command can be copied;
# the row and column headers of the hovered cell light up; the legend counts the cells.
_JS = """
(function () {
  var details = document.getElementById('details');
  var pinned = null;
  function show(cell) { details.textContent = cell.title; }
  function light(cell, on) {
    var table = cell.closest('table');
    var col = table.querySelector('th.col[data-col="' + cell.dataset.col + '"]');
    if (col) { col.classList.toggle('hl', on); }
  }
  document.querySelectorAll('table.matrix td[data-outcome]').forEach(function (cell) {
    cell.addEventListener('mouseenter', function () {
      light(cell, true);
      if (!pinned) { show(cell); }
    });
    cell.addEventListener('mouseleave', function () { light(cell, false); });
    cell.addEventListener('click', function () {
      pinned = pinned === cell ? null : cell;
      details.classList.toggle('pinned', pinned !== null);
      show(cell);
    });
  });
  document.querySelectorAll('.legend [data-count-for]').forEach(function (span) {
    var n = document.querySelectorAll(
      'table.matrix td[data-outcome="' + span.dataset.countFor + '"]').length;
    span.textContent = '(' + n + ')';
  });
  document.body.dataset.ready = 'yes';
})();
"""


def _e(value: object) -> str:
    """Text or attribute value, escaped for HTML (CR kept as a reference, not folded to LF)."""
    return html.escape(str(value), quote=True).replace("\r", "&#13;")


def _attrs(**values: object) -> str:
    """` name="value"` pairs (`class_` is class, `data_x` data-x), skipping None and ""."""
    return "".join(
        f' {name.rstrip("_").replace("_", "-")}="{_e(value)}"'
        for name, value in values.items()
        if value not in (None, "")
    )


def short_name(lib: str, most: int = 28) -> str:
    """A column header's abbreviation of a library id: its file name without `lib`, `.so`
    or the `.cpython-...` tag (`lib/libexecutorch_threadpool.so` -> `executorch_threadpool`),
    cut to `most` characters."""
    name = lib.rsplit("/", 1)[-1]
    name = re.sub(r"(\.cpython-[^.]*|\.abi3)?\.so(\.[0-9.]+)?$", "", name)
    if name.startswith("lib") and len(name) > 3:
        name = name[3:]
    name = _visible(name or lib)
    return name if len(name) <= most else name[: most - 1] + "…"


def _tooltip(campaign: _Campaign, first: str, second: str, mode: str,
             record: Mapping[str, Any] | None) -> str:
    """A cell's tooltip: the pair, then its trial's facts (the repro command verbatim)."""
    lines = [f"{_visible(first)} -> {_visible(second)} @ {mode}"]
    if record is None:
        lines.append("not run" if first != second else "same library twice: not a pair")
        return "\n".join(lines)
    status = campaign.status(record)
    lines.append(f"outcome: {record['outcome']} ({status})")
    facts = [
        ("signature", record.get("signature")),
        ("op", record.get("op")),
        ("ended in", _ended_in(record)),
        ("detail", record.get("detail")),
        ("why", campaign.why.get(_key(record)) if status == "expected" else None),
        ("script", _repro_path(campaign, record)),
    ]
    lines += [f"{name}: {_visible(str(value))}" for name, value in facts if value]
    return "\n".join([*lines, f"repro: {record.get('repro', '')}"])


def _html_cell(campaign: _Campaign, first: str, second: str, mode: str, col: int,
               record: Mapping[str, Any] | None) -> str:
    if record is None:
        state = status = "diagonal" if first == second else "not-run"
    else:
        state, status = record["outcome"], campaign.status(record)
    attrs = _attrs(
        class_=f"{state} {status}",
        data_first=first, data_second=second, data_flags=mode, data_outcome=state,
        data_status=status, data_col=col,
        title=_tooltip(campaign, first, second, mode, record),
    )
    return f"<td{attrs}>{CELL_STYLES.get(state, ('?', '', ''))[0]}</td>"


def _html_panel(campaign: _Campaign, mode: str, libraries: list[str],
                pairs: Mapping[tuple[str, str, str], Mapping[str, Any]]) -> str:
    head = "".join(
        f'<th class="col"{_attrs(title=lib, data_col=c)}><div>'
        f'<span class="num">{c + 1}</span> {_e(short_name(lib))}</div></th>'
        for c, lib in enumerate(libraries)
    )
    rows = []
    for r, first in enumerate(libraries):
        directory, _, name = _visible(first).rpartition("/")
        label = (f'<span class="num">{r + 1}</span> '
                 + (f'<span class="dir">{_e(directory)}/</span>' if directory else "")
                 + _e(name))
        cells = "".join(
            _html_cell(campaign, first, second, mode, c, pairs.get((first, second, mode)))
            for c, second in enumerate(libraries)
        )
        rows.append(f'<tr><th class="row"{_attrs(title=first)}>{label}</th>{cells}</tr>')
    meaning = FLAGS_MEANING.get(mode, "steps with different flags")
    return (
        f'<section class="panel"{_attrs(data_flags=mode)}>'
        f"<h2>{_e(mode)} <small>({_e(meaning)})</small></h2>"
        '<table class="matrix"><thead><tr>'
        '<th class="corner">first &darr; &nbsp; then &rarr;</th>'
        f"{head}</tr></thead><tbody>\n" + "\n".join(rows) + "\n</tbody></table></section>"
    )


def _html_findings(campaign: _Campaign) -> str:
    if not campaign.findings:
        return "<h2>Findings</h2><p>None: every trial was clean.</p>"
    columns = ("#", "status", "outcome", "sequence (the step it ended in marked)", "detail", "why")
    rows = []
    for number, record in enumerate(campaign.findings, start=1):
        status = campaign.status(record)
        if status == "expected":
            why = _e(_visible(campaign.why.get(_key(record)) or "covered by the expectations file"))
        else:
            why = '<span class="none">no expectation covers it</span>'
        sequence = "<br>".join(
            f'<code{" class=ended" if i == record.get("step") else ""}>{i}.&nbsp;'
            f"{_e(_visible(_step_label(s)))}</code>"
            for i, s in enumerate(record["sequence"])
        )
        cells = [str(number), status, _e(_headline(record)), sequence,
                 f"<code>{_e(_visible(record.get('detail') or ''))}</code>", why]
        script = _repro_path(campaign, record)
        repro = (f'<td colspan="{len(columns) - 1}">reproduce'
                 + (f" (<code>{_e(script)}</code>)" if script else "")
                 + f": <pre>{_e(record.get('repro', ''))}</pre></td>")
        rows.append(f'<tr class="{status}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        rows.append(f'<tr class="{status} repro"><td></td>{repro}</tr>')
    head = "".join(f"<th>{_e(name)}</th>" for name in columns)
    return (f"<h2>Findings ({len(campaign.findings)})</h2>"
            f'<table class="findings"><thead><tr>{head}</tr></thead><tbody>\n'
            + "\n".join(rows) + "\n</tbody></table>")


def _html_stale(campaign: _Campaign) -> str:
    stale = campaign.summary.get("stale", [])
    if not stale:
        return ""
    items = "".join(
        f"<li><code>{_e(_visible(e.get('first', '?')))}</code> x "
        f"<code>{_e(_visible(e.get('second', '?')))}</code>: {_e(e.get('outcome', ''))}"
        f"{' op ' + _e(e['op']) if e.get('op') else ''} — {_e(e.get('why', ''))}"
        f"{' (' + _e(e['source']) + ')' if e.get('source') else ''}</li>"
        for e in stale
    )
    return f"<h2>Stale expectations ({len(stale)})</h2><p>Matched no finding:</p><ul>{items}</ul>"


def _html(campaign: _Campaign) -> str:
    summary = campaign.summary
    pairs = campaign.pairs()
    libraries = campaign.libraries()
    unexpected = any(campaign.status(r) == "unexpected" for r in campaign.findings)
    meta = [
        f"target <code>{_e(_visible(str(summary.get('target', '?'))))}</code>",
        f"{len(libraries)} libraries",
        f"{summary.get('trials', len(campaign.records))} trials",
        "flags " + ", ".join(_e(m) for m in campaign.flags_modes()),
    ]
    meta += [f"{name} {_e(summary[name])}" for name in ("started", "finished") if summary.get(name)]
    if summary.get("throughput"):
        meta.append(f"{summary['throughput']:.1f} trials/s")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(campaign.title())}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{_e(campaign.title())}</h1>",
        f'<p class="verdict{" bad" if unexpected else ""}">{_e(campaign.verdict())}.</p>',
        f'<p class="meta">{" · ".join(meta)}</p>',
    ]
    if pairs:
        legend = "".join(
            f'<span class="item"><span class="swatch {state}">{glyph}</span>{_e(text)}'
            f' <span class="count" data-count-for="{state}"></span></span>'
            for state, (glyph, _colour, text) in CELL_STYLES.items()
        )
        legend += ('<span class="item"><span class="swatch reregister" style="opacity:.45">R'
                   "</span>faded: expected</span>"
                   '<span class="item"><span class="swatch reregister" style="box-shadow:inset 0 '
                   '0 0 2px #000">R</span>outlined: unexpected</span>')
        parts += [
            f'<div class="legend">{legend}</div>',
            '<div id="details">Hover over a cell to see its trial; click to pin it.</div>',
            '<div class="panels">',
            *(_html_panel(campaign, mode, libraries, pairs) for mode in campaign.flags_modes()),
            "</div>",
        ]
    parts += [_html_findings(campaign), _html_stale(campaign), f"<script>{_JS}</script>",
              "</body></html>", ""]
    return "\n".join(parts)


def write_matrix_html(
    out: Path, summary: Mapping[str, Any], trials: Iterable[Mapping[str, Any]]
) -> Path:
    """matrix.html: one self-contained page (no network), a heatmap per flags mode."""
    return _write(out / "matrix.html", _html(_Campaign.of(summary, trials)))


# --- junit.xml ---------------------------------------------------------------------


def _x(value: object) -> str:
    """Text XML 1.0 can hold: characters it cannot carry at all are written as escapes."""
    return _NOT_XML.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(value))


def _testcase(suite: ET.Element, classname: str, name: str, campaign: _Campaign,
              record: Mapping[str, Any] | None) -> None:
    case = ET.SubElement(suite, "testcase", classname=_x(classname), name=_x(name),
                         time=f"{(record or {}).get('duration_s') or 0:.3f}")
    if record is None:
        ET.SubElement(case, "skipped", message="not run")
        return
    status = campaign.status(record)
    if status == "unexpected":
        failure = ET.SubElement(case, "failure", message=_x(_headline(record)),
                                type=_x(record["outcome"]))
        failure.text = _x(f"{record.get('detail', '')}\n\nreproduce:\n{record.get('repro', '')}")
    elif status == "expected":
        why = campaign.why.get(_key(record)) or "covered by the expectations file"
        ET.SubElement(case, "skipped", message=_x(f"expected: {why}"))
    if status != "clean":
        ET.SubElement(case, "system-out").text = _x(json.dumps(record, indent=2,
                                                               ensure_ascii=False))


def target_name(target: str) -> str:
    """The target as a JUnit classname part: `executorch`, `executorch` for
    `/x/executorch-1.5.1-cp311-...whl`, the folder name for a directory."""
    name = Path(str(target)).name
    if name.endswith(".whl"):
        name = name.split("-", 1)[0]
    return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "target"


def _junit(campaign: _Campaign, per: str) -> str:
    summary = campaign.summary
    classname = f"loadfuzz.{target_name(str(summary.get('target', '')))}"
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name=classname)
    if per == "pair":
        pairs = campaign.pairs()
        libraries = campaign.libraries()
        wanted = [(a, b, m) for m in campaign.flags_modes() for a in libraries for b in libraries
                  if a != b]
        # A shard runs a slice of the pairs: the others are another shard's, not "not run".
        listed = [p for p in wanted if p in pairs or not summary.get("shard")]
        listed += sorted(set(pairs) - set(wanted))
        for first, second, mode in listed:
            _testcase(suite, classname, f"{first} -> {second} @ {mode}", campaign,
                      pairs.get((first, second, mode)))
    elif per == "finding":
        for record in {_key(r): r for r in campaign.findings}.values():
            _testcase(suite, classname, sequence_label(record), campaign, record)
    else:
        raise ValueError(f"per must be 'pair' or 'finding', not {per!r}")
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
    suite.set("errors", "0")
    suite.set("skipped", str(sum(c.find("skipped") is not None for c in cases)))
    suite.set("time", f"{sum(float(c.get('time', 0)) for c in cases):.3f}")
    if summary.get("started"):
        suite.set("timestamp", _x(summary["started"]))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, "unicode") + "\n"


def write_junit(out: Path, summary: Mapping[str, Any], trials: Iterable[Mapping[str, Any]],
                per: str = "pair") -> Path:
    """junit.xml: per="pair", one testcase per ordered pair and flags mode (a pair not run is
    skipped "not run", or left out when the summary names a "shard"); per="finding", one
    testcase per distinct finding. Unexpected findings fail; expected ones are skipped."""
    return _write(out / "junit.xml", _junit(_Campaign.of(summary, trials), per))


# --- repro/*.sh ------------------------------------------------------------------


def _script(number: int, record: Mapping[str, Any]) -> str:
    comment = [
        f"loadfuzz finding {number}: {_headline(record)}",
        f"sequence: {' -> '.join(_step_label(s) for s in record['sequence'])}",
        f"ended in: {_ended_in(record) or '-'}",
        f"detail: {record.get('detail') or '-'}",
    ]
    lines = ["#!/bin/sh", *(f"# {_visible(line)}" for line in comment),
             f"exec {record['repro']}", ""]
    return "\n".join(lines)


def write_repro_scripts(out: Path, findings: list[Mapping[str, Any]]) -> list[Path]:
    """repro/001.sh, ...: one executable script per finding, in order, that execs its repro
    command; numbered scripts left from an earlier render with more findings are removed."""
    folder = out / "repro"
    folder.mkdir(parents=True, exist_ok=True)
    written = [
        _write(folder / script_name(n, len(findings)), _script(n, record), mode=0o755)
        for n, record in enumerate(findings, start=1)
    ]
    for old in folder.iterdir():
        if _SCRIPT_NAME.match(old.name) and old not in written:
            old.unlink()
    return written


def write_repro_script(out: Path, record: Mapping[str, Any]) -> Path:
    """repro.sh: the one standalone script `loadfuzz repro` leaves."""
    return _write(out / "repro.sh", _script(1, record), mode=0o755)


# --- summary.json and the whole folder -------------------------------------------


def write_summary_json(out: Path, summary: Mapping[str, Any]) -> Path:
    return _write(out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")


def write_all(out: Path, summary: Mapping[str, Any], trials: Iterable[Mapping[str, Any]],
              per: str = "pair") -> None:
    """Every file of the results folder but trials.jsonl (the driver appends that one)."""
    out.mkdir(parents=True, exist_ok=True)
    campaign = _Campaign.of(summary, trials)
    write_summary_json(out, summary)
    _write(out / "report.md", _markdown(campaign))
    _write(out / "matrix.html", _html(campaign))
    _write(out / "junit.xml", _junit(campaign, per))
    write_repro_scripts(out, campaign.findings)


def _write(path: Path, text: str, mode: int = 0o644) -> Path:
    """Write `text` atomically: a temporary file beside `path`, then os.replace.

    Lone surrogates (from undecodable bytes in a path) are written as `\\udcXX`,
    which is exactly their JSON escape and readable text elsewhere.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(text.encode("utf-8", "backslashreplace"))
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
