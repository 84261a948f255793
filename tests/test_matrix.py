"""`matrix` verifies both load orders of every pair before a release.

On executorch 1.5.1 plus the legacy plugin, the findings are exactly the
pairs of the plugin with a library that registers (or loads one that
registers) the same 21 quantized_decomposed operators:

- `lib/libexecutorch_kernels_quantized.so`, which registers them itself;
- `kernels/quantized/libquantized_ops_aot_lib.so`, which NEEDs it;

each in both orders and both flags modes (both bind `register_kernels` to
the one `lib/libexecutorch.so`, so `local` does not help): 2 x 2 x 2 = 8.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import time

import psutil
import pytest

from support import (
    FIXTURES,
    LEGACY_PLUGIN,
    LOADFUZZ,
    PAIRS_WITH_PLUGIN,
    ROOT,
    alive,
    executorch_ids,
    loadfuzz,
    processes_holding,
)

PLUGIN = "extra/libquantized_ops_legacy_plugin.so"
HOLDERS = ("lib/libexecutorch_kernels_quantized.so",
           "kernels/quantized/libquantized_ops_aot_lib.so")
EXPECT = ROOT / "results" / "expectations" / "executorch.toml"
SMALL = ("--select", "lib/*", "--select", PLUGIN, "--flags", "global")
SMALL_COUNT = sum(lib.startswith("lib/") for lib in executorch_ids()) + 1  # with the plugin


def pair_of(record):
    first, second = record["sequence"]
    return first["lib"], second["lib"], first["flags"]


def test_the_findings_are_exactly_the_plugin_with_each_holder_of_the_kernels(legacy_matrix):
    summary, records = legacy_matrix
    assert summary["trials"] == len(records) == PAIRS_WITH_PLUGIN
    expected = {(a, b, mode) for holder in HOLDERS for a, b in ((holder, PLUGIN), (PLUGIN, holder))
                for mode in ("global", "local")}
    assert {pair_of(r) for r in summary["findings"]} == expected
    assert {(r["outcome"], r["signature"], r["op"]) for r in summary["findings"]} == {
        ("reregister", "executorch-reregister", "quantized_decomposed::add.out")}
    assert all(r["outcome"] == "clean" for r in records if pair_of(r) not in expected)


def test_without_expectations_the_findings_are_unexpected_and_the_exit_status_is_1(legacy_matrix):
    summary, _ = legacy_matrix  # the fixture asserted exit status 1
    assert len(summary["unexpected"]) == 8 and summary["stale"] == []


def test_with_the_expectations_file_the_same_matrix_exits_0(tmp_path):
    done = loadfuzz("matrix", "executorch", "--add", LEGACY_PLUGIN, "--expect", EXPECT,
                    "--out", tmp_path / "out", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert len(summary["findings"]) == 8 and summary["unexpected"] == []
    assert summary["stale"] == []


def test_the_results_folder_holds_every_file_of_the_contract(legacy_matrix):
    summary, _ = legacy_matrix
    out = ROOT / summary["out"] if not os.path.isabs(summary["out"]) else summary["out"]
    names = {p.name for p in __import__("pathlib").Path(out).iterdir()}
    assert names >= {"summary.json", "trials.jsonl", "report.md", "matrix.html", "junit.xml",
                     "repro"}
    junit = (__import__("pathlib").Path(out) / "junit.xml").read_text()
    assert junit.count("<testcase ") == PAIRS_WITH_PLUGIN and junit.count("<failure ") == 8


def test_the_union_of_three_shards_is_the_whole_matrix(tmp_path):
    whole = loadfuzz("matrix", "executorch", "--add", LEGACY_PLUGIN, *SMALL,
                     "--out", tmp_path / "whole", "--json")
    shards = [loadfuzz("matrix", "executorch", "--add", LEGACY_PLUGIN, *SMALL, "--shard",
                       f"{k}/3", "--out", tmp_path / f"shard{k}", "--json") for k in (1, 2, 3)]
    runs = [json.loads(done.stdout) for done in [whole, *shards]]
    trials = [[json.loads(line)["sequence"] for line in
               (tmp_path / name / "trials.jsonl").read_text().splitlines()]
              for name in ("whole", "shard1", "shard2", "shard3")]
    assert sum(len(t) for t in trials[1:]) == len(trials[0]) == SMALL_COUNT * (SMALL_COUNT - 1)
    union = [seq for shard in trials[1:] for seq in shard]
    assert sorted(map(json.dumps, union)) == sorted(map(json.dumps, trials[0]))
    assert sorted(pair_of(r) for run in runs[1:] for r in run["findings"]) == sorted(
        pair_of(r) for r in runs[0]["findings"])


def start_matrix(out):
    return subprocess.Popen([str(LOADFUZZ), "matrix", "executorch", "--add", str(LEGACY_PLUGIN),
                             "--out", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def wait_for_lines(path, count, process):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= count:
            return
        time.sleep(0.01)
    pytest.fail(f"the campaign did not reach {count} trials")


def resume_and_check(out):
    done = loadfuzz("matrix", "executorch", "--add", LEGACY_PLUGIN, "--resume", "--out", out,
                    "--json")
    assert done.returncode == 1, done.stderr
    lines = (out / "trials.jsonl").read_text().splitlines()
    keys = [json.dumps(json.loads(line)["sequence"]) for line in lines]
    assert len(keys) == len(set(keys)) == PAIRS_WITH_PLUGIN
    assert len(json.loads(done.stdout)["findings"]) == 8


def test_the_resume_command_of_a_campaign_given_relative_paths_runs_from_any_folder(tmp_path):
    # `--expect exp.toml` stayed relative: the printed command failed from another folder
    shutil.copy(LEGACY_PLUGIN, tmp_path / "plugin.so")
    (tmp_path / "exp.toml").write_text("")
    campaign = subprocess.Popen(
        [str(LOADFUZZ), "matrix", "executorch", "--add", "plugin.so", "--expect=exp.toml",
         "--out", "out"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    wait_for_lines(tmp_path / "out" / "trials.jsonl", 50, campaign)
    campaign.send_signal(signal.SIGINT)
    assert campaign.wait(timeout=60) == 130, campaign.stderr.read()
    words = shlex.split(json.loads((tmp_path / "out" / "summary.json").read_text())["resume"])
    assert words[words.index("matrix"):] == [
        "matrix", "executorch", "--add", str(tmp_path / "plugin.so"),
        f"--expect={tmp_path / 'exp.toml'}", "--resume", "--out", str(tmp_path / "out")]
    resumed = subprocess.run(words, cwd="/", capture_output=True, text=True, timeout=600)
    assert resumed.returncode in (0, 1), resumed.stderr


@pytest.mark.parametrize(("how", "times"), [(signal.SIGINT, 1), (signal.SIGTERM, 1),
                                           (signal.SIGHUP, 1), (signal.SIGKILL, 1),
                                           (signal.SIGTERM, 2)],
                         ids=["ctrl-c", "sigterm", "sighup", "sigkill",
                              "sigterm-twice-at-once-as-timeout-sends-it"])
def test_an_interrupted_campaign_keeps_whole_lines_and_resume_runs_each_trial_once(
        tmp_path, how, times):
    out = tmp_path / "out"
    campaign = start_matrix(out)
    wait_for_lines(out / "trials.jsonl", 150, campaign)
    harnesses = psutil.Process(campaign.pid).children(recursive=True)
    assert harnesses  # the fork servers and their trials
    for again in range(times):  # `timeout` signals the process, then its group: one stop, twice
        time.sleep(0.1 * again)
        campaign.send_signal(how)
    status = campaign.wait(timeout=60)
    stderr = campaign.stderr.read()
    assert status == (-how if how == signal.SIGKILL else 128 + how), stderr
    if how != signal.SIGKILL:  # stopped as Ctrl-C is: the resume line and a partial report
        assert stderr.count("\n") == 1 and f"stopped by {how.name}" in stderr, stderr
        assert f"--resume --out {out}" in stderr
        summary = json.loads((out / "summary.json").read_text())
        assert summary["incomplete"] is True and summary["resume"].endswith(f"--resume --out {out}")
        assert summary["resume"].split()[0].startswith("/")  # runnable off PATH too
        assert summary["trials"] < PAIRS_WITH_PLUGIN
        assert "**Incomplete**" in (out / "report.md").read_text()
    data = (out / "trials.jsonl").read_bytes()
    for line in data.splitlines()[:-1]:
        json.loads(line)  # every line but maybe a torn last one is whole
    deadline = time.monotonic() + 10
    while alive(harnesses) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive(harnesses) == []
    assert processes_holding(LEGACY_PLUGIN) == []
    resume_and_check(out)


def test_a_resume_killed_while_it_runs_leaves_no_report_that_reads_as_finished(tmp_path):
    """The summary and reports of the run it continues describe that run: a resume takes them
    away when it starts, so a CI gate reading the folder of a killed resume sees no result."""
    out = tmp_path / "out"
    stopped = start_matrix(out)
    wait_for_lines(out / "trials.jsonl", 100, stopped)
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(timeout=60) == 128 + signal.SIGTERM
    assert json.loads((out / "summary.json").read_text())["incomplete"] is True
    before = (out / "trials.jsonl").read_bytes().count(b"\n")
    resumed = subprocess.Popen([str(LOADFUZZ), "matrix", "executorch", "--add", str(LEGACY_PLUGIN),
                                "--resume", "--out", str(out)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    wait_for_lines(out / "trials.jsonl", before + 20, resumed)
    resumed.kill()
    resumed.wait(timeout=60)
    assert sorted(p.name for p in out.iterdir()) == [".lock", "trials.jsonl"]
    resume_and_check(out)


def test_a_stop_while_the_reports_are_written_leaves_no_summary(tmp_path, monkeypatch):
    """summary.json is written last: where it is, every report agrees with it."""
    from loadfuzz import report

    def stopped(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "render_junit", stopped)
    summary = {"command": "matrix", "target": "t", "trials": 0, "findings": []}
    with pytest.raises(KeyboardInterrupt):
        report.write_all(tmp_path, summary, [])
    assert not (tmp_path / "summary.json").exists()


def test_resume_needs_an_out_folder_and_a_used_out_folder_needs_resume(tmp_path):
    done = loadfuzz("matrix", "executorch", "--resume")
    assert done.returncode == 2 and "--resume needs --out" in done.stderr
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "trials.jsonl").write_text("")
    done = loadfuzz("matrix", "executorch", "--out", tmp_path / "used")
    assert done.returncode == 2 and "already holds results" in done.stderr
    assert "pass --resume or another --out" in done.stderr
    # a folder of other files holds no campaign to resume: --resume is not offered
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("mine\n")
    done = loadfuzz("matrix", "executorch", "--out", tmp_path / "notes")
    assert done.returncode == 2 and done.stderr.endswith("pass another --out\n"), done.stderr
    assert "--resume" not in done.stderr and "holds other files" in done.stderr
    # fuzz and repro have no --resume: they do not offer it
    for command in (("fuzz", "executorch"), ("repro", "Re-registering a::b", "executorch")):
        done = loadfuzz(*command, "--out", tmp_path / "used")
        assert done.returncode == 2 and done.stderr.endswith("pass another --out\n"), done.stderr


def test_a_pair_that_only_fails_under_global_names_the_symbols_both_define(tmp_path):
    done = loadfuzz("matrix", ROOT / "build" / "fixtures" / "interpose", "--out", tmp_path / "out",
                    "--json")
    assert done.returncode == 1, done.stderr
    summary = json.loads(done.stdout)
    assert summary["interposition"] == [{"first": "libfx_hook_first.so",
                                         "second": "libfx_hook_second.so", "global": "abort",
                                         "local": "clean", "shared_symbols": ["fx_hook"]}]
    assert "## Where the flags matter (1)" in (tmp_path / "out" / "report.md").read_text()


def test_the_wheel_has_no_pair_where_the_flags_alone_decide(legacy_matrix):
    summary, _ = legacy_matrix
    assert summary["interposition"] == []


def test_a_campaign_stopped_before_its_first_trial_says_nothing_was_written(tmp_path, capsys):
    """Stopped while it reads and plans (before it takes its results folder), a campaign has
    nothing to resume: its last line says so, and offers no `--resume` that would fail."""
    from loadfuzz.campaign import prepare
    from loadfuzz.cli.commands import campaign_settings, interrupted
    from loadfuzz.cli.parser import build_parser
    from loadfuzz.model import Stopped

    out = tmp_path / "out"
    words = ["matrix", "executorch", "--select", "lib/*", "--out", str(out)]
    args = build_parser().parse_args(words)
    args.invocation = words
    campaign = prepare(campaign_settings(args), "matrix")
    assert interrupted(campaign, Stopped(signal.SIGTERM)) == 128 + signal.SIGTERM
    said = capsys.readouterr().err
    assert said == f"stopped by SIGTERM before the first trial: nothing was written to {out}\n"
    assert not out.exists()


def test_a_name_or_message_with_control_characters_cannot_drive_the_terminal(tmp_path):
    libs = tmp_path / "libs"
    libs.mkdir()
    shutil.copy(FIXTURES / "hostile" / "libfx_exit7.so", libs / "lib\x1b]0;TITLE\x07seg\nv.so")
    shutil.copy(FIXTURES / "hostile" / "libfx_clean.so", libs / "lib\x1b[31mred.so")
    done = loadfuzz("matrix", libs, "--flags", "global", "--out", tmp_path / "out")
    assert done.returncode == 1, done.stderr
    assert not any(c in done.stdout for c in "\x1b\x07"), done.stdout
    grid = done.stdout.splitlines()[:4]  # title, column numbers, one line per row
    assert grid[2].endswith("lib\\x1b[31mred.so") and grid[3].endswith("seg\\nv.so"), grid
    ran = loadfuzz("run", libs / "lib\x1b]0;TITLE\x07seg\nv.so")
    assert ran.returncode == 1 and not any(c in ran.stdout for c in "\x1b\x07"), ran.stdout
    os.link(libs / "lib\x1b[31mred.so", libs / "lib\x1b[31mred2.so")  # a warning names both
    scanned = loadfuzz("scan", libs)
    assert scanned.returncode == 0 and not any(c in scanned.stdout + scanned.stderr
                                               for c in "\x1b\x07"), scanned.stdout


@pytest.mark.parametrize("command", ["matrix", "fuzz"])
def test_a_stop_while_the_runner_is_made_leaves_no_folder_without_a_summary(
        tmp_path, monkeypatch, command):
    """The runner (its imports, its tiers) is made before the results folder is taken: a stop
    meanwhile leaves nothing, never a folder holding only an empty trials.jsonl."""
    from loadfuzz.campaign import Quiet, prepare, run_matrix
    from loadfuzz.cli.commands import campaign_settings
    from loadfuzz.cli.parser import build_parser
    from loadfuzz.model import Stopped
    from loadfuzz.search.fuzz import FuzzOptions, run_fuzz
    from loadfuzz.settings import RunSettings

    def stopped(*args, **kwargs):
        raise Stopped(signal.SIGINT)

    out = tmp_path / "out"
    words = [command, "executorch", "--select", "lib/*", "--out", str(out)]
    args = build_parser().parse_args(words)
    args.invocation = words
    campaign = prepare(campaign_settings(args), command)
    monkeypatch.setattr(RunSettings, "trials", stopped)
    with pytest.raises(Stopped):
        if command == "matrix":
            run_matrix(campaign, Quiet())
        else:
            run_fuzz(campaign, FuzzOptions(budget_s=5, db=tmp_path / "db"), Quiet())
    assert not out.exists()
