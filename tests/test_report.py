"""The results folder the report stage writes from a campaign's JSON data.

The campaign here is synthetic (no trial runs): the library ids are the real
ones of the installed ExecuTorch wheel plus the legacy export plugin fixture,
the expected/unexpected split comes from the real expectations file, and the
findings are a made-up mix of every outcome so that every writer meets each
of them.
"""

from __future__ import annotations

import html.parser
import json
import os
import shlex
import stat
import subprocess
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from loadfuzz import report
from loadfuzz.cli.printing import matrix_text
from loadfuzz.model import Flags, Outcome, Step, StepKind, TrialRecord
from loadfuzz.report import html as matrix_html
from loadfuzz.report import junit, markdown, output, view
from support import (
    AWKWARD,
    FIXTURES,
    KQ,
    PAIRS_WITH_PLUGIN,
    PLUGIN,
    WITH_PLUGIN,
    campaign,
    cells_of,
    large_campaign,
    loadfuzz,
    pair_key,
    record,
)

# --- junit.xml ---------------------------------------------------------------------


def test_junit_has_one_testcase_per_ordered_pair_and_flags_mode(tmp_path: Path) -> None:
    summary, trials = campaign()
    root = ET.parse(junit.write_junit(tmp_path, summary, trials)).getroot()
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == PAIRS_WITH_PLUGIN
    names = [case.get("name") for case in cases]
    assert len(set(names)) == len(names)
    assert f"{KQ} -> {PLUGIN} @ local" in names
    assert {case.get("classname") for case in cases} == {"loadfuzz.executorch"}
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == str(len(cases))


def test_junit_fails_unexpected_findings_and_skips_expected_ones(tmp_path: Path) -> None:
    summary, trials = campaign()
    root = ET.parse(junit.write_junit(tmp_path, summary, trials)).getroot()
    by_name = {case.get("name"): case for case in root.iter("testcase")}
    failed = {name for name, case in by_name.items() if case.find("failure") is not None}
    unexpected = {view.sequence_label(r) for r in summary["unexpected"]}
    assert failed == unexpected and len(failed) == 5

    crash = by_name[f"{summary['unexpected'][0]['sequence'][0]['lib']} -> "
                    f"{summary['unexpected'][0]['sequence'][1]['lib']} @ global"].find("failure")
    assert crash is not None and crash.get("message") == "crash SIGSEGV"
    assert "killed by SIGSEGV" in (crash.text or "")
    assert summary["unexpected"][0]["repro"] in (crash.text or "")

    why = {view.sequence_label(e["record"]): e["why"] for e in summary["expected"]}
    assert len(why) == 6
    for name, text in why.items():
        skipped = by_name[name].find("skipped")
        assert skipped is not None and skipped.get("message") == f"expected: {text}"
    assert root.find("testsuite").get("failures") == "5"


def test_a_stopped_campaign_is_an_error_in_junit_and_says_so_in_every_report(
        tmp_path: Path) -> None:
    summary, trials = campaign()
    summary = dict(summary, incomplete=True, resume="loadfuzz matrix executorch --resume --out x")
    report.write_all(tmp_path, summary, trials, per="pair")
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    [error] = suite.iter("error")  # a CI job gating on it fails
    assert suite.get("errors") == "1" and "--resume --out x" in (error.text or "")
    assert "<strong>Incomplete</strong>" in (tmp_path / "matrix.html").read_text()
    assert "**Incomplete**" in (tmp_path / "report.md").read_text()
    clean = dict(summary, findings=[], unexpected=[], expected=[], stale=[])
    report.write_all(tmp_path, clean, [t for t in trials if t["outcome"] == "clean"], per="pair")
    assert (tmp_path / "report.md").read_text().splitlines()[2] == (
        "**Incomplete, nothing unexpected so far: every trial that ran was clean.**")


def test_junit_skips_pairs_that_did_not_run_unless_a_shard_ran_them(tmp_path: Path) -> None:
    summary, trials = campaign(not_run=3)
    root = ET.parse(junit.write_junit(tmp_path, summary, trials)).getroot()
    not_run = [c for c in root.iter("testcase")
               if (s := c.find("skipped")) is not None and s.get("message") == "not run"]
    assert len(not_run) == 3

    summary["shard"] = "1/2"
    root = ET.parse(junit.write_junit(tmp_path, summary, trials)).getroot()
    assert len(root.findall("./testsuite/testcase")) == PAIRS_WITH_PLUGIN - 3


def test_junit_per_finding_has_one_testcase_per_distinct_finding(tmp_path: Path) -> None:
    summary, trials = campaign()
    summary["findings"].append(summary["findings"][0])  # the same sequence found twice
    root = ET.parse(junit.write_junit(tmp_path, summary, trials, per="finding")).getroot()
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(summary["findings"]) - 1
    assert sum(c.find("failure") is not None for c in cases) == len(summary["unexpected"])


def test_junit_stays_valid_xml_whatever_a_library_id_holds(tmp_path: Path) -> None:
    odd = "extra/plugin\x01\x1b[31m\udcff.so"  # control bytes and an undecodable byte
    summary, trials = campaign(extra=odd)
    path = junit.write_junit(tmp_path, summary, trials)
    names = [c.get("name") for c in ET.parse(path).getroot().iter("testcase")]
    assert f"{KQ} -> extra/plugin\\x01\\x1b[31m\\udcff.so @ global" in names


def test_junit_escapes_exactly_the_characters_xml_cannot_carry() -> None:
    def xml_char(c: int) -> bool:  # XML 1.0's Char production
        return c in (0x9, 0xA, 0xD) or 0x20 <= c <= 0xD7FF or 0xE000 <= c <= 0xFFFD \
            or 0x10000 <= c <= 0x10FFFF

    kept = "".join(chr(c) for c in range(0x110000) if xml_char(c))
    assert junit._x(kept) == kept
    for c in (0x0, 0x8, 0xB, 0xC, 0x1F, 0xD800, 0xDFFF, 0xFFFE, 0xFFFF):
        assert junit._x(chr(c)) == chr(c).encode("unicode_escape").decode("ascii")


def test_junit_time_comes_from_the_trials_durations(tmp_path: Path) -> None:
    summary, trials = campaign()
    root = ET.parse(junit.write_junit(tmp_path, summary, trials)).getroot()
    assert {c.get("time") for c in root.iter("testcase") if c.find("skipped") is None} == {
        "0.050"}


# --- matrix.html -------------------------------------------------------------------


def test_matrix_html_has_a_cell_per_pair_per_flags_mode_with_its_outcome(tmp_path: Path) -> None:
    summary, trials = campaign(extra=AWKWARD)
    page = matrix_html.write_matrix_html(tmp_path, summary, trials).read_text(encoding="utf-8")
    cells = cells_of(page)
    assert len(cells) == WITH_PLUGIN * WITH_PLUGIN * 2
    outcome = {tuple(map(tuple, (s.values() for s in t["sequence"]))): t["outcome"]
               for t in trials}
    for cell in cells:
        first, second, flags = cell["data-first"], cell["data-second"], cell["data-flags"]
        if first == second:
            assert cell["data-outcome"] == "diagonal"
        else:
            assert cell["data-outcome"] == outcome.get(pair_key(first, second, flags), "not-run")
    assert Counter(c["data-outcome"] for c in cells)["not-run"] == 2
    awkward = [c for c in cells if c["data-first"] == AWKWARD and c["data-second"] == KQ]
    assert {c["data-outcome"] for c in awkward} == {"reregister"}
    assert {c["data-status"] for c in awkward} == {"expected"}


def test_matrix_html_escapes_what_a_library_id_holds(tmp_path: Path) -> None:
    summary, trials = campaign(extra=AWKWARD)
    page = matrix_html.write_matrix_html(tmp_path, summary, trials).read_text(encoding="utf-8")
    assert "<légacy>" not in page and "&lt;légacy&gt;" in page
    tooltip = next(c["title"] for c in cells_of(page)
                   if c["data-first"] == KQ and c["data-second"] == AWKWARD)
    assert "outcome: reregister (expected)" in tooltip
    assert "op: quantized_decomposed::add.out" in tooltip
    assert "repro: .venv/bin/loadfuzz run" in tooltip


def test_matrix_html_needs_no_network(tmp_path: Path) -> None:
    summary, trials = campaign()
    page = matrix_html.write_matrix_html(tmp_path, summary, trials).read_text(encoding="utf-8")
    for remote in ("http://", "https://", "<link", " src=", "@import", "url("):
        assert remote not in page


def test_matrix_html_of_a_fuzz_campaign_is_the_findings_table(tmp_path: Path) -> None:
    summary, _ = campaign()
    mode = Flags.GLOBAL
    three = TrialRecord(
        sequence=tuple(Step(StepKind.DLOPEN, lib, mode) for lib in (KQ, "lib/libexecutorch.so",
                                                                     PLUGIN)),
        outcome=Outcome.REREGISTER, step=2, signature="executorch-reregister",
        op="quantized_decomposed::add.out", signal=6, exit_code=None,
        detail="Re-registering quantized_decomposed::add.out", duration_s=0.1, peak_rss_mb=80.0,
        repro="loadfuzz run a b c").to_json()
    fuzz = {**summary, "command": "fuzz", "findings": [three], "unexpected": [three],
            "expected": []}
    page = matrix_html.write_matrix_html(tmp_path, fuzz, [three]).read_text(encoding="utf-8")
    assert cells_of(page) == []
    assert '<table class="findings">' in page and "loadfuzz run a b c" in page


def test_a_fuzz_campaigns_reports_list_only_the_flags_modes_it_was_given(tmp_path: Path) -> None:
    mixed = TrialRecord(
        sequence=(Step(StepKind.DLOPEN, KQ, Flags.GLOBAL), Step(StepKind.DLOPEN, PLUGIN, Flags.LOCAL)),
        outcome=Outcome.CLEAN, step=None, signature=None, op=None, signal=None, exit_code=0,
        detail="every step completed", duration_s=0.1, peak_rss_mb=80.0, repro="x").to_json()
    summary, _ = campaign()
    fuzz = {**summary, "command": "fuzz", "flags": ["global", "local"], "findings": [],
            "unexpected": [], "expected": []}
    report.write_all(tmp_path, fuzz, [mixed], per="finding")
    tested = (tmp_path / "report.md").read_text()
    assert "Flags modes: `global`, `local`\n" in tested and "global/local" not in tested
    assert "global/local" not in (tmp_path / "matrix.html").read_text()


def test_the_progress_line_is_drawn_a_few_times_a_second_not_once_a_trial():
    # on a pty (a CI log) it was one line a trial: 464 KB in a 20 s campaign
    import io

    from loadfuzz.cli.printing import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    progress = Progress("fuzz", stream=terminal)
    _, trials = campaign()
    records = [TrialRecord.from_json(t, locate=lambda lib: Path()) for t in trials] * 100
    for done in records:
        progress.finished(done)
    progress.close()
    lines = terminal.getvalue().split("\r")[1:]
    failed = sum(not done.clean for done in records)
    assert len(lines) <= 3 and lines[-1].startswith(f"fuzz: {len(records)} trials, {failed} failed")


# --- report.md -----------------------------------------------------------------------


def test_report_md_says_what_was_tested_and_counts_outcomes(tmp_path: Path) -> None:
    summary, trials = campaign()
    text = markdown.write_report_md(tmp_path, summary, trials).read_text(encoding="utf-8")
    assert text == report.markdown_summary(summary, trials)
    assert "`executorch`" in text and "`1.5.1`" in text
    for lib in summary["libraries"]:
        assert f"`{lib}`" in text
    for outcome, count in Counter(t["outcome"] for t in trials).items():
        assert f"| {outcome} | {count} |" in text
    assert "**5 unexpected findings: 11 findings, 6 of them expected, 1 stale expectation.**" \
        in text


def test_report_md_counts_trials_not_a_finding_answered_from_memory(tmp_path: Path) -> None:
    # the search ran (PLUGIN, KQ), which failed at its first step; shrinking asked for
    # (PLUGIN,) and got that trial's record from memory: a finding, but no trial of its own
    def failing(*libs: str) -> dict:
        return TrialRecord(
            sequence=tuple(Step(StepKind.IMPORT, lib, Flags.LOCAL) for lib in libs),
            outcome=Outcome.LOAD_ERROR, step=0, signature="python-missing-module", op="numpy",
            signal=None, exit_code=0, detail="ModuleNotFoundError: No module named 'numpy'",
            duration_s=1.2, peak_rss_mb=80.0, repro="loadfuzz run x").to_json()
    ran, shrunk = failing(PLUGIN, KQ), failing(PLUGIN)
    summary, trials = campaign()
    fuzz = {**summary, "command": "fuzz", "trials": len(trials) + 1, "findings": [shrunk],
            "unexpected": [], "expected": [], "environment": [shrunk]}
    text = markdown.write_report_md(tmp_path, fuzz, [*trials, ran]).read_text(encoding="utf-8")
    counts = Counter(t["outcome"] for t in [*trials, ran])
    assert sum(counts.values()) == fuzz["trials"]
    for outcome, count in counts.items():
        assert f"| {outcome} | {count} |" in text
    assert "Environment problems" in text and "No module named 'numpy'" in text


def test_report_md_says_how_many_rows_shared_their_first_step_and_why_others_did_not(
        tmp_path: Path) -> None:
    summary, trials = campaign()
    summary["servers"] = {"servers": 3, "server_start_s": 0.3, "rows_shared": 36,
                          "row_start_s": 0.1, "rows_not_shared": {"the prefix started a thread": 2}}
    text = markdown.write_report_md(tmp_path, summary, trials).read_text(encoding="utf-8")
    assert "- Shared prefixes: 36 rows (not shared: the prefix started a thread: 2)" in text
    del summary["servers"]
    assert "Shared prefixes" not in report.markdown_summary(summary, trials)


def test_report_md_shows_each_finding_with_its_repro_and_why(tmp_path: Path) -> None:
    summary, trials = campaign()
    text = report.markdown_summary(summary, trials)
    unexpected_part = text.split("## Unexpected findings (5)")[1].split("## Expected findings")[0]
    expected_part = text.split("## Expected findings (6)")[1].split("## Stale expectations")[0]
    for finding in summary["unexpected"]:
        assert f"```sh\n{finding['repro']}\n```" in unexpected_part
    for entry in summary["expected"]:
        assert f"```sh\n{entry['record']['repro']}\n```" in expected_part
        assert entry["why"] in expected_part
    assert "SIGSEGV" in unexpected_part and "repro/0" in unexpected_part
    stale = text.split("## Stale expectations (1)")[1]
    assert "`lib/libexecutorch_backend_xnnpack.so` x `lib/libexecutorch_threadpool.so`" in stale
    assert "executorch.toml:entry 3" in stale


def test_report_md_shows_prose_as_written_not_as_markup(tmp_path: Path) -> None:
    summary, trials = campaign()
    why = "known <b>dup</b> | see [the bug](http://x) *twice* in `_C` and lib_foo_bar ~old~"
    summary["expected"][0]["why"] = why
    text = report.markdown_summary(summary, trials)
    assert ("known &lt;b&gt;dup&lt;/b&gt; \\| see \\[the bug\\](http://x) \\*twice\\* in "
            "\\`\\_C\\` and lib_foo_bar \\~old\\~") in text


def test_report_md_keeps_awkward_ids_inside_code_spans(tmp_path: Path) -> None:
    summary, trials = campaign(extra=AWKWARD)
    text = report.markdown_summary(summary, trials)
    assert "``extra/my plugin\\n<légacy> & \"quoted\" 'x' `tick`.so``" in text
    # the repro block holds the command verbatim, a quoted newline included
    finding = next(f for f in summary["findings"] if f["sequence"][1]["lib"] == AWKWARD)
    assert f"```sh\n{finding['repro']}\n```" in text


# --- repro/*.sh ----------------------------------------------------------------------


def test_repro_scripts_run_the_repro_command_exactly(tmp_path: Path) -> None:
    summary, _ = campaign()
    finding = dict(next(f for f in summary["findings"] if f["outcome"] == "reregister"))
    finding["repro"] = shlex.join(["printf", "%s|", AWKWARD, "$HOME"])
    finding["detail"] = "line one\nexit 7"  # a newline must not end the comment
    (script,) = report.write_repro_scripts(tmp_path, [finding])
    assert script == tmp_path / "repro" / "001.sh"
    assert script.stat().st_mode & stat.S_IXUSR
    text = script.read_text(encoding="utf-8")
    assert text.startswith("#!/bin/sh\n# loadfuzz finding 1: reregister executorch-reregister")
    assert "# detail: line one\\nexit 7\n" in text
    ran = subprocess.run([str(script)], capture_output=True, text=True, check=True)
    assert ran.stdout == f"{AWKWARD}|$HOME|"


def test_a_repro_script_names_a_file_whose_name_is_not_utf8_by_its_very_bytes(tmp_path):
    libs = tmp_path / "libs"
    libs.mkdir()
    odd = libs / os.fsdecode(b"libexit\xff7.so")
    odd.write_bytes((FIXTURES / "hostile" / "libfx_exit7.so").read_bytes())
    done = loadfuzz("run", "--json", odd, cwd=tmp_path)
    record = json.loads(done.stdout)
    assert record["outcome"] == "exit"
    script = report.write_repro_script(tmp_path, record)
    assert b"libexit\xff7.so" in script.read_bytes()
    ran = subprocess.run([str(script)], capture_output=True, text=True)
    assert ran.returncode == 1 and "exit" in ran.stdout, ran.stderr


def test_repro_scripts_are_numbered_and_leftovers_removed(tmp_path: Path) -> None:
    summary, _ = campaign()
    findings = summary["findings"]
    written = report.write_repro_scripts(tmp_path, findings)
    assert [p.name for p in written] == [f"{n:03d}.sh" for n in range(1, len(findings) + 1)]
    (tmp_path / "repro" / "notes.txt").write_text("mine")
    report.write_repro_scripts(tmp_path, findings[:2])
    assert sorted(p.name for p in (tmp_path / "repro").iterdir()) == [
        "001.sh", "002.sh", "notes.txt"]


# --- the whole folder -----------------------------------------------------------------


def test_write_all_writes_the_results_folder_and_re_renders_it_alike(tmp_path: Path) -> None:
    summary, trials = campaign(extra=AWKWARD)
    first, second = tmp_path / "first", tmp_path / "second"
    report.write_all(first, summary, trials)
    names = {"summary.json", "report.md", "matrix.html", "junit.xml", "repro"}
    assert {p.name for p in first.iterdir()} == names  # no temporary file left behind
    assert len(list((first / "repro").iterdir())) == len(summary["findings"])

    again = json.loads((first / "summary.json").read_text(encoding="utf-8"))
    assert again == summary
    report.write_all(second, again, trials)
    for name in ("summary.json", "report.md", "matrix.html", "junit.xml", "repro/011.sh"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_summary_json_keeps_an_undecodable_byte_of_a_path(tmp_path: Path) -> None:
    summary = {"target": os.fsdecode(b"/tmp/wheel\xff"), "libraries": [], "findings": []}
    path = report.write_summary_json(tmp_path, summary)
    assert json.loads(path.read_text(encoding="utf-8")) == summary


def test_a_failed_write_leaves_the_old_file_whole(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    summary, trials = campaign()
    path = markdown.write_report_md(tmp_path, summary, trials)
    before = path.read_bytes()

    def refuse(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(output.os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        markdown.write_report_md(tmp_path, {**summary, "version": "9.9"}, trials)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]


def test_matrix_html_column_headers_are_short_with_the_full_id_in_their_title(
        tmp_path: Path) -> None:
    summary, trials = campaign(extra=AWKWARD)
    page = matrix_html.write_matrix_html(tmp_path, summary, trials).read_text(encoding="utf-8")

    class Headers(html.parser.HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.titles: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            values = dict(attrs)
            if tag == "th" and values.get("class") in ("col", "row"):
                self.titles.append(values.get("title") or "")

    headers = Headers()
    headers.feed(page)
    assert headers.titles == summary["libraries"] * 4  # columns, then rows, in both panels
    assert matrix_html.short_name("lib/libexecutorch_kernels_quantized.so") == (
        "executorch_kernels_quantized")
    assert matrix_html.short_name("extension/pybindings/_C.cpython-311-x86_64-linux-gnu.so") == "_C"
    assert matrix_html.short_name(AWKWARD) == "my plugin\\n<légacy> & \"quot…"


class EveryCell(html.parser.HTMLParser):
    """The attributes of every heatmap cell (<td> of a table.matrix)."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[dict[str, str]] = []
        self.in_matrix = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if tag == "table":
            self.in_matrix = "matrix" in values.get("class", "").split()
        elif tag == "td" and self.in_matrix:
            self.cells.append(values)


def test_a_shards_page_shows_in_each_flags_mode_the_rows_it_ran_there(tmp_path: Path) -> None:
    # shard 1 of 2 of a 9-library matrix under two modes: every global pair, no local one
    out = tmp_path / "out"
    done = loadfuzz("matrix", FIXTURES / "corpus", "--flags", "global,local", "--shard", "1/2",
                    "--out", out)
    assert done.returncode == 1, done.stderr
    parser = EveryCell()
    parser.feed((out / "matrix.html").read_text(encoding="utf-8"))
    assert len(parser.cells) == 9 * 9  # the global panel's rows; the local one has none


def test_a_matrix_stopped_before_any_trial_still_draws_its_grid_of_pairs_not_run() -> None:
    summary = {"command": "matrix", "target": "t", "libraries": ["a", "b"], "flags": ["global"],
               "trials": 0, "findings": [], "incomplete": True}
    parser = EveryCell()
    parser.feed(matrix_html.render_html(view.CampaignView.of(summary, [])))
    assert [c["class"] for c in parser.cells if "not-run" in c.get("class", "")]
    assert len(parser.cells) == 4


def test_a_matrix_of_many_libraries_carries_a_trial_only_in_the_cells_of_findings(
        tmp_path: Path) -> None:
    summary, trials = large_campaign(libraries=matrix_html.COMPACT_FROM)
    rows = len({t["sequence"][0]["lib"] for t in trials})  # the shard's rows: 7 of 100
    page = matrix_html.write_matrix_html(tmp_path, summary, trials).read_text(encoding="utf-8")
    parser = EveryCell()
    parser.feed(page)
    assert len(parser.cells) == rows * matrix_html.COMPACT_FROM
    [finding] = cells_of(page)  # the only cell with its trial: the collision
    assert finding["data-outcome"] == "reregister" and finding["data-status"] == "unexpected"
    assert finding["title"].endswith(f"repro: {summary['findings'][0]['repro']}")
    bare = [cell for cell in parser.cells if "data-outcome" not in cell]
    assert all(list(cell) == ["class"] for cell in bare)
    assert Counter(cell["class"] for cell in bare) == {
        "clean clean": len(trials) - 1, "diagonal diagonal": rows,
        "not-run not-run": rows * matrix_html.COMPACT_FROM - rows - len(trials)}


def test_a_matrix_just_below_the_compact_size_keeps_every_cells_trial(tmp_path: Path) -> None:
    summary, trials = large_campaign(libraries=matrix_html.COMPACT_FROM - 1)
    rows = len({t["sequence"][0]["lib"] for t in trials})
    page = matrix_html.write_matrix_html(tmp_path, summary, trials).read_text(encoding="utf-8")
    assert len(cells_of(page)) == rows * (matrix_html.COMPACT_FROM - 1)


def test_a_shards_grid_per_flags_mode_has_the_rows_it_ran_in_that_mode() -> None:
    libs = ["a", "b", "c"]
    # a shard of consecutive pairs: the last row under global, the first under local
    records = [record("c", "a", "global"), record("c", "b", "global"), record("a", "b", "local")]
    summary = {"libraries": libs, "flags": ["global", "local"], "shard": "2/3"}
    grid = matrix_text(summary, records).splitlines()
    # each mode: its title, the column numbers, then one line per row ("  2    .  .     c")
    assert [line.split(":")[0] for line in grid[0::3]] == ["global", "local"]
    assert [grid[2].split(), grid[5].split()] == [["2", ".", ".", "c"], ["0", ".", "?", "a"]]
    assert len(grid) == 6
    # a shard whose slice holds only global pairs prints no empty `local:` grid
    only_global = matrix_text(summary, records[:2]).splitlines()
    assert [line.split(":")[0] for line in only_global if not line.startswith(" ")] == ["global"]


def test_a_shards_grids_show_the_rows_it_ran_and_a_whole_campaigns_every_row(
        tmp_path: Path) -> None:
    """A shard of a 400-library matrix holds two or three rows: its grids are those rows
    (every column), not 160,000 cells that other shards ran."""
    summary, trials = large_campaign(libraries=120, ran=150)  # rows 0 and 1 (119 and 31 pairs)
    firsts = list(dict.fromkeys(t["sequence"][0]["lib"] for t in trials))
    assert len(firsts) == 2
    page = matrix_html.write_matrix_html(tmp_path, summary, trials).read_text(encoding="utf-8")
    parser = EveryCell()
    parser.feed(page)
    assert len(parser.cells) == 2 * 120
    records = [record(t["sequence"][0]["lib"], t["sequence"][1]["lib"], "global") for t in trials]
    grid = matrix_text(summary, records).splitlines()
    assert [line.split()[-1] for line in grid[2:]] == firsts

    whole = {**summary, "shard": None}
    page = matrix_html.write_matrix_html(tmp_path, whole, trials).read_text(encoding="utf-8")
    parser = EveryCell()
    parser.feed(page)
    assert len(parser.cells) == 120 * 120  # the rows that did not run are shown as not run
    assert len(matrix_text(whole, records).splitlines()) == 2 + 120


def test_a_campaign_of_several_targets_names_its_junit_suite_after_each_and_lists_preloads_once(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = loadfuzz("matrix", FIXTURES / "interpose", FIXTURES / "environment", "--flags",
                    "global,python", "--out", out)
    assert done.returncode in (0, 1), done.stderr
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite.get("name") == "loadfuzz.interpose-unversioned_environment-unversioned"
    preload = json.loads((out / "summary.json").read_text())["preload"]
    assert preload and len(preload) == len(set(preload))
