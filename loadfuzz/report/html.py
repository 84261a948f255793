"""matrix.html: one self-contained page (no network), a heatmap of the pairs per flags mode.

Rows are the library loaded first, columns the one loaded second; each cell
carries its outcome as a glyph and a colour, and its trial as a tooltip (a
click pins it, so the repro command can be copied). From `COMPACT_FROM`
libraries on (a panel of 10,000 cells), only the cells of findings carry their
trial: any other cell is its class and glyph alone, and the script words its
pair and outcome from the headers, so a page of 400 libraries stays a few
megabytes and opens at once. The style sheet and the script are package data
(`matrix.css`, `matrix.js`), inlined into the page.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from loadfuzz.expect import names_nothing
from loadfuzz.model import step_label
from loadfuzz.report.output import write_file
from loadfuzz.report.view import (
    ENVIRONMENT_WHY,
    CampaignView,
    ended_in,
    json_key,
    repro_path,
    visible,
)
from loadfuzz.spelling import GLYPHS, explanation, headline

# Heatmap cell states: glyph (so colour is not the only cue), colour, legend text.
_COLOURS_AND_TEXT: dict[str, tuple[str, str]] = {
    "clean": ("#cfe8d4", "clean"),
    "reregister": ("#d7263d", "reregister (operator registered twice)"),
    "abort": ("#f08a24", "abort (SIGABRT, other reason)"),
    "crash": ("#7b2cbf", "crash (other signal)"),
    "load-error": ("#f4c430", "load-error (dlopen failed)"),
    "exit": ("#2a6fdb", "exit (a constructor exited)"),
    "timeout": ("#5c4033", "timeout (killed)"),
    "not-run": ("#ffffff", "not run"),
    "diagonal": ("#9e9e9e", "same library twice (not a pair)"),
}
CELL_STYLES: dict[str, tuple[str, str, str]] = {
    state: ("" if state == "clean" else GLYPHS.get(state, ""), colour, text)
    for state, (colour, text) in _COLOURS_AND_TEXT.items()
}
COMPACT_FROM = 100  # libraries: from here on, a clean or empty cell is its class and glyph only
FLAGS_MEANING = {"global": "RTLD_NOW | RTLD_GLOBAL", "local": "RTLD_NOW | RTLD_LOCAL",
                 "python": "as Python code loads it: import, torch.ops.load_library, ctypes.CDLL"}


def style_sheet() -> str:
    """matrix.css, then one rule per cell state (its colour)."""
    css = resources.files("loadfuzz.report").joinpath("matrix.css").read_text(encoding="utf-8")
    return css + "".join(
        f"table.matrix td.{state}, .swatch.{state} {{ background-color: {colour}; }}\n"
        for state, (_glyph, colour, _text) in CELL_STYLES.items()
    )


def script() -> str:
    """matrix.js: hover shows a cell's tooltip in #details, a click pins it there (another click
    unpins); the hovered cell's headers light up; the legend counts the cells."""
    return resources.files("loadfuzz.report").joinpath("matrix.js").read_text(encoding="utf-8")


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
    name = visible(name or lib)
    return name if len(name) <= most else name[: most - 1] + "…"


def _tooltip(campaign: CampaignView, first: str, second: str, mode: str,
             record: Mapping[str, Any] | None) -> str:
    """A cell's tooltip: the pair, then its trial's facts (the repro command verbatim)."""
    lines = [f"{visible(first)} -> {visible(second)} @ {mode}"]
    if record is None:
        lines.append("not run" if first != second else "same library twice: not a pair")
        return "\n".join(lines)
    status = campaign.status(record)
    lines.append(f"outcome: {record['outcome']} ({status})")
    facts = [
        ("signature", record.get("signature")),
        ("op", record.get("op")),
        ("ended in", ended_in(record)),
        ("detail", record.get("detail")),
        ("why", campaign.why.get(json_key(record)) if status == "expected" else None),
        ("script", repro_path(campaign, record)),
    ]
    lines += [f"{name}: {visible(str(value))}" for name, value in facts if value]
    lines += [visible(line) for line in explanation(record)]
    return "\n".join([*lines, f"repro: {record.get('repro', '')}"])


def _html_cell(campaign: CampaignView, first: str, second: str, mode: str, col: int,
               record: Mapping[str, Any] | None, edge: bool = False) -> str:
    if record is None:
        state = status = "diagonal" if first == second else "not-run"
    else:
        state, status = record["outcome"], campaign.status(record)
    attrs = _attrs(
        class_=f"{state} {status}" + (" target-start" if edge else ""),
        data_first=first, data_second=second, data_flags=mode, data_outcome=state,
        data_status=status, data_col=col,
        title=_tooltip(campaign, first, second, mode, record),
    )
    return f"<td{attrs}>{CELL_STYLES.get(state, ('?', '', ''))[0]}</td>"


def _compact_cell(state: str, edge: bool) -> str:
    """A clean, diagonal or not-run cell of a large panel: its class and glyph, nothing else
    (matrix.js words its pair and outcome from the row and column headers)."""
    edge_class = " target-start" if edge else ""
    return f'<td class="{state} {state}{edge_class}">{CELL_STYLES[state][0]}</td>'


# every compact cell there is, by (state, edge): a 400-library panel has 160,000 of them
COMPACT_CELLS = {(state, edge): _compact_cell(state, edge)
                 for state in ("clean", "diagonal", "not-run") for edge in (False, True)}


def _html_panel(campaign: CampaignView, mode: str, libraries: list[str],
                pairs: Mapping[tuple[str, str, str], Mapping[str, Any]], shown: set[str]) -> str:
    """One flags mode's grid: a column per library, a row per library in `shown`."""
    starts = target_starts(campaign, libraries)
    compact = len(libraries) >= COMPACT_FROM

    def cell(first: str, second: str, col: int) -> str:
        record = pairs.get((first, second, mode))
        if compact and (record is None or record["outcome"] == "clean"):
            state = "diagonal" if first == second else "not-run" if record is None else "clean"
            return COMPACT_CELLS[state, col in starts]
        return _html_cell(campaign, first, second, mode, col, record, edge=col in starts)

    head = "".join(
        f'<th class="col{" target-start" if c in starts else ""}"'
        f'{_attrs(title=lib, data_col=c)}><div>'
        f'<span class="num">{c + 1}</span> {_e(short_name(lib))}</div></th>'
        for c, lib in enumerate(libraries)
    )
    rows = []
    for r, first in enumerate(libraries):
        if first not in shown:
            continue
        directory, _, name = visible(first).rpartition("/")
        label = (f'<span class="num">{r + 1}</span> '
                 + (f'<span class="dir">{_e(directory)}/</span>' if directory else "")
                 + _e(name))
        cells = "".join(cell(first, second, c) for c, second in enumerate(libraries))
        row_class = ' class="target-start"' if r in starts else ""
        rows.append(f'<tr{row_class}><th class="row"{_attrs(title=first)}>{label}</th>{cells}</tr>')
    meaning = FLAGS_MEANING.get(mode, "steps with different flags")
    return (
        f'<section class="panel"{_attrs(data_flags=mode)}>'
        f"<h2>{_e(mode)} <small>({_e(meaning)})</small></h2>"
        f'<table class="matrix{" compact" if compact else ""}"><thead><tr>'
        '<th class="corner">first &darr; &nbsp; then &rarr;</th>'
        f"{head}</tr></thead><tbody>\n" + "\n".join(rows) + "\n</tbody></table></section>"
    )


def target_starts(campaign: CampaignView, libraries: list[str]) -> set[int]:
    """With several targets, the positions where the next target's libraries begin: thick
    lines there frame each target's block, so the blocks across targets stand out."""
    labels = set(campaign.summary.get("targets") or ())
    owners = [lib.split("/", 1)[0] if lib.split("/", 1)[0] in labels else None
              for lib in libraries]
    return {i for i in range(1, len(owners)) if labels and owners[i] != owners[i - 1]}


def _html_findings(campaign: CampaignView) -> str:
    if not campaign.findings:
        return f"<h2>Findings</h2><p>None: {campaign.no_findings()}.</p>"
    columns = ("#", "status", "outcome", "sequence (the step it ended in marked)", "detail", "why")
    rows = []
    new = {json_key(r) for r in (campaign.summary.get("baseline") or {}).get("new", [])}
    for number, record in enumerate(campaign.findings, start=1):
        status = campaign.status(record)
        if status == "expected":
            why = _e(visible(campaign.why.get(json_key(record)) or "covered by the expectations file"))
        elif status == "environment":
            why = _e(ENVIRONMENT_WHY)
        else:
            why = '<span class="none">no expectation covers it</span>'
        sequence = "<br>".join(
            f'<code{" class=ended" if i == record.get("step") else ""}>{i}.&nbsp;'
            f"{_e(visible(step_label(s)))}</code>"
            for i, s in enumerate(record["sequence"])
        )
        shown = f"{status}, new since the baseline" if json_key(record) in new else status
        cells = [str(number), shown, _e(headline(record)), sequence,
                 f"<code>{_e(visible(record.get('detail') or ''))}</code>", why]
        script = repro_path(campaign, record)
        repro = (f'<td colspan="{len(columns) - 1}">reproduce'
                 + (f" (<code>{_e(script)}</code>)" if script else "")
                 + f": <pre>{_e(record.get('repro', ''))}</pre></td>")
        rows.append(f'<tr class="{status}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        rows.append(f'<tr class="{status} repro"><td></td>{repro}</tr>')
    head = "".join(f"<th>{_e(name)}</th>" for name in columns)
    return (f"<h2>Findings ({len(campaign.findings)})</h2>"
            f'<table class="findings"><thead><tr>{head}</tr></thead><tbody>\n'
            + "\n".join(rows) + "\n</tbody></table>")


def _html_stale(campaign: CampaignView) -> str:
    stale = campaign.summary.get("stale", [])
    if not stale:
        return ""
    libraries = campaign.summary.get("libraries", [])
    items = "".join(
        f"<li><code>{_e(visible(e.get('first', '?')))}</code> x "
        f"<code>{_e(visible(e.get('second', '?')))}</code>: {_e(e.get('outcome', ''))}"
        f"{' op ' + _e(e['op']) if e.get('op') else ''} — {_e(e.get('why', ''))}"
        f"{' (' + _e(e['source']) + ')' if e.get('source') else ''}"
        f"{' — <strong>' + _e(note) + '</strong>' if (note := names_nothing(e, libraries)) else ''}"
        f"</li>"
        for e in stale
    )
    return (f"<h2>Stale expectations ({len(stale)})</h2><p>{_e(campaign.stale_intro())}</p>"
            f"<ul>{items}</ul>")


def render_html(campaign: CampaignView) -> str:
    summary = campaign.summary
    pairs = campaign.pairs()
    libraries = campaign.libraries()
    unexpected = any(campaign.status(r) == "unexpected" for r in campaign.findings)
    meta = [
        f"target <code>{_e(visible(str(summary.get('target', '?'))))}</code>",
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
        f"<style>{style_sheet()}</style></head><body>",
        f"<h1>{_e(campaign.title())}</h1>",
        f'<p class="verdict{" bad" if unexpected else ""}">{_e(campaign.verdict())}.</p>',
        f'<p class="meta">{" · ".join(meta)}</p>',
    ]
    if summary.get("incomplete"):  # as report.md says it
        resume = f" Continue with <code>{_e(summary['resume'])}</code>." if summary.get("resume") else ""
        parts.append(f'<p class="verdict bad"><strong>Incomplete</strong>: the campaign was '
                     f"stopped before the end; this page shows the trials that finished.{resume}</p>")
    if pairs or summary.get("command") == "matrix":  # (none ran: every cell is "not run")
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
            *(_html_panel(campaign, mode, libraries, pairs, set(campaign.rows(mode)))
              for mode in campaign.flags_modes()),
            "</div>",
        ]
    parts += [_html_findings(campaign), _html_stale(campaign), f"<script>{script()}</script>",
              "</body></html>", ""]
    return "\n".join(parts)


def write_matrix_html(
    out: Path, summary: Mapping[str, Any], trials: Iterable[Mapping[str, Any]]
) -> Path:
    """matrix.html: one self-contained page (no network), a heatmap per flags mode."""
    return write_file(out / "matrix.html", render_html(CampaignView.of(summary, trials)))
