"""report.md: the campaign in Markdown, for people and for CI step summaries.

Ids go in code spans (whatever backticks they hold), prose from users is
escaped, and the repro command of each finding is a fenced block.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from loadfuzz.expect import names_nothing
from loadfuzz.model import step_label
from loadfuzz.report.output import write_file
from loadfuzz.report.view import (
    ENVIRONMENT_WHY,
    OUTCOME_ORDER,
    CampaignView,
    ended_in,
    flags_mode,
    json_key,
    repro_path,
    visible,
)
from loadfuzz.spelling import headline, plain_dlopens, signal_name, spell_sequence


def _md_code(text: str) -> str:
    """An inline code span that holds `text` whatever backticks it contains."""
    text = visible(text)
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text[:1] in "` " or text[-1:] in "` " else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_block(text: str, lang: str = "") -> str:
    """A fenced code block that holds `text` (which may span lines) verbatim."""
    longest = max((len(run) for run in re.findall("^ *(`{3,})", text, re.M)), default=2)
    fence = "`" * (longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


# What Markdown would read as markup in prose: backslashes, code spans, emphasis, links, table
# cells, strike-through; `_` only at a word's edge (in a word, as in lib_foo, it is text)
MARKUP = re.compile(r"[\\`*\[\]|~]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")


def _md_text(text: str) -> str:
    """Prose (an expectation's why, a cause's text, which names libraries) as one Markdown line
    that reads as written: markup characters and HTML escaped."""
    escaped = html.escape(" ".join(visible(text).split()), quote=False)
    return MARKUP.sub(lambda found: "\\" + found.group(), escaped)


def _md_finding(campaign: CampaignView, number: int, record: Mapping[str, Any]) -> list[str]:
    steps = record["sequence"]
    title = " then ".join(_md_code(s["lib"]) for s in steps)
    lines = [f"### {number}. {record['outcome']}: {title} ({_md_code(flags_mode(record))})", ""]
    if not plain_dlopens(record["sequence"]):  # else the title says it all
        lines.append("- Sequence: " + " -> ".join(_md_code(step_label(s)) for s in steps))
    facts = [
        ("Ended in", ended_in(record)),
        ("Signature", record.get("signature")),
        ("Operator", record.get("op")),
        ("Signal", signal_name(record.get("signal"))),
        ("Exit code", record.get("exit_code")),
        ("Detail", record.get("detail")),
    ]
    lines += [f"- {name}: {_md_code(str(value))}" for name, value in facts if value is not None]
    if campaign.status(record) == "expected":
        why = campaign.why.get(json_key(record)) or "covered by the expectations file"
        lines.append(f"- Expected: {_md_text(why)}")
    elif campaign.status(record) == "environment":
        lines.append(f"- Environment: {ENVIRONMENT_WHY}.")
    else:
        lines.append("- Unexpected: no expectation covers it.")
    lines += _md_cause(record)
    where = repro_path(campaign, record)
    lines += ["", f"Reproduce{f' (also {_md_code(where)})' if where else ''}:", ""]
    lines += [_md_block(record.get("repro", ""), "sh"), ""]
    return lines


def last_resort(fix: Mapping[str, Any]) -> str:
    """`Never load ...` -> `Last resort: never load ...`."""
    return f"Last resort: {fix['text'][:1].lower()}{fix['text'][1:]}"


def _md_cause(record: Mapping[str, Any]) -> list[str]:
    """The finding's cause: its paragraph, the copies and how each came in, the entry points
    they bound, and the fixes, numbered, most specific first."""
    cause = record.get("cause")
    if not cause:
        return []
    lines = [f"- Cause ({_md_code(cause['kind'])}, {cause['evidence']}): {_md_text(cause['text'])}"]
    copies = "; ".join(f"{_md_code(c['lib'])} ({_md_text(c['how'])})" for c in cause["libraries"])
    if copies:
        noun = "Copies" if cause["kind"].startswith("duplicate") else "Libraries"
        lines.append(f"- {noun}: {copies}")
    for symbol in cause["symbols"]:
        bound = ", ".join(f"{_md_code(b['from'])} -> {_md_code(b['to'])}" for b in symbol["bindings"])
        lines.append(f"- Symbol {_md_code(symbol['symbol'])}" + (f": bound {bound}" if bound else ""))
    fixes = record.get("fixes", [])
    if fixes:
        lines.append("- Fixes:")
        lines += [f"  {n}. {_md_text(last_resort(f) if f['last_resort'] else f['text'])}"
                  for n, f in enumerate(fixes, start=1)]
    return lines


def _md_stale(entry: Mapping[str, Any], libraries: list[str]) -> str:
    flags = ", ".join(entry.get("flags") or []) or "any flags"
    what = f"{entry.get('outcome')}" + (f", op {_md_code(entry['op'])}" if entry.get("op") else "")
    pair = f"{_md_code(entry.get('first', '?'))} x {_md_code(entry.get('second', '?'))}"
    line = f"- {pair} ({entry.get('orders', 'both')} orders, {flags}): {what}"
    line += f" — {_md_text(entry.get('why', ''))}"
    line += f" ({_md_code(entry['source'])})" if entry.get("source") else ""
    note = names_nothing(entry, libraries)
    return line + (f" — **{_md_text(note)}**" if note else "")


def _md_prediction(prediction: dict | None) -> str | None:
    """How many trials ended as `scan` predicted from the ELF files alone."""
    if not prediction:
        return None
    total = prediction["agree"] + prediction["disagree_count"]
    return f"{prediction['agree']} of {total} trials ended as predicted"


def _md_rows(servers: dict | None) -> str | None:
    """How many matrix rows forked from a row server, and why the others did not."""
    if not servers or not (servers.get("rows_shared") or servers.get("rows_not_shared")):
        return None
    why = "; ".join(f"{_md_text(reason)}: {count}"
                    for reason, count in servers.get("rows_not_shared", {}).items())
    return f"{servers.get('rows_shared', 0)} rows" + (f" (not shared: {why})" if why else "")


def _md_baseline_folder(baseline: Mapping[str, Any] | None) -> str | None:
    if not baseline:
        return None
    version = f" (version {_md_code(str(baseline['version']))})" if baseline.get("version") else ""
    return f"{_md_code(str(baseline['folder']))}{version}"


def _md_since_baseline(campaign: CampaignView, lines: list[str]) -> set[int]:
    """"New since the baseline" (each new finding in full) and "Gone since the baseline" (one
    line each), appended to `lines`; the numbers of the findings shown there."""
    baseline = campaign.summary.get("baseline")
    if not baseline:
        return set()
    new = {json_key(r) for r in baseline.get("new", [])}
    numbered = [(n, r) for n, r in enumerate(campaign.findings, 1) if json_key(r) in new]
    lines += [f"## New since the baseline ({len(numbered)})", ""]
    if not numbered:
        lines += ["None: every finding was already a finding of the baseline.", ""]
    for number, record in numbered:
        lines += _md_finding(campaign, number, record)
    gone = baseline.get("gone", [])
    lines += [f"## Gone since the baseline ({len(gone)})", ""]
    if gone:
        lines += ["Findings of the baseline that this campaign ran the load order of, and did not "
                  "find again:", ""]
    else:
        lines += ["None."]
    lines += [f"- {_md_code(spell_sequence(r['sequence']))}: {_md_code(headline(r))}"
              + (f", ended in {_md_code(ended_in(r) or '')}" if ended_in(r) else "") for r in gone]
    if baseline.get("out_of_scope"):
        lines += ["", f"{baseline['out_of_scope']} other findings of the baseline were out of "
                  "this campaign's scope (it did not run their load orders): not compared."]
    lines.append("")
    return {n for n, _ in numbered}


def render_markdown(campaign: CampaignView) -> str:
    summary = campaign.summary
    libraries = campaign.libraries()
    lines = [f"# {_md_text(campaign.title())}", "", f"**{campaign.verdict()}.**", ""]
    if summary.get("incomplete"):
        lines += ["**Incomplete**: the campaign was stopped before the end; this report shows "
                  "the trials that finished."
                  + (f" Continue with {_md_code(summary['resume'])}." if summary.get("resume") else ""),
                  ""]
    warnings = summary.get("warnings") or []
    if warnings:  # what the command printed on stderr, for whoever reads only this page
        lines += ["**Warnings**:", "", *(f"- {_md_text(w)}" for w in warnings), ""]

    lines += ["## What was tested", ""]
    tested = [
        ("Target", _md_code(str(summary.get("target", "?")))),
        ("Version", summary.get("version") and _md_code(str(summary["version"]))),
        ("Command", _md_code(str(summary.get("command", "matrix")))),
        ("Shard", summary.get("shard") and f"{summary['shard']}: one slice of the campaign's work "
                                          "(`loadfuzz merge` puts the shards together)"),
        ("Flags modes", ", ".join(_md_code(m) for m in campaign.flags_modes()) or None),
        ("Libraries", str(len(libraries))),
        ("Preloaded", ", ".join(_md_code(str(p)) for p in summary.get("preload", [])) or None),
        ("Trials", str(summary.get("trials", len(campaign.records)))),
        ("Started", summary.get("started")),
        ("Finished", summary.get("finished")),
        ("Throughput", summary.get("throughput") and f"{summary['throughput']:.1f} trials/s"),
        ("Shared prefixes", _md_rows(summary.get("servers"))),
        ("Static prediction", _md_prediction(summary.get("prediction"))),
        ("Results folder", summary.get("out") and _md_code(str(summary["out"]))),
        ("Baseline", _md_baseline_folder(summary.get("baseline"))),
    ]
    lines += [f"- {name}: {value}" for name, value in tested if value]
    counts = campaign.outcome_counts()
    lines += ["", "| outcome | trials |", "|---|---:|"]
    ordered = [o for o in OUTCOME_ORDER if counts[o]] + sorted(set(counts) - set(OUTCOME_ORDER))
    lines += [f"| {outcome} | {counts[outcome]} |" for outcome in ordered]
    lines += ["", "<details><summary>Libraries</summary>", ""]
    lines += [f"{n}. {_md_code(lib)}" for n, lib in enumerate(libraries, start=1)]
    lines += ["", "</details>", ""]

    shown = _md_since_baseline(campaign, lines)  # new and gone first, when there is a baseline
    for status, title in (("unexpected", "Unexpected findings"), ("expected", "Expected findings"),
                          ("environment", "Environment problems")):
        numbered = [(n, r) for n, r in enumerate(campaign.findings, 1)
                    if campaign.status(r) == status]
        if status == "environment" and not numbered:
            continue
        lines += [f"## {title} ({len(numbered)})", ""]
        if not numbered:
            lines += ["None.", ""]
        above = [n for n, _ in numbered if n in shown]
        if above:
            lines += [f"New since the baseline, shown above: {', '.join(map(str, above))}.", ""]
        for number, record in numbered:
            if number not in shown:
                lines += _md_finding(campaign, number, record)

    stale = summary.get("stale", [])
    lines += [f"## Stale expectations ({len(stale)})", ""]
    if stale:
        lines += [campaign.stale_intro(), ""]
        lines += [_md_stale(entry, summary.get("libraries", [])) for entry in stale]
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
    return render_markdown(CampaignView.of(summary, trials))


def write_report_md(
    out: Path, summary: Mapping[str, Any], trials: Iterable[Mapping[str, Any]]
) -> Path:
    return write_file(out / "report.md", markdown_summary(summary, trials))
