"""junit.xml: the campaign as test cases, so CI systems show findings as failures.

One testcase per ordered pair and flags mode (matrix) or per distinct finding
(fuzz). Unexpected findings fail; expected ones are skipped with their why. A
campaign that stopped before it finished has one more testcase, in error.
Characters XML 1.0 cannot carry are written as escapes.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from loadfuzz.report.output import write_file
from loadfuzz.report.view import (
    ENVIRONMENT_WHY,
    CampaignView,
    json_key,
    sequence_label,
)
from loadfuzz.spelling import explanation, headline

# Characters XML 1.0 cannot carry at all, even as references: the complement of its Char
# production (tab, newline, return, U+0020-U+D7FF, U+E000-U+FFFD, U+10000-U+10FFFF), spelled
# as what is left out, which compiles ten times faster (start-up of every command).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _x(value: object) -> str:
    """Text XML 1.0 can hold: characters it cannot carry at all are written as escapes."""
    return _NOT_XML.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(value))


def _testcase(suite: ET.Element, classname: str, name: str, campaign: CampaignView,
              record: Mapping[str, Any] | None) -> None:
    case = ET.SubElement(suite, "testcase", classname=_x(classname), name=_x(name),
                         time=f"{(record or {}).get('duration_s') or 0:.3f}")
    if record is None:
        ET.SubElement(case, "skipped", message="not run")
        return
    status = campaign.status(record)
    if status == "unexpected" and not campaign.fails(record):  # --fail-on new lets it pass
        ET.SubElement(case, "skipped", message="unexpected, but not new since the baseline "
                                               "(--fail-on new)")
    elif status == "unexpected":
        failure = ET.SubElement(case, "failure", message=_x(headline(record)),
                                type=_x(record["outcome"]))
        failure.text = _x("\n".join([record.get("detail", ""), "", *explanation(record), "",
                                      "reproduce:", record.get("repro", "")]))
    elif status == "expected":
        why = campaign.why.get(json_key(record)) or "covered by the expectations file"
        ET.SubElement(case, "skipped", message=_x(f"expected: {why}"))
    elif status == "environment":
        ET.SubElement(case, "skipped", message=_x(f"environment: {ENVIRONMENT_WHY}"))
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


def render_junit(campaign: CampaignView, per: str) -> str:
    summary = campaign.summary
    # several targets: their labels (`<name>-<version>`), however their paths were written
    targets = summary.get("targets") or [summary.get("target", "")]
    classname = "loadfuzz." + "_".join(target_name(str(target)) for target in targets)
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name=classname)
    if per == "pair":
        pairs = campaign.pairs()
        libraries = campaign.libraries()
        at = {lib: i for i, lib in enumerate(libraries)}
        modes = {mode: i for i, mode in enumerate(campaign.flags_modes())}

        def wanted(pair: tuple[str, str, str]) -> bool:
            return pair[0] in at and pair[1] in at and pair[0] != pair[1] and pair[2] in modes

        if summary.get("shard"):  # a shard runs a slice of the pairs: the others are another
            # shard's, not "not run" (and the whole list is never made)
            listed = sorted(filter(wanted, pairs), key=lambda p: (modes[p[2]], at[p[0]], at[p[1]]))
        else:
            listed = [(a, b, m) for m in modes for a in libraries for b in libraries if a != b]
        listed += sorted(p for p in pairs if not wanted(p))
        for first, second, mode in listed:
            _testcase(suite, classname, f"{first} -> {second} @ {mode}", campaign,
                      pairs.get((first, second, mode)))
    elif per == "finding":
        for record in {json_key(r): r for r in campaign.findings}.values():
            _testcase(suite, classname, sequence_label(record), campaign, record)
    else:
        raise ValueError(f"per must be 'pair' or 'finding', not {per!r}")
    if summary.get("incomplete"):  # a stopped campaign must not read as a passing one
        case = ET.SubElement(suite, "testcase", classname=classname, name="the campaign",
                             time="0.000")
        error = ET.SubElement(case, "error", message="incomplete: the campaign stopped before "
                              "it finished", type="incomplete")
        error.text = _x(f"{summary.get('trials', 0)} trials finished."
                        + (f" Continue with: {summary['resume']}" if summary.get("resume") else ""))
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
    suite.set("errors", str(sum(c.find("error") is not None for c in cases)))
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
    return write_file(out / "junit.xml", render_junit(CampaignView.of(summary, trials), per))
