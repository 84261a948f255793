"""Report: a campaign's results folder rendered from its JSON data, one module per output.

`markdown` (report.md), `html` (matrix.html), `junit` (junit.xml), `scripts`
(repro/*.sh), all from one `view.CampaignView` of the summary and the trial
records; `write_all` writes them all and summary.json. Rendering only: what
is expected or not comes from the summary.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from loadfuzz.report.html import render_html
from loadfuzz.report.junit import render_junit
from loadfuzz.report.markdown import markdown_summary, render_markdown
from loadfuzz.report.output import staged, write_file
from loadfuzz.report.scripts import write_repro_script, write_repro_scripts
from loadfuzz.report.view import CampaignView

__all__ = ["markdown_summary", "write_all", "write_repro_script", "write_repro_scripts",
           "write_summary_json"]


def write_summary_json(out: Path, summary: Mapping[str, Any]) -> Path:
    return write_file(out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")


def write_all(out: Path, summary: Mapping[str, Any], trials: Iterable[Mapping[str, Any]],
              per: str = "pair") -> None:
    """Every file of the results folder but trials.jsonl (the driver appends that one)."""
    out.mkdir(parents=True, exist_ok=True)
    campaign = CampaignView.of(summary, trials)
    with staged() as stage:  # all of them, or none (a full disk half-way)
        stage.write(out / "report.md", render_markdown(campaign))
        stage.write(out / "matrix.html", render_html(campaign))
        stage.write(out / "junit.xml", render_junit(campaign, per))
        write_repro_scripts(out, campaign.findings, stage.write)
    write_summary_json(out, summary)  # last: a summary.json says every report agrees with it
