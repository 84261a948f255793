"""`--baseline`: what changed since an earlier campaign, e.g. the previous release's.

The story, on executorch's `lib/*` under `local` (56 or 72 pairs, a second or
two each):

- release 1 has no export plugin: no finding. It is the first baseline.
- release 2 adds the legacy plugin, which collides with the quantized kernels
  in both load orders: two findings, both new since release 1, so even
  `--fail-on new` fails.
- release 3 ships the same: against release 2 both findings are still there,
  so `--fail-on new` passes (the default `--fail-on unexpected` does not);
  moving and renaming release 2's folder changes nothing.
- release 4 ships a fixed plugin (same file name, no operators of its own):
  against release 2 both findings are gone.
- release 5 drops the plugin: release 2's findings are out of its scope (it
  never loads the plugin), neither gone nor still.

Then the report's order, the refusals, and the identity of hand-written
records whose ids carry a target's version (`executorch-1.4.1/...` and
`executorch-1.5.1/...` are the same library).
"""

import json
import shutil
import xml.etree.ElementTree as ET

import pytest

from loadfuzz.baseline import Baseline, identity, normal_id
from loadfuzz.model import UsageError
from support import EXPECTATIONS, FIXTURES, KQ, LEGACY_PLUGIN, PLUGIN, loadfuzz

LIB_ONLY = ("matrix", "executorch", "--select", "lib/*", "--flags", "local", "--jobs", "2")
WITH_PLUGIN = (*LIB_ONLY, "--add", LEGACY_PLUGIN, "--select", "extra/*")
# Both load orders of the seed collision, under `local`.
COLLISION = [[PLUGIN, KQ], [KQ, PLUGIN]]


def campaign(out, *words):
    """A campaign into `out`: (exit status, what it printed, its summary.json)."""
    done = loadfuzz(*words, "--out", out)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, done.stdout, json.loads((out / "summary.json").read_text())


def pairs(records):
    return [[step["lib"] for step in record["sequence"]] for record in records]


def compared(baseline):
    """A `baseline` object with each record as what makes it that trial and that finding (the
    rest, its duration or the time in its detail, differs from run to run)."""
    def verdict(r):
        return (r["sequence"], r["outcome"], r["step"], r["signature"], r["op"])
    return {key: [verdict(r) for r in value] if isinstance(value, list) else value
            for key, value in baseline.items()}


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    base = tmp_path_factory.mktemp("releases")
    fixed = base / "fixed-plugin" / LEGACY_PLUGIN.name  # the plugin's next version: clean
    fixed.parent.mkdir()
    shutil.copy(FIXTURES / "hostile" / "libfx_clean.so", fixed)
    runs = {"1": campaign(base / "1", *LIB_ONLY)}
    runs["2"] = campaign(base / "2", *WITH_PLUGIN, "--baseline", base / "1", "--fail-on", "new")
    runs["3"] = campaign(base / "3", *WITH_PLUGIN, "--baseline", base / "2", "--fail-on", "new")
    runs["3, default --fail-on"] = campaign(base / "3b", *WITH_PLUGIN, "--baseline", base / "2")
    runs["4"] = campaign(base / "4", *LIB_ONLY, "--add", fixed, "--select", "extra/*",
                         "--baseline", base / "2")
    runs["5"] = campaign(base / "5", *LIB_ONLY, "--baseline", base / "2")
    moved = base / "elsewhere" / "executorch-1.5.1-renamed"
    moved.parent.mkdir()
    shutil.move(base / "2", moved)
    runs["3, baseline moved"] = campaign(base / "3m", *WITH_PLUGIN, "--baseline", moved,
                                         "--fail-on", "new")
    return base, runs


def test_release_1_without_a_plugin_has_no_finding(releases):
    _, runs = releases
    status, _, summary = runs["1"]
    assert status == 0 and summary["findings"] == [] and "baseline" not in summary


def test_the_plugin_of_release_2_brings_two_new_findings_and_fails_on_new(releases):
    base, runs = releases
    status, printed, summary = runs["2"]
    baseline = summary["baseline"]
    assert status == 1
    assert pairs(baseline["new"]) == COLLISION
    assert baseline["new"] == summary["findings"]
    assert (baseline["gone"], baseline["still"], baseline["out_of_scope"]) == ([], [], 0)
    assert baseline["folder"] == str(base / "1") and baseline["version"] == "1.5.1"
    assert f"baseline {base / '1'}: 2 new, 0 gone, 0 still\n" in printed


def test_release_3_with_the_same_findings_has_them_still_and_passes_fail_on_new(releases):
    _, runs = releases
    status, printed, summary = runs["3"]
    baseline = summary["baseline"]
    assert status == 0  # unexpected, but already in the baseline
    assert pairs(summary["unexpected"]) == COLLISION
    assert pairs(baseline["still"]) == COLLISION
    assert (baseline["new"], baseline["gone"], baseline["out_of_scope"]) == ([], [], 0)
    assert ": 0 new, 0 gone, 2 still\n" in printed
    status, _, summary = runs["3, default --fail-on"]
    assert status == 1 and compared(summary["baseline"]) == compared(baseline)


def test_junit_and_the_report_fail_exactly_when_the_exit_status_does(releases):
    """A CI that gates on junit.xml or reads report.md sees what the exit status says:
    under --fail-on new, unexpected findings already in the baseline do not fail."""
    base, runs = releases
    moved = "elsewhere/executorch-1.5.1-renamed"  # where the fixture moved release 2's folder
    for run, folder, failing in (("2", moved, 2), ("3", "3", 0), ("3, default --fail-on", "3b", 2)):
        status = runs[run][0]
        suite = ET.parse(base / folder / "junit.xml").getroot().find("testsuite")
        failures = [case for case in suite.iter("testcase") if case.find("failure") is not None]
        assert (len(failures), status) == (failing, 1 if failing else 0), run
        verdict = (base / folder / "report.md").read_text().splitlines()[2]
        assert verdict.startswith("**2 new unexpected findings" if run == "2" else
                                  "**Nothing new and unexpected:" if run == "3" else "**2 unexpected findings")
    assert runs["3"][2]["fail_on"] == "new" and runs["3, default --fail-on"][2]["fail_on"] == (
        "unexpected")


def test_moving_and_renaming_the_baseline_folder_changes_nothing(releases):
    base, runs = releases
    (status, _, here), (moved_status, _, moved) = runs["3"], runs["3, baseline moved"]
    assert moved_status == status == 0
    assert moved["baseline"]["folder"] == str(base / "elsewhere" / "executorch-1.5.1-renamed")
    assert compared(moved["baseline"]) | {"folder": 0} == compared(here["baseline"]) | {"folder": 0}


def test_a_fixed_plugin_in_release_4_makes_both_findings_gone(releases):
    _, runs = releases
    status, printed, summary = runs["4"]
    baseline = summary["baseline"]
    assert status == 0 and summary["findings"] == []
    assert pairs(baseline["gone"]) == COLLISION  # as release 2 recorded them
    assert (baseline["new"], baseline["still"], baseline["out_of_scope"]) == ([], [], 0)
    assert ": 0 new, 2 gone, 0 still\n" in printed


def test_release_5_without_the_plugin_cannot_tell_whether_they_are_gone(releases):
    _, runs = releases
    status, printed, summary = runs["5"]
    assert status == 0
    assert summary["baseline"] | {"folder": None} == {
        "folder": None, "version": "1.5.1", "new": [], "gone": [], "still": [], "out_of_scope": 2}
    assert ": 0 new, 0 gone, 0 still, 2 out of scope\n" in printed


def test_a_new_finding_that_an_expectation_covers_does_not_fail_on_new(releases, tmp_path):
    base, _ = releases
    status, _, summary = campaign(tmp_path / "out", *WITH_PLUGIN, "--baseline", base / "1",
                                  "--fail-on", "new", "--expect", EXPECTATIONS)
    assert status == 0
    assert pairs(summary["baseline"]["new"]) == COLLISION and summary["unexpected"] == []


def test_fuzz_compares_its_findings_too(releases, tmp_path):
    base, _ = releases
    words = [w if w != "matrix" else "fuzz" for w in WITH_PLUGIN]
    status, _, summary = campaign(
        tmp_path / "out", *words, "--budget", "1s", "--seed", "1", "--db", tmp_path / "db",
        "--baseline", base / "elsewhere" / "executorch-1.5.1-renamed", "--fail-on", "new")
    baseline = summary["baseline"]
    assert status == 0
    # fuzz keeps one minimal record of the identity both matrix findings share
    assert pairs(baseline["still"]) == [[PLUGIN, KQ]] and baseline["new"] == []
    assert baseline["gone"] == [] and baseline["out_of_scope"] == 0


def sections(report):
    return [line for line in report.splitlines() if line.startswith("## ")]


def test_the_report_shows_new_then_gone_before_unexpected_and_expected(releases):
    base, _ = releases
    report = (base / "elsewhere" / "executorch-1.5.1-renamed" / "report.md").read_text()  # 2's
    assert sections(report)[1:5] == ["## New since the baseline (2)",
                                    "## Gone since the baseline (0)",
                                    "## Unexpected findings (2)", "## Expected findings (0)"]
    unexpected = report[report.index("## Unexpected findings"):]
    assert "New since the baseline, shown above: 1, 2." in unexpected
    assert "### " not in unexpected  # each finding is shown once, under "New"
    assert f"- Baseline: `{base / '1'}` (version `1.5.1`)" in report
    html = (base / "elsewhere" / "executorch-1.5.1-renamed" / "matrix.html").read_text()
    assert html.count("<td>unexpected, new since the baseline</td>") == 2
    gone = (base / "4" / "report.md").read_text()
    assert sections(gone)[1:3] == ["## New since the baseline (0)", "## Gone since the baseline (2)"]
    assert (f"- `{PLUGIN} -> {KQ} @ local`: `reregister executorch-reregister "
            f"quantized_decomposed::add.out`, ended in `step 1 (local:{KQ})`") in gone
    assert "2 other findings of the baseline were out of this campaign's scope" in (
        base / "5" / "report.md").read_text()


def test_without_a_baseline_the_report_has_no_such_section(releases):
    base, _ = releases
    assert not any("baseline" in line for line in sections((base / "1" / "report.md").read_text()))


# --- refusals: one line, exit 2, nothing written ---------------------------------------


def summary_file(folder, **summary):
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"command": "matrix", "shard": None,
                                                     "findings": [], **summary}))
    return folder


def not_json(folder):
    folder.mkdir()
    (folder / "summary.json").write_text("{oops")
    return folder


REFUSALS = {
    "no such folder": (lambda f: ["--baseline", f / "nowhere"], "no such folder"),
    "no summary.json": (lambda f: ["--baseline", f], "no summary.json"),
    "not JSON": (lambda f: ["--baseline", not_json(f / "b")], "cannot read summary.json"),
    "a repro folder": (lambda f: ["--baseline", summary_file(f / "b", command="repro")],
                       "not the results folder of a matrix or fuzz campaign"),
    "incomplete": (lambda f: ["--baseline", summary_file(f / "b", incomplete=True)],
                   "stopped before it finished"),
    "a shard": (lambda f: ["--baseline", summary_file(f / "b", shard="2/3")],
                "holds shard 2/3 of a campaign"),
    "a finding that is no record": (lambda f: ["--baseline", summary_file(
        f / "b", findings=[{"outcome": "abort"}])], "not a trial record"),
    "--fail-on new alone": (lambda f: ["--fail-on", "new"], "--fail-on new needs --baseline"),
    "--fail-on what": (lambda f: ["--fail-on", "stale"], "invalid choice"),
}


@pytest.mark.parametrize("command", ["matrix", "fuzz"])
@pytest.mark.parametrize("case", REFUSALS)
def test_a_bad_baseline_is_refused_before_anything_is_written(tmp_path, case, command):
    make, words = REFUSALS[case]
    out = tmp_path / "out"
    done = loadfuzz(command, "executorch", "--select", "lib/*", *make(tmp_path), "--out", out)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("loadfuzz: ") and done.stderr.count("\n") == 1, done.stderr
    assert words in done.stderr
    assert not out.exists()


# --- identity, on hand-written summaries ---------------------------------------------------


def finding(*libs, step=1, outcome="reregister", op="quantized_decomposed::add.out",
            flags="local"):
    return {"sequence": [{"kind": "dlopen", "lib": lib, "flags": flags} for lib in libs],
            "outcome": outcome, "step": step, "signature": "executorch-reregister", "op": op,
            "repro": f"/somewhere/else/loadfuzz run {' '.join(libs)}"}


@pytest.mark.parametrize(("lib", "normal"), [
    ("executorch-1.5.1/lib/libexecutorch.so", "executorch/lib/libexecutorch.so"),
    ("executorch-1.4.1/lib/libexecutorch.so", "executorch/lib/libexecutorch.so"),
    ("torch-2.13.0+cpu/lib/libtorch_cpu.so", "torch/lib/libtorch_cpu.so"),
    ("nvidia-cublas-cu12-12.1.3.1/lib/libcublas.so.12", "nvidia-cublas-cu12/lib/libcublas.so.12"),
    ("mypkg-unversioned/lib/libx.so", "mypkg/lib/libx.so"),
    ("executorch-2.0rc1.dev20250101/lib/libexecutorch.so", "executorch/lib/libexecutorch.so"),
    # single-target ids stay as they are
    ("lib/libexecutorch.so", "lib/libexecutorch.so"),
    ("extra/libquantized_ops_legacy_plugin-1.2.so", "extra/libquantized_ops_legacy_plugin-1.2.so"),
    ("libfoo-1.2.so", "libfoo-1.2.so"),
    ("kernels/quantized/libquantized_ops_aot_lib.so", "kernels/quantized/libquantized_ops_aot_lib.so"),
    ("py2-lib/libx.so", "py2-lib/libx.so"),  # `lib` is no version
])
def test_an_id_loses_the_version_of_its_target_and_nothing_else(lib, normal):
    assert normal_id(lib) == normal


def baseline_of(tmp_path, *findings):
    folder = summary_file(tmp_path / "baseline", version="1.4.1", findings=list(findings))
    return Baseline.read(folder)


def test_findings_of_two_versions_of_a_multi_target_campaign_match(tmp_path):
    old = finding("executorch-1.4.1/lib/libexecutorch_kernels_quantized.so", "plugin-0.9/libp.so")
    now = finding("executorch-1.5.1/lib/libexecutorch_kernels_quantized.so", "plugin-1.0/libp.so")
    assert identity(old) == identity(now)
    compared = baseline_of(tmp_path, old).compare([now], [now])
    assert compared == {"folder": str(tmp_path / "baseline"), "version": "1.4.1", "new": [],
                        "gone": [], "still": [now], "out_of_scope": 0}


def test_what_differs_is_new_and_gone(tmp_path):
    old = finding("et-1.4.1/lib/a.so", "et-1.4.1/lib/b.so")
    other_op = finding("et-1.5.1/lib/a.so", "et-1.5.1/lib/b.so", op="quantized_decomposed::sub.out")
    compared = baseline_of(tmp_path, old).compare([other_op], [other_op])
    assert compared["new"] == [other_op] and compared["gone"] == [old]
    assert compared["still"] == [] and compared["out_of_scope"] == 0


def test_identity_is_the_set_of_libraries_up_to_the_step_it_ended_in(tmp_path):
    # a -> b -> c ending in step 1 is b -> a ending in step 1; what came after does not count
    assert identity(finding("lib/a.so", "lib/b.so", "lib/c.so")) == identity(
        finding("lib/b.so", "lib/a.so"))
    assert identity(finding("lib/a.so", "lib/b.so", step=0)) == identity(finding("lib/a.so",
                                                                                 step=0))
    # a failure after the last step (at exit) is about every step
    assert identity(finding("lib/a.so", "lib/b.so", step=None)) != identity(
        finding("lib/a.so", "lib/c.so", step=None))


def test_only_what_this_campaign_ran_can_be_gone(tmp_path):
    global_pair = finding("lib/a.so", "lib/b.so", flags="global")
    plugin_pair = finding("lib/a.so", "extra/p.so")
    early = finding("lib/c.so", "lib/d.so", step=0)  # c alone failed: any run of c covers it
    baseline = baseline_of(tmp_path, global_pair, plugin_pair, early)
    ran = [finding("lib/a.so", "lib/b.so", outcome="clean", step=None),  # local only
           finding("lib/c.so", "lib/a.so", outcome="clean", step=None)]
    compared = baseline.compare([], ran)
    assert compared["gone"] == [early]
    assert compared["out_of_scope"] == 2  # no global trial, no plugin


def test_a_record_covers_only_the_steps_it_got_through(tmp_path):
    old = finding("lib/a.so", "lib/b.so")  # ended in step 1
    now = finding("lib/a.so", "lib/b.so", step=0, op="something::else")  # ended in step 0
    compared = baseline_of(tmp_path, old).compare([now], [now])
    assert compared["new"] == [now] and compared["gone"] == [] and compared["out_of_scope"] == 1


def test_reading_a_bad_baseline_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match=r"no summary\.json"):
        Baseline.read(tmp_path)
