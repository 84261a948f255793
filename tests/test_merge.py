"""`merge` puts the results folders of the shards of one campaign back together.

Three `matrix --shard K/3` folders of executorch's `lib/*` plus the legacy
plugin (one flags mode, 72 pairs) merge into exactly the trials and findings
of the same campaign run whole, with its exit status and its expected,
unexpected and stale verdicts, with and without the expectations file. With
that file, the seed collision's two pairs fall to shards 1 and 3, so entry 1
looks stale in shard 2 alone: merged, it is not. Folders that are not the N
shards of one campaign are refused before anything is written.
"""

import json
import shutil
import subprocess

import pytest

from loadfuzz import merge
from loadfuzz.elf.read import ElfReader
from loadfuzz.model import UsageError
from loadfuzz.predict import shared_definitions
from support import EXPECTATIONS, KQ, LEGACY_PLUGIN, PLUGIN, QUANTIZED, ROOT, loadfuzz

CAMPAIGN = ("matrix", "executorch", "--add", LEGACY_PLUGIN, "--select", "lib/*",
            "--select", "extra/*", "--flags", "global")
REPORTS = {"summary.json", "trials.jsonl", "report.md", "matrix.html", "junit.xml", "repro"}


def run(out, *options):
    """One campaign (or shard) into `out`: (exit status, summary)."""
    done = loadfuzz(*CAMPAIGN, *options, "--out", out, "--json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per expectations ("none", "file"): the whole campaign and its three shards' folders."""
    found = {}
    for name, options in (("none", ()), ("file", ("--expect", EXPECTATIONS))):
        base = tmp_path_factory.mktemp(f"merge-{name}")
        whole = run(base / "whole", *options)
        shards = [base / f"shard{k}" for k in (1, 2, 3)]
        for k, folder in enumerate(shards, start=1):
            run(folder, *options, "--shard", f"{k}/3")
        found[name] = (base / "whole", whole, shards)
    return found


def sequences(folder):
    return sorted(json.dumps(json.loads(line)["sequence"])
                  for line in (folder / "trials.jsonl").read_text().splitlines())


def verdicts(records):
    return [(r["sequence"], r["outcome"], r["step"], r["signature"], r["op"]) for r in records]


@pytest.mark.parametrize("expect", ["none", "file"])
def test_the_shards_merge_into_exactly_the_whole_campaign(runs, tmp_path, expect):
    whole_folder, (status, whole), shards = runs[expect]
    out = tmp_path / "merged"
    done = loadfuzz("merge", shards[2], shards[0], shards[1], "--out", out, "--json")
    assert done.returncode == status == (1 if expect == "none" else 0), done.stderr
    merged = json.loads(done.stdout)
    assert merged == json.loads((out / "summary.json").read_text())
    assert sequences(out) == sequences(whole_folder)
    assert merged["trials"] == whole["trials"] == 72
    assert verdicts(merged["findings"]) == verdicts(whole["findings"])
    assert len(merged["findings"]) == 2
    assert verdicts(merged["unexpected"]) == verdicts(whole["unexpected"])
    assert [(verdicts([e["record"]]), e["why"]) for e in merged["expected"]] == [
        (verdicts([e["record"]]), e["why"]) for e in whole["expected"]]
    assert merged["stale"] == whole["stale"]
    for key in ("target", "libraries", "flags", "command", "version", "expectations"):
        assert merged[key] == whole[key], key
    assert merged["shard"] is None and merged["merged_from"] == [str(shards[i]) for i in (2, 0, 1)]
    assert merged["out"] == str(out)
    shard_summaries = [json.loads((s / "summary.json").read_text()) for s in shards]
    assert merged["started"] == min(s["started"] for s in shard_summaries)
    assert merged["finished"] == max(s["finished"] for s in shard_summaries)
    assert merged["servers"]["servers"] == sum(s["servers"]["servers"] for s in shard_summaries)
    assert {p.name for p in out.iterdir()} >= REPORTS
    assert sorted(p.name for p in (out / "repro").iterdir()) == ["001.sh", "002.sh"]
    junit = (out / "junit.xml").read_text()
    assert junit.count("<testcase ") == 72 and junit.count("<failure ") == len(whole["unexpected"])
    assert merged["prediction"] == whole["prediction"]
    assert [f["cause"]["libraries"] for f in merged["findings"]] == [
        f["cause"]["libraries"] for f in whole["findings"]]


def test_shards_compared_with_a_baseline_merge_into_the_whole_comparison(runs, tmp_path):
    """The whole campaign without expectations is the baseline of the same campaign with
    a quieter target: every finding of the baseline that the shards could see is `still`."""
    whole_folder, _, _ = runs["none"]
    shards = [tmp_path / f"shard{k}" for k in (1, 2, 3)]
    for k, folder in enumerate(shards, start=1):
        run(folder, "--shard", f"{k}/3", "--baseline", whole_folder)
    done = loadfuzz("merge", *shards, "--out", tmp_path / "merged", "--json", "--fail-on", "new")
    assert done.returncode == 0, done.stderr  # nothing is new since the baseline
    baseline = json.loads(done.stdout)["baseline"]
    assert (len(baseline["new"]), len(baseline["gone"]), len(baseline["still"])) == (0, 0, 2)
    assert baseline["folder"] == str(whole_folder)


def test_fail_on_new_needs_shards_that_had_a_baseline(runs, tmp_path):
    _, _, shards = runs["none"]
    done = loadfuzz("merge", *shards, "--out", tmp_path / "merged", "--fail-on", "new")
    assert done.returncode == 2 and "--baseline" in done.stderr
    assert not (tmp_path / "merged").exists()  # refused before anything is written


def test_a_stale_entry_is_decided_over_the_whole_campaign(runs):
    _, (_, whole), shards = runs["file"]
    seed_entry = "executorch.toml:entry 1"  # the plugin and the run-time quantized kernels
    stale_in = [[e["source"] for e in json.loads((s / "summary.json").read_text())["stale"]]
                for s in shards]
    assert [seed_entry in sources for sources in stale_in] == [False, True, False]
    assert [e["source"] for e in whole["stale"]] == ["executorch.toml:entry 2"]  # no aot library
    merged = merge.merge(shards, shards[0].parent / "merged-stale")[0]
    assert [e["source"] for e in merged["stale"]] == ["executorch.toml:entry 2"]
    assert {e["why"] for e in merged["expected"]} == {whole["expected"][0]["why"]}


def test_a_shard_s_reports_say_it_is_a_shard_and_its_stale_entries_are_its_slice_s(runs,
                                                                                   capsys):
    # a release manager reading one shard's step summary would delete entries in use
    from loadfuzz.cli import printing

    _, _, shards = runs["file"]
    printing.print_summary(json.loads((shards[1] / "summary.json").read_text()))
    text = capsys.readouterr().out
    assert text.startswith("matrix executorch (shard 2/3): ")
    assert "(stale in this shard's slice only" in text
    report = (shards[1] / "report.md").read_text()
    assert report.startswith("# loadfuzz matrix: executorch 1.5.1 (shard 2/3)\n")
    assert "- Shard: 2/3: one slice of the campaign's work" in report
    assert "matched no finding in this shard's slice of the work" in report
    html = (shards[1] / "matrix.html").read_text()
    assert "(shard 2/3)</h1>" in html and "in this shard&#x27;s slice" in html
    whole = (runs["file"][0] / "report.md").read_text()
    assert "shard" not in whole.splitlines()[0] and "- Shard:" not in whole


def test_the_text_output_is_the_campaigns(runs, tmp_path):
    _, _, shards = runs["none"]
    done = loadfuzz("merge", *shards, "--out", tmp_path / "merged")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("global: row = loaded first, column = loaded second")
    assert "matrix executorch: 72 trials, 2 findings, 2 unexpected, 0 stale expectations" in lines
    assert sum("UNEXPECTED reregister" in line for line in lines) == 2
    assert lines[-1].startswith(f"report: {tmp_path / 'merged' / 'report.md'}")


# --- refusals: exit status 2, one line, nothing written --------------------------------------


def copy_with(folder, to, edit=None, extra_line=None):
    shutil.copytree(folder, to)
    if edit:
        summary = json.loads((to / "summary.json").read_text())
        summary.update(edit)
        (to / "summary.json").write_text(json.dumps(summary))
    if extra_line:
        with open(to / "trials.jsonl", "a") as file:
            file.write(extra_line)
    return to


def cut_short(folder, to):
    """A copy of a shard whose trials.jsonl lost all but its first line (cut at a line's end)."""
    copy_with(folder, to)
    trials = to / "trials.jsonl"
    trials.write_text(trials.read_text().splitlines(keepends=True)[0])
    return to


def refusals(runs, tmp):
    none, file = runs["none"][2], runs["file"][2]
    whole = runs["none"][0]
    first_trial = (none[0] / "trials.jsonl").read_text().splitlines(keepends=True)[0]
    count = json.loads((none[2] / "summary.json").read_text())["trials"]
    (tmp / "empty").mkdir()
    (tmp / "notes").mkdir()
    (tmp / "notes" / "readme.txt").write_text("not results\n")
    return {
        "different expectations": ([none[0], file[1], file[2]], "different campaigns"),
        "different version": ([none[0], none[1], copy_with(none[2], tmp / "v", {"version": "1.6"})],
                              "their versions differ: 1.5.1 and 1.6"),
        "different flags": ([copy_with(none[0], tmp / "f", {"flags": ["local"]}), none[1], none[2]],
                            "their flags modes differ: local and global"),
        "different shard counts": ([none[0], none[1], copy_with(none[2], tmp / "n", {"shard": "3/4"})],
                                   "shard 1/3 and shard 3/4"),
        "a missing shard": ([none[0], none[2]], "missing shard 2/3"),
        "the same shard twice": ([none[0], copy_with(none[0], tmp / "again"), none[1], none[2]],
                                 "shard 1/3 is both"),
        "a trial in two shards": ([none[0], none[1], copy_with(none[2], tmp / "t",
                                                                {"trials": count + 1}, first_trial)],
                                  "overlapping shards"),
        "a shard cut short": ([none[0], none[1], cut_short(none[2], tmp / "c")],
                              "trial records, where its summary counts"),
        "a summary that loadfuzz did not write": (
            [none[0], none[1], copy_with(none[2], tmp / "m", {"trials": "many"})],
            "where its summary counts many"),
        "a whole campaign with shards": ([whole, none[1], none[2]], "cannot merge a whole campaign"),
        "an empty folder": ([tmp / "empty", *none], "not a results folder"),
        "a folder of other files": ([*none, tmp / "notes"], "not a results folder"),
        "a folder that does not exist": ([*none, tmp / "nowhere"], "not a results folder"),
        "a stopped shard": ([none[0], none[1], copy_with(none[2], tmp / "s", {"incomplete": True})],
                            "stopped before it finished"),
    }


CASES = ["different expectations", "different version", "different flags", "different shard counts",
         "a missing shard", "the same shard twice", "a trial in two shards",
         "a whole campaign with shards", "an empty folder", "a folder of other files",
         "a folder that does not exist", "a stopped shard", "a shard cut short",
         "a summary that loadfuzz did not write"]


@pytest.mark.parametrize("case", CASES)
def test_folders_that_are_not_the_shards_of_one_campaign_are_refused(runs, tmp_path, case):
    folders, words = refusals(runs, tmp_path)[case]
    before = {f: sorted(p.name for p in f.rglob("*")) for f in folders if f.exists()}
    done = loadfuzz("merge", *folders, "--out", tmp_path / "merged")
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("loadfuzz: ") and len(done.stderr.splitlines()) == 1
    assert words in done.stderr, done.stderr
    assert done.stdout == "" and not (tmp_path / "merged").exists()
    assert before == {f: sorted(p.name for p in f.rglob("*")) for f in before}


def test_a_shard_resumed_with_other_flags_merges_by_what_its_summary_counts(runs, tmp_path):
    """`--resume` with other options leaves trials outside the shard's work in trials.jsonl
    (the contract keeps them there, out of the summary): they are not the campaign's."""
    _, (_, whole), shards = runs["none"]
    record = json.loads((shards[0] / "trials.jsonl").read_text().splitlines()[0])
    for step in record["sequence"]:
        step["flags"] = "local"  # the campaign is --flags global
    resumed = copy_with(shards[0], tmp_path / "resumed", extra_line=json.dumps(record) + "\n")
    done = loadfuzz("merge", resumed, *shards[1:], "--out", tmp_path / "merged", "--json")
    assert done.returncode == 1, done.stderr
    merged = json.loads(done.stdout)
    assert merged["trials"] == whole["trials"] == len(sequences(tmp_path / "merged"))
    assert verdicts(merged["findings"]) == verdicts(whole["findings"])


def test_a_missing_shard_is_named(runs, tmp_path):
    _, _, shards = runs["none"]
    done = loadfuzz("merge", shards[1], "--out", tmp_path / "merged")
    assert done.returncode == 2
    assert "missing shards 1/3, 3/3 (given: 2/3)" in done.stderr


def test_an_out_folder_that_holds_results_is_refused(runs, tmp_path):
    _, _, shards = runs["none"]
    out = tmp_path / "merged"
    out.mkdir()
    (out / "summary.json").write_text("{}\n")
    done = loadfuzz("merge", *shards, "--out", out)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert f"--out {out} already holds results" in done.stderr
    assert [p.name for p in out.iterdir()] == ["summary.json"]
    assert (out / "summary.json").read_text() == "{}\n"
    (out / "summary.json").rename(out / "notes.txt")  # not results: not said to be
    done = loadfuzz("merge", *shards, "--out", out)
    assert done.returncode == 2 and f"--out {out} already holds other files" in done.stderr


def test_a_stopped_merge_leaves_nothing_and_the_next_one_finishes(runs, tmp_path, monkeypatch):
    """The merged folder is written beside --out and renamed into place at the end."""
    from loadfuzz import report

    _, _, shards = runs["none"]
    out = tmp_path / "merged"
    out.mkdir()  # an empty folder may be --out

    def stopped(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(report, "render_junit", stopped)
        with pytest.raises(KeyboardInterrupt):
            merge.merge(shards, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"] and not any(out.iterdir())
    summary, _ = merge.merge(shards, out)
    assert (out / "summary.json").exists() and len(sequences(out)) == summary["trials"]


def test_merge_needs_out_and_a_folder():
    for args in (["merge", "somewhere"], ["merge", "--out", "x"]):
        done = loadfuzz(*args)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr


# --- fuzz shards and what a matrix shard cannot see alone --------------------------------------


def test_fuzz_shards_keep_one_finding_per_identity(tmp_path):
    corpus = ROOT / "build" / "fixtures" / "corpus"
    shards = []
    for k in (1, 2):
        shards.append(tmp_path / f"shard{k}")
        done = loadfuzz("fuzz", corpus, "--budget", "1s", "--seed", "1", "--shard", f"{k}/2",
                        "--db", tmp_path / "db", "--out", shards[-1], "--json")
        assert done.returncode in (0, 1), done.stderr
    summaries = [json.loads((s / "summary.json").read_text()) for s in shards]
    done = loadfuzz("merge", *shards, "--out", tmp_path / "merged", "--json")
    assert done.returncode == (1 if any(s["unexpected"] for s in summaries) else 0), done.stderr
    merged = json.loads(done.stdout)
    identities = [identity(r) for r in merged["findings"]]
    assert len(identities) == len(set(identities))
    assert set(identities) == {identity(r) for s in summaries for r in s["findings"]}
    assert [f["sequence"] for f in merged["found"]] == [r["sequence"] for r in merged["findings"]]
    assert merged["rounds"] == sum(s["rounds"] for s in summaries) and merged["seed"] == 1
    # the keys a fuzz summary has, for the whole campaign (they were missing)
    assert merged["jobs"] == sum(s["jobs"] for s in summaries)
    assert merged["search_s"] == max(s["search_s"] for s in summaries)
    assert merged["warnings"] == [f"shard {k}/2: {w}" for k, s in enumerate(summaries, start=1)
                                  for w in s["warnings"]]
    assert sequences(tmp_path / "merged") == sorted(set(sequences(shards[0]) + sequences(shards[1])))
    assert merged["trials"] == len(sequences(tmp_path / "merged"))
    # the prediction's tallies are the shards', added: a trial both ran counts twice, and the
    # text says so rather than contradict the count of trials just above it
    total = merged["prediction"]["agree"] + merged["prediction"]["disagree_count"]
    assert total == sum(s["prediction"]["agree"] + s["prediction"]["disagree_count"]
                        for s in summaries) > merged["trials"]
    text = loadfuzz("merge", *shards, "--out", tmp_path / "merged-text").stdout
    assert (f"prediction: {merged['prediction']['agree']} of {total} trials the shards ran "
            "(their tallies added: a trial two shards ran counts twice)") in text
    script = subprocess.run(["sh", "-n", tmp_path / "merged" / "repro" / "001.sh"], check=False)
    assert script.returncode == 0


def identity(record):
    """As `fuzz` tells failures apart: outcome, signature, op, the libraries up to the failing step."""
    steps = record["sequence"][:(record["step"] or 0) + 1]
    return record["outcome"], record["signature"], record["op"], frozenset(s["lib"] for s in steps)


def shard_folder(folder, shard, records, interposition=()):
    """A matrix shard's folder made by hand: two libraries, both flags modes, N = 3."""
    folder.mkdir()
    summary = {"target": "t", "libraries": [PLUGIN, KQ], "flags": ["global", "local"],
               "trials": len(records), "findings": [r for r in records if r["outcome"] != "clean"],
               "unexpected": [], "stale": [], "command": "matrix", "version": None,
               "out": str(folder), "shard": shard, "expected": [], "expectations": [], "preload": [],
               "throughput": 10.0, "disagreements": [], "servers": {"servers": 1},
               "started": "2025-01-01T00:00:00Z", "finished": "2025-01-01T00:00:01Z",
               "interposition": list(interposition)}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def pair(first, second, mode, outcome="clean"):
    paths = {PLUGIN: LEGACY_PLUGIN, KQ: QUANTIZED}
    return {"sequence": [{"kind": "dlopen", "lib": lib, "flags": mode} for lib in (first, second)],
            "outcome": outcome, "step": None if outcome == "clean" else 1, "signature": None,
            "op": None, "signal": None, "exit_code": 0, "detail": "", "duration_s": 0.01,
            "peak_rss_mb": 1.0, "via": "cold",
            "repro": f"loadfuzz run --cold {mode}:{paths[first]} {mode}:{paths[second]}"}


def test_a_pair_whose_two_modes_fell_to_different_shards_is_in_interposition(tmp_path):
    # the work list: (plugin, kq) global, (kq, plugin) global, (plugin, kq) local, (kq, plugin) local
    shard_folder(tmp_path / "s1", "1/3", [pair(PLUGIN, KQ, "global", "abort"),
                                          pair(KQ, PLUGIN, "local")])
    shard_folder(tmp_path / "s2", "2/3", [pair(KQ, PLUGIN, "global")])
    shard_folder(tmp_path / "s3", "3/3", [pair(PLUGIN, KQ, "local")])
    summary, records = merge.merge([tmp_path / f"s{k}" for k in (1, 2, 3)], tmp_path / "merged")
    assert [(r.sequence[0].lib, r.sequence[0].flags.value) for r in records] == [
        (PLUGIN, "global"), (KQ, "global"), (PLUGIN, "local"), (KQ, "local")]
    reader = ElfReader()
    symbols = list(shared_definitions(reader.facts(LEGACY_PLUGIN), reader.facts(QUANTIZED)))
    assert summary["interposition"] == [{"first": PLUGIN, "second": KQ, "global": "abort",
                                         "local": "clean", "shared_symbols": symbols}]
    assert summary["throughput"] == 10.0 and summary["servers"] == {"servers": 3}
    with pytest.raises(UsageError, match="already holds results"):
        merge.merge([tmp_path / f"s{k}" for k in (1, 2, 3)], tmp_path / "merged")


def whole_and_merged_halves(tmp_path, campaign):
    """The whole campaign's summary, and `merge` of its two halves (the finished process):
    `campaign(out, *shard_options)` runs one."""
    whole = campaign(tmp_path / "whole")
    for k in (1, 2):
        campaign(tmp_path / f"shard{k}", "--shard", f"{k}/2")
    return whole, loadfuzz("merge", tmp_path / "shard1", tmp_path / "shard2", "--out",
                           tmp_path / "merged", "--json")


@pytest.mark.parametrize("command", [
    ("matrix", "--flags", "python"),
    ("fuzz", "--flags", "python", "--budget", "3", "--seed", "1"),
])
def test_python_mode_shards_with_environment_problems_merge_into_the_whole_campaign(
        tmp_path, command):
    # an extension (imported) beside a plain library (loaded as Python loads it): two kinds of
    # step under one flags mode; the extension's missing dependency is an environment problem
    target = ("build/fixtures/environment",)
    db = ("--db", tmp_path / "db") if command[0] == "fuzz" else ()

    def campaign(out, *shard):
        done = loadfuzz(command[0], *target, *command[1:], *db, *shard, "--out", out, "--json",
                        cwd=ROOT)
        assert done.returncode == 0, done.stderr
        assert "the search ran no trial" not in done.stderr  # (else too slow a machine)
        return json.loads(done.stdout)

    whole, done = whole_and_merged_halves(tmp_path, campaign)
    merged = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr
    assert whole["environment"] and merged["unexpected"] == whole["unexpected"] == []
    assert verdicts(merged["environment"]) == verdicts(whole["environment"])
    assert merged["targets"] == whole["targets"]
    if command[0] == "matrix":
        assert merged["trials"] == whole["trials"] == 2
        assert sequences(tmp_path / "merged") == sequences(tmp_path / "whole")


def test_shards_given_a_relative_baseline_merge_from_any_folder(tmp_path):
    # the shards kept --baseline as given ("last"), which merge read again from its own folder
    corpus = ROOT / "build" / "fixtures" / "corpus"
    (tmp_path / "ci").mkdir()
    common = ("matrix", corpus, "--select", "libcz_pair_*", "--select", "libcz_quiet_*",
              "--flags", "global")
    assert loadfuzz(*common, "--out", "last", cwd=tmp_path / "ci").returncode == 1
    for k in (1, 2):
        done = loadfuzz(*common, "--shard", f"{k}/2", "--baseline", "last", "--out", f"s{k}",
                        cwd=tmp_path / "ci")
        assert done.returncode in (0, 1), done.stderr
    done = loadfuzz("merge", "ci/s1", "ci/s2", "--out", "merged", "--json", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    baseline = json.loads(done.stdout)["baseline"]
    assert baseline["folder"] == str(tmp_path / "ci" / "last") and baseline["new"] == []
    shutil.rmtree(tmp_path / "ci" / "last")  # a merge job without it says what it needs
    done = loadfuzz("merge", "ci/s1", "ci/s2", "--out", "merged-2", cwd=tmp_path)
    assert done.returncode == 2
    assert f"the shards' --baseline {tmp_path / 'ci' / 'last'} (merge compares" in done.stderr


@pytest.mark.parametrize("flags", ["global,local,python", "global,python"])
def test_merged_shards_name_the_pairs_where_the_flags_decide_as_the_whole_campaign_does(
        tmp_path, flags):
    # with a third mode the merge saw three outcomes a pair and found none; with `python` and
    # one other it listed a pair with no `local`, which the report then failed to print
    target = ROOT / "build" / "fixtures" / "interpose"

    def campaign(out, *shard):
        done = loadfuzz("matrix", target, "--flags", flags, *shard, "--out", out, "--json")
        assert done.returncode in (0, 1), done.stderr
        return json.loads(done.stdout)

    whole, done = whole_and_merged_halves(tmp_path, campaign)
    assert done.returncode in (0, 1), done.stderr
    merged = json.loads(done.stdout)
    assert merged["interposition"] == whole["interposition"]
    assert bool(whole["interposition"]) == ("local" in flags)
