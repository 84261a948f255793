"""Bad input gets one clear line on stderr and exit 2: no traceback, nothing written."""

import json
import os

import pytest

from loadfuzz.cli.parser import budget
from support import LEGACY_PLUGIN, QUANTIZED, loadfuzz


def bad_toml(folder):
    path = folder / "bad.toml"
    path.write_text("[[expected]\nfirst = 1\n")
    return path


def unknown_key(folder):
    path = folder / "unknown.toml"
    path.write_text('[[expected]]\nfirst = "a"\nsecond = "b"\noutcome = "reregister"\n'
                    'why = "x"\ncolour = "red"\n')
    return path


TOO_LONG = "a name longer than a file system allows"


def text_so(folder):
    path = folder / "libtext.so"
    path.write_text("hello\n")
    return path


def under_a_file(folder):
    (folder / "afile").write_text("not a folder\n")
    return folder / "afile" / "out"


def garbled_campaign(folder):
    (folder / "earlier").mkdir()
    (folder / "earlier" / "trials.jsonl").write_text('{"sequence": 5}\nnot json\n')
    return folder / "earlier"


def dangling(folder):
    (folder / "gone").symlink_to(folder / "nowhere")
    return folder / "gone"


def deeply_nested(folder):
    path = folder / "deep.toml"  # tomllib reads nesting recursively: RecursionError was exit 3
    path.write_text("expected = " + "[" * 5000 + "]" * 5000 + "\n")
    return path


def newline_in_name(folder):
    path = folder / "two\nlines.so"
    path.write_text("hello\n")
    return path


def fifo(folder):
    os.mkfifo(folder / "libpipe.so")
    return folder / "libpipe.so"


def fuzz_campaign(folder):
    (folder / "fuzzed").mkdir()
    (folder / "fuzzed" / "trials.jsonl").write_text("")
    (folder / "fuzzed" / "summary.json").write_text('{"command": "fuzz", "incomplete": true}')
    return folder / "fuzzed"


def three_step_trials(folder):
    """A folder a stopped fuzz campaign left without its summary (SIGKILL): a trial of 3 steps."""
    step = {"kind": "dlopen", "lib": QUANTIZED.name, "flags": "global"}
    record = {"sequence": [step] * 3, "outcome": "clean", "step": None, "signature": None,
              "op": None, "signal": None, "exit_code": 0, "detail": "every step completed",
              "duration_s": 0.1, "peak_rss_mb": 10.0, "repro": "x", "via": "fork-server"}
    (folder / "killed").mkdir()
    (folder / "killed" / "trials.jsonl").write_text(json.dumps(record) + "\n")
    return folder / "killed"


CASES = {
    "missing path": (lambda f: ["matrix", f / "nowhere"], "no such file"),
    "missing --add": (lambda f: ["matrix", "executorch", "--add", f / "nope.so"], "no such file"),
    "text --add": (lambda f: ["matrix", "executorch", "--add", text_so(f)], "not an ELF file"),
    "unknown flags": (lambda f: ["matrix", "executorch", "--flags", "global,lazy"],
                      "unknown flags mode 'lazy'"),
    "unknown run prefix flags": (lambda f: ["run", "--flags", "now", QUANTIZED],
                                 "unknown flags mode"),
    "bad budget": (lambda f: ["fuzz", "executorch", "--budget", "ten minutes"], "bad --budget"),
    "zero budget": (lambda f: ["fuzz", "executorch", "--budget", "0s"], "bad --budget"),
    "budget without its last unit": (lambda f: ["fuzz", "executorch", "--budget", "1h30"],
                                     "(1h30m?)"),
    "bad shard": (lambda f: ["matrix", "executorch", "--shard", "4/3"], "bad --shard"),
    "shard text": (lambda f: ["fuzz", "executorch", "--shard", "half"], "bad --shard"),
    # a shard that tests nothing went green: 2 libraries make 2 pairs under one flags mode
    "more matrix shards than pairs": (
        lambda f: ["matrix", QUANTIZED, "--add", LEGACY_PLUGIN, "--flags", "global",
                   "--shard", "1/3"], "--shard 1/3: the matrix has 2 pairs to share out, so "
                                      "at most 2 shards"),
    "more fuzz shards than first libraries": (
        lambda f: ["fuzz", QUANTIZED, "--add", LEGACY_PLUGIN, "--shard", "3/3"],
        "--shard 3/3: the fuzz has 2 first libraries to share out, so at most 2 shards"),
    "toml error": (lambda f: ["matrix", "executorch", "--expect", bad_toml(f)], "bad.toml"),
    "unknown key": (lambda f: ["matrix", "executorch", "--expect", unknown_key(f)], "colour"),
    # argparse would keep the last: one team's accepted collisions lost without a word
    "two expectations files": (lambda f: ["matrix", "executorch", "--expect", bad_toml(f),
                                          "--expect", unknown_key(f)], "--expect given twice"),
    "two baselines": (lambda f: ["fuzz", "executorch", "--baseline", f, "--baseline", f],
                      "--baseline given twice"),
    "two logs": (lambda f: ["repro", "--log", f / "a.log", "--log", f / "b.log", "executorch"],
                 "--log given twice"),
    "select nothing": (lambda f: ["matrix", "executorch", "--select", "nothing/*"],
                       "matches no library"),
    "a matrix of one library": (lambda f: ["matrix", "executorch", "--select", "lib/libexecutorch.so"],
                                "a matrix pairs libraries, and executorch has 1 selected"),
    "run missing library": (lambda f: ["run", f / "libnope.so"], "no such library"),
    "run a folder": (lambda f: ["run", f], "not a library file"),
    "timeout not a number": (lambda f: ["run", "--timeout", "nan", QUANTIZED], "--timeout"),
    "endless timeout": (lambda f: ["matrix", "executorch", "--timeout", "inf"], "at most"),
    # the harness counts in milliseconds: less was 0 ms, a false timeout before any step ran
    "sub-millisecond timeout": (lambda f: ["run", "--timeout", "0.0005", QUANTIZED], "at least"),
    "memory past any count": (lambda f: ["run", "--mem", str(1 << 44), QUANTIZED],
                              "--mem: at most"),
    "empty step": (lambda f: ["run", "py:"], "an empty step 'py:'"),
    "empty target": (lambda f: ["matrix", ""], "a target is empty"),
    "empty scan target": (lambda f: ["scan", "executorch", ""], "a target is empty"),
    "repro missing log": (lambda f: ["repro", "--log", f / "no.log", "executorch"], "no.log"),
    "out under a file": (lambda f: ["matrix", QUANTIZED, "--out", under_a_file(f)],
                         "is not a folder"),
    "empty out": (lambda f: ["matrix", QUANTIZED, "--out", ""], "an empty path"),
    # Path("") is the working folder: "--add .: no such file" named a path nobody gave
    "empty add": (lambda f: ["scan", "executorch", "--add", ""], "argument --add: an empty path"),
    "empty expect": (lambda f: ["matrix", "executorch", "--expect", ""],
                     "argument --expect: an empty path"),
    "folder as add": (lambda f: ["matrix", "executorch", "--add", f],
                      "a folder, not a library (give a TARGET for a folder of libraries)"),
    "one add twice": (lambda f: ["scan", "executorch", "--add", LEGACY_PLUGIN, "--add",
                                 LEGACY_PLUGIN],
                      "extra/libquantized_ops_legacy_plugin.so is already in another --add"),
    "add of a library the target holds": (
        lambda f: ["matrix", "executorch", "--add", QUANTIZED],
        "already holds it, as lib/libexecutorch_kernels_quantized.so"),
    "db under a file": (lambda f: ["fuzz", QUANTIZED, "--db", under_a_file(f)], "is not a folder"),
    # no folder can be made there, whatever the permission bits say (even to root)
    "out in /proc": (lambda f: ["matrix", QUANTIZED, "--out", "/proc/loadfuzz-out"],
                     "cannot make a folder in /proc"),
    "db in /proc": (lambda f: ["fuzz", QUANTIZED, "--db", "/proc/loadfuzz-db"],
                    "cannot make a folder in /proc"),
    "jobs past any machine": (lambda f: ["repro", "Segmentation fault", "executorch", "--jobs",
                                         "99999999999999999999"], "at most 4096"),
    "resume of a garbled campaign": (lambda f: ["matrix", "executorch", "--resume", "--out",
                                                garbled_campaign(f)], "line 1 is not a trial"),
    # no file system holds a name of 300 bytes: stat() says ENAMETOOLONG, which was exit 3
    "target name too long": (lambda f: ["matrix", f / ("x" * 300)], TOO_LONG),
    "scan target name too long": (lambda f: ["scan", f / ("x" * 300)], TOO_LONG),
    "run step name too long": (lambda f: ["run", f / ("x" * 300 + ".so")], TOO_LONG),
    "out name too long": (lambda f: ["matrix", QUANTIZED, "--out", f / ("x" * 300)],
                          f"argument --out: {TOO_LONG}"),
    "db name too long": (lambda f: ["fuzz", QUANTIZED, "--db", f / ("x" * 300)],
                         f"argument --db: {TOO_LONG}"),
    "merge folder name too long": (lambda f: ["merge", f / ("x" * 300), "--out", f / "merged"],
                                   f"argument DIR: {TOO_LONG}"),
    # a dangling link took the place where --out was to be made: mkdir said EEXIST, exit 3
    "out a dangling link": (lambda f: ["matrix", QUANTIZED, "--add", LEGACY_PLUGIN,
                                       "--out", dangling(f)], "is a symbolic link to"),
    "out under a dangling link": (lambda f: ["repro", "Segmentation fault", QUANTIZED,
                                             "--out", dangling(f) / "sub"],
                                  "is a symbolic link to"),
    "db a dangling link": (lambda f: ["fuzz", QUANTIZED, "--db", dangling(f)],
                           "is a symbolic link to"),
    "expectations nested too deeply": (lambda f: ["matrix", "executorch", "--expect",
                                                  deeply_nested(f)], "nested too deeply"),
    "a newline in a path": (lambda f: ["scan", newline_in_name(f)], "two\\nlines.so"),
    "a fifo as target": (lambda f: ["matrix", fifo(f)], "not a regular file nor a folder"),
    "a fifo as --add": (lambda f: ["scan", "executorch", "--add", fifo(f)], "not a regular file"),
    "timeout written as python does": (lambda f: ["run", "--timeout", "1_0", QUANTIZED],
                                       "not a number: '1_0'"),
    "resume of a fuzz campaign": (lambda f: ["matrix", QUANTIZED, "--add", LEGACY_PLUGIN,
                                             "--resume", "--out", fuzz_campaign(f)],
                                  "holds a fuzz campaign: only a matrix campaign can be resumed"),
    "resume of trials that are no matrix's": (
        lambda f: ["matrix", QUANTIZED, "--add", LEGACY_PLUGIN, "--resume", "--out",
                   three_step_trials(f)], "only a matrix campaign can be resumed"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, case):
    make, words = CASES[case]
    folder = tmp_path / "input"
    folder.mkdir()
    args = [*make(folder)]
    if args[0] in ("matrix", "fuzz", "repro") and "--out" not in args:
        args += ["--out", tmp_path / "out"]
    if args[0] == "fuzz" and "--db" not in args:
        args += ["--db", tmp_path / "db"]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    done = loadfuzz(*args, cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("loadfuzz: ") and done.stderr.count("\n") == 1, done.stderr
    assert words in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_path_with_spaces_newlines_and_non_ascii_is_valid_input(tmp_path):
    folder = tmp_path / "dossier spécial\nligne deux"
    folder.mkdir()
    plugin = folder / "libquantized_ops_legacy_plugin.so"
    plugin.write_bytes(LEGACY_PLUGIN.read_bytes())
    done = loadfuzz("matrix", "executorch", "--add", plugin, "--select", "lib/libexecutorch_kernels_q*",
                    "--select", "extra/*", "--flags", "local", "--out", tmp_path / "out", "--json")
    assert done.returncode == 1, done.stderr
    import json
    summary = json.loads(done.stdout)
    assert len(summary["findings"]) == 2
    rerun = __import__("subprocess").run(["sh", "-c", summary["findings"][0]["repro"]],
                                         capture_output=True, text=True)
    assert rerun.returncode == 1 and "Re-registering quantized_decomposed::add.out" in rerun.stdout


def baseline_of_nothing(folder):
    return folder / "no-such-campaign"


def taken(folder):
    (folder / "used").mkdir()
    (folder / "used" / "trials.jsonl").write_text("")  # an earlier campaign's
    return folder / "used"


BEFORE_THE_TARGET = {
    "bad --expect": (lambda f: ["matrix", "executorch", "--expect", bad_toml(f)], "bad.toml"),
    "missing --baseline": (lambda f: ["fuzz", "executorch", "--budget", "5s",
                                      "--baseline", baseline_of_nothing(f)], "no such folder"),
    "out under a file": (lambda f: ["matrix", "executorch", "--out", under_a_file(f)],
                         "is not a folder"),
    "out already used": (lambda f: ["matrix", "executorch", "--out", taken(f)], "already holds"),
    "resume of nothing": (lambda f: ["matrix", "executorch", "--resume", "--out", f / "empty"],
                          "holds no campaign"),
}


@pytest.mark.parametrize("case", BEFORE_THE_TARGET)
def test_what_the_user_wrote_is_checked_before_the_target_is_read(tmp_path, case):
    """A mistake in the command line costs nothing: no ELF file read, no cache filled."""
    make, words = BEFORE_THE_TARGET[case]
    folder = tmp_path / "input"
    folder.mkdir()
    args = make(folder)
    if "--out" not in args:
        args += ["--out", tmp_path / "out"]
    cache = tmp_path / "cache"
    done = loadfuzz(*args, cwd=tmp_path, env={**os.environ, "XDG_CACHE_HOME": str(cache)})
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert not cache.exists(), sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))[:5]


def test_a_budget_reads_as_people_write_durations():
    written = ("90", "90s", "10m", "1h", "1h30m", "2m30s", "1h0m5s", "1.5h")
    assert [budget(text) for text in written] == [90, 90, 600, 3600, 5400, 150, 3605, 5400]


def test_bad_input_starts_no_fork_server_even_when_the_last_run_says_which(tmp_path, monkeypatch):
    """A matrix run again starts the servers its last run took before it reads the target
    (a guess kept in the cache); those servers run libraries' constructors. A mistake in
    the command line is found before that."""
    from loadfuzz.cli import main
    from loadfuzz.run import pool

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    target = str(LEGACY_PLUGIN.parent.parent / "corpus")
    monkeypatch.chdir(tmp_path)
    assert main(["matrix", target, "--out", str(tmp_path / "first")]) == 1  # the pair collides
    started = []
    monkeypatch.setattr(pool, "Harness", lambda *a, **k: started.append(a) or 1 / 0)
    assert main(["matrix", target, "--expect", str(bad_toml(tmp_path)),
                 "--out", str(tmp_path / "second")]) == 2
    assert started == []
    main(["matrix", target, "--out", str(tmp_path / "third")])  # its servers fail: cold trials
    assert started  # (the same command with good input starts them)


@pytest.mark.parametrize("command", ["matrix", "fuzz"])
@pytest.mark.parametrize("where", ["in no folder", "a folder"])
def test_a_step_summary_that_cannot_be_written_is_bad_input_before_anything_runs(
        tmp_path, command, where):
    # found out at the end, it turned a finished campaign, reports written, into exit 3
    step_summary = tmp_path / "nowhere" / "summary.md" if where == "in no folder" else tmp_path
    args = [command, QUANTIZED, "--add", LEGACY_PLUGIN, "--out", tmp_path / "out"]
    if command == "fuzz":
        args += ["--db", tmp_path / "db", "--budget", "5s"]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    done = loadfuzz(*args, env={**os.environ, "GITHUB_STEP_SUMMARY": str(step_summary)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"loadfuzz: GITHUB_STEP_SUMMARY={step_summary}: ")
    assert done.stderr.count("\n") == 1 and done.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_step_summary_that_fills_up_is_a_warning_and_the_results_stand(tmp_path):
    # /dev/full passes every check (a file, writable) and fails the append: exit 3 blamed the
    # results folder, which was whole, and offered a --resume that had nothing to do
    done = loadfuzz("matrix", QUANTIZED, "--add", LEGACY_PLUGIN, "--out", tmp_path / "out",
                    env={**os.environ, "GITHUB_STEP_SUMMARY": "/dev/full"})
    assert done.returncode == 1, done.stderr  # the pair collides: the campaign's own status
    assert done.stderr == ("loadfuzz: warning: GITHUB_STEP_SUMMARY=/dev/full: could not append "
                           "the report (No space left on device); the results folder is whole\n")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["findings"] and "incomplete" not in summary
    assert not (tmp_path / "out" / "error.log").exists()


def test_the_report_is_appended_to_the_step_summary_after_what_it_held(tmp_path):
    step_summary = tmp_path / "step.md"
    step_summary.write_text("# earlier step\n")
    done = loadfuzz("matrix", QUANTIZED, "--add", LEGACY_PLUGIN, "--out", tmp_path / "out",
                    env={**os.environ, "GITHUB_STEP_SUMMARY": str(step_summary)})
    assert done.returncode == 1, done.stderr
    report = (tmp_path / "out" / "report.md").read_text()
    assert step_summary.read_text() == "# earlier step\n" + report + "\n"
