"""A campaign that cannot finish says so, and never looks like a finding: a full disk, an
internal failure, a corrupt example database and two campaigns on one folder.

Exit status 3 means "loadfuzz could not finish" (one line on stderr, the traceback in
error.log); 1 is only ever "the campaign completed and found something unexpected".
"""

import errno
import fcntl
import json
import os
import resource
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from support import FIXTURES, LEGACY_PLUGIN, LOADFUZZ, PAIRS_WITH_PLUGIN, loadfuzz

CORPUS = FIXTURES / "corpus"


def whole_lines(path):
    """Every line of a trials.jsonl, each of which must parse."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "the file ends in a torn line"
    return [json.loads(line) for line in data.splitlines()]


@pytest.fixture
def tiny_disk(tmp_path):
    """A 100 KiB tmpfs: the results folder of a whole matrix does not fit on it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 100 KiB tmpfs needs root; these tests run as root in CI")
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100k", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_disk_is_exit_3_with_one_line_whole_records_and_a_resume_that_finishes(
        tiny_disk, tmp_path):
    out = tiny_disk / "out"
    scratch = tmp_path / "tmp"  # its servers' scratch folders: all gone when it stops
    scratch.mkdir()
    done = loadfuzz("matrix", "executorch", "--add", LEGACY_PLUGIN, "--out", out,
                    env={**os.environ, "TMPDIR": str(scratch)})
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "No space left on device" in done.stderr and "--resume --out" in done.stderr
    assert not (out / "error.log").exists() or (out / "error.log").stat().st_size > 0
    kept = whole_lines(out / "trials.jsonl")
    assert 0 < len(kept) < PAIRS_WITH_PLUGIN
    assert list(scratch.iterdir()) == []
    bigger = tmp_path / "bigger"
    shutil.copytree(out, bigger)
    resumed = loadfuzz("matrix", "executorch", "--add", LEGACY_PLUGIN, "--resume", "--out", bigger,
                       "--json")
    assert resumed.returncode == 1, resumed.stderr  # the plugin's collisions: unexpected
    lines = whole_lines(bigger / "trials.jsonl")
    keys = [json.dumps(line["sequence"]) for line in lines]
    assert len(keys) == len(set(keys)) == PAIRS_WITH_PLUGIN
    assert lines[:len(kept)] == kept


@pytest.mark.parametrize("path", ["fork server, confirmed cold", "--cold"])
def test_a_file_size_limit_too_small_for_the_loaders_report_leaves_the_finding_explained_statically(
        path, tmp_path):
    """The loader's report of a finding's cold run (LD_DEBUG) is a file: a limit on file sizes
    (`ulimit -f`) can kill its run. The verdict never depends on it: the finding stands, its
    cause read from the ELF files."""
    corpus = FIXTURES / "corpus"
    limit = 400 << 10

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    options = ["--cold"] if path == "--cold" else []
    done = subprocess.run([str(LOADFUZZ), "run", "--json", *options, str(corpus / "libcz_pair_a.so"),
                           str(corpus / "libcz_pair_b.so")], capture_output=True, text=True,
                          timeout=120, preexec_fn=small_files, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    record = json.loads(done.stdout)
    assert record["signature"] == "executorch-reregister"
    assert record["cause"]["evidence"] == "static"


def test_reports_that_cannot_all_be_written_leave_none_that_reads_as_finished(tmp_path):
    """A file size limit that takes trials.jsonl (40 kB) but not matrix.html: exit 3, and no
    report.md saying "every trial was clean" over a campaign that never finished."""
    limit = 50 << 10

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out = tmp_path / "out"
    done = subprocess.run([str(LOADFUZZ), "matrix", str(FIXTURES / "corpus"), "--exclude",
                           "libcz_pair_*", "--out", str(out)], capture_output=True, text=True,
                          timeout=300, preexec_fn=small_files)
    assert done.returncode == 3, done.stderr
    assert len(whole_lines(out / "trials.jsonl")) == 7 * 6 * 2
    assert not (out / "summary.json").exists()
    assert not (out / "report.md").exists() or "Incomplete" in (out / "report.md").read_text()
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


def test_running_out_of_open_files_is_exit_3_with_what_to_do(tmp_path):
    def few_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    done = subprocess.run([str(LOADFUZZ), "matrix", str(FIXTURES / "corpus"), "--jobs", "32",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=300, preexec_fn=few_files)
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "Too many open files" in done.stderr
    assert "raise the open-files limit (ulimit -n) or pass fewer --jobs" in done.stderr


def test_a_cached_harness_unreadable_for_want_of_file_descriptors_is_not_blamed_on_the_cache(
        tmp_path, monkeypatch):
    """Out of file descriptors, reading the cached harness fails with EMFILE: that is the
    machine's limit (the command line advises `ulimit -n`), not a harness cut short to build
    again; and a build that runs out of them is not "cannot store the harness" either."""
    from loadfuzz.run import build

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    binary = build.harness_binary()
    probe = f"""if True:
        import errno, os, resource
        from pathlib import Path
        from loadfuzz.run import build
        resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))
        while True:
            try:
                os.open(os.devnull, os.O_RDONLY)
            except OSError:
                break
        try:
            print(build.whole(Path({str(binary)!r})))
        except OSError as exc:
            print(errno.errorcode[exc.errno])
        """
    done = subprocess.run([str(LOADFUZZ.parent / "python"), "-c", probe],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "EMFILE", done.stdout + done.stderr

    def out_of_descriptors(*_args, **_kwargs):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    binary.unlink()
    monkeypatch.setattr(build.subprocess, "run", out_of_descriptors)
    with pytest.raises(OSError) as raised:
        build.harness_binary()
    assert raised.type is OSError and raised.value.errno == errno.EMFILE


@pytest.mark.parametrize("how", ["no compiler", "a compiler that fails", "no cache folder"])
def test_a_harness_that_cannot_be_built_is_exit_3_and_the_traceback_goes_to_error_log(
        tmp_path, how):
    blocker = tmp_path / "a file, not a folder"
    blocker.write_text("")
    scratch = tmp_path / "tmp"  # where its servers would have kept their scratch folders
    scratch.mkdir()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "fresh cache"), "TMPDIR": str(scratch)}
    if how == "no compiler":
        env["CC"] = str(tmp_path / "no-such-cc")
    elif how == "a compiler that fails":
        env["CC"] = "false"  # says nothing, exits 1
    else:
        env["XDG_CACHE_HOME"] = str(blocker)
    out = tmp_path / "out"
    done = subprocess.run([str(LOADFUZZ), "matrix", CORPUS, "--flags", "global", "--out", out],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("loadfuzz: could not finish: cannot ")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "harness" in done.stderr and str(out / "error.log") in done.stderr
    assert "Traceback" in (out / "error.log").read_text()
    assert list(scratch.iterdir()) == []
    if "compiler" in how:  # what to do about it
        assert "set CC" in done.stderr
    for report in ("report.md", "matrix.html"):  # a partial report does not call it clean
        if (out / report).exists():
            assert "no trial ran" in (out / report).read_text()


def test_cc_may_carry_arguments_as_makes_does(tmp_path, monkeypatch):
    """`CC="gcc -DX"` (or `ccache gcc`) is a command with its arguments, not a file name."""
    from loadfuzz.run import build

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "gcc -DLOADFUZZ_TEST_MACRO=1")
    binary = build.harness_binary()
    assert os.access(binary, os.X_OK) and build.whole(binary)


def test_a_cached_harness_cut_short_or_replaced_is_built_again(tmp_path, monkeypatch):
    """The cache holds the binary with its own digest at its end: a harness truncated on disk
    (or swapped for another program) is rebuilt, not run; a build folder that a killed build
    left behind goes at the next build."""
    from loadfuzz.run import build

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    binary = build.harness_binary()
    built = binary.read_bytes()
    stale, fresh = (tmp_path / "loadfuzz" / f".harness-{n}" for n in ("killed", "building"))
    stale.mkdir()
    fresh.mkdir()
    os.utime(stale, (1, 1))
    for damage in (built[:4096], Path(shutil.which("true")).read_bytes()):
        binary.write_bytes(damage)
        assert build.harness_binary() == binary and binary.read_bytes() == built
    assert not stale.exists() and fresh.exists()
    done = subprocess.run([str(binary)], capture_output=True, timeout=10)
    assert done.returncode != 127 and b"usage" in (done.stderr + done.stdout).lower(), done


def fifo_in_place(path: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o755)  # (executable bits: it passes os.access(X_OK))


def folder_in_place(path: Path) -> None:
    path.unlink()
    path.mkdir()


@pytest.mark.parametrize("damage", [fifo_in_place, folder_in_place])
def test_a_cached_harness_that_is_no_file_is_built_again(tmp_path, monkeypatch, damage):
    """A FIFO in its place hung every command (reading it waits for a writer); a folder made
    every matrix exit 3, telling to set XDG_CACHE_HOME though the folder was writable."""
    from loadfuzz.run import build

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    binary = build.harness_binary()
    built = binary.read_bytes()
    damage(binary)
    assert build.harness_binary() == binary and binary.read_bytes() == built


def test_garbage_in_the_example_database_is_one_warning_and_the_campaign_goes_on(tmp_path):
    db = tmp_path / "db"
    first = loadfuzz("fuzz", CORPUS, "--budget", "2s", "--seed", "1", "--db", db,
                     "--out", tmp_path / "first", "--json")
    assert first.returncode == 1, first.stderr
    for folder in [p for p in db.iterdir() if p.is_dir()]:
        (folder / "0123456789abcdef").write_bytes(os.urandom(64))
    (db / "garbage").write_bytes(os.urandom(64))
    again = loadfuzz("fuzz", CORPUS, "--budget", "2s", "--seed", "1", "--db", db,
                     "--out", tmp_path / "again", "--json")
    assert again.returncode == 1, again.stderr
    # (one warning of the database's; a loaded machine may add "the search ran no trial")
    warnings = [line for line in again.stderr.splitlines()
                if "warning" in line and "the search ran no trial" not in line]
    assert len(warnings) == 1 and "unreadable" in warnings[0], again.stderr
    # What was kept is replayed: each kept sequence runs again (its shrinking may go further
    # now: a finding of the first campaign's last moments was simplified only so far).
    kept = [f["sequence"] for f in json.loads(first.stdout)["found"]]
    ran = {json.dumps(json.loads(line)["sequence"], sort_keys=True)
           for line in (tmp_path / "again" / "trials.jsonl").read_text().splitlines()}
    assert kept and all(json.dumps(seq, sort_keys=True) in ran for seq in kept)
    assert any(f["phase"] == "replay" for f in json.loads(again.stdout)["found"])


def test_campaigns_started_in_the_same_second_without_out_each_get_a_folder(tmp_path):
    # The default folder is named by the second: the shards of one nightly job, started at
    # once, each take a folder of their own (`<time>`, `<time>-2`) instead of refusing.
    args = [str(LOADFUZZ), "matrix", str(CORPUS), "--flags", "global", "--json"]
    shards = [subprocess.Popen([*args, "--shard", f"{k}/2"], cwd=tmp_path, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE) for k in (1, 2)]
    done = [(proc.wait(timeout=300), *proc.communicate()) for proc in shards]
    assert all(status in (0, 1) for status, _, _ in done), done
    outs = [tmp_path / json.loads(stdout)["out"] for _, stdout, _ in done]
    assert len(set(outs)) == 2 and {out.parent for out in outs} == {tmp_path / "results"
                                                                    / "corpus-unversioned"}
    for out, (_, stdout, _) in zip(outs, done, strict=True):
        summary = json.loads((out / "summary.json").read_text())
        assert summary["shard"] == json.loads(stdout)["shard"]
        assert len(whole_lines(out / "trials.jsonl")) == summary["trials"] > 0


def test_a_default_folder_taken_by_another_campaign_is_followed_by_the_next_free_name(tmp_path):
    from loadfuzz.results import ResultsFolder

    def nowhere(lib):
        raise AssertionError(lib)

    stamp = tmp_path / "results" / "corpus-unversioned" / "20261205T151300Z"
    folders = [ResultsFolder(stamp, False, nowhere, default=True) for _ in range(3)]
    for folder in folders:  # all three named before any took its folder, as when started at once
        folder.open()
    try:
        assert [f.out.name for f in folders] == [stamp.name, f"{stamp.name}-2", f"{stamp.name}-3"]
        assert all(f.trials_path == f.out / "trials.jsonl" for f in folders)
    finally:
        for folder in folders:
            folder.close()


def test_a_resume_refused_because_another_campaign_holds_the_folder_leaves_its_file_alone(
        tmp_path):
    # The torn last line is the running campaign's line being written: only the campaign
    # that holds the folder may cut it off.
    out = tmp_path / "out"
    first = loadfuzz("matrix", CORPUS, "--select", "libcz_pair_*", "--flags", "global",
                     "--out", out)
    assert first.returncode == 1, first.stderr
    with (out / "trials.jsonl").open("ab") as file:
        file.write(b'{"sequence": [{"kind": "dlopen", "lib": ')  # being written, mid-line
    before = (out / "trials.jsonl").read_bytes()
    with (out / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the campaign still running there
        resumed = loadfuzz("matrix", CORPUS, "--select", "libcz_pair_*", "--flags", "global",
                           "--resume", "--out", out)
    assert resumed.returncode == 2 and "in use by another campaign" in resumed.stderr, resumed
    assert (out / "trials.jsonl").read_bytes() == before
    again = loadfuzz("matrix", CORPUS, "--select", "libcz_pair_*", "--flags", "global",
                     "--resume", "--out", out)  # and once the folder is free, it is cut off
    assert again.returncode == 1, again.stderr
    assert len(whole_lines(out / "trials.jsonl")) == json.loads(
        (out / "summary.json").read_text())["trials"]


def test_a_campaign_holds_its_folder_until_its_reports_are_written(tmp_path, monkeypatch):
    # Else a --resume started in that moment would take the folder, remove the reports and
    # run, while the first campaign then wrote a finished summary beside it.
    from loadfuzz import report
    from loadfuzz.cli import main

    held = []
    write_all = report.write_all

    def watching(out, *args, **kwargs):
        with (out / ".lock").open("w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
        return write_all(out, *args, **kwargs)

    monkeypatch.setattr(report, "write_all", watching)
    assert main(["matrix", str(CORPUS), "--select", "libcz_pair_*", "--flags", "global",
                 "--out", str(tmp_path / "out")]) == 1
    assert held == [True]


def test_checking_an_out_folder_never_removes_a_folder_by_that_name(tmp_path):
    # Two campaigns started at once on one new --out: if the second's check made and removed
    # the folder itself, it could remove it under the first, which had just made it and was
    # about to take its lock there ("No such file or directory: .../out/.lock", exit 3).
    out = tmp_path / "new" / "out"
    spy = ("import os, sys\n"
           "from pathlib import Path\n"
           "from loadfuzz.results import usable\n"
           "sys.addaudithook(lambda event, args: event in ('os.mkdir', 'os.rmdir')"
           " and print(event, os.fspath(args[0])))\n"
           "usable(Path(sys.argv[1]), '--out')\n")
    done = subprocess.run([str(LOADFUZZ.with_name("python")), "-c", spy, str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    events = [line.split(" ", 1) for line in done.stdout.splitlines()]
    assert [event for event, _ in events] == ["os.mkdir", "os.rmdir"], events  # it did probe
    touched = {Path(path) for _, path in events}
    assert not touched & {out, out.parent}, events
    assert sorted(tmp_path.iterdir()) == []  # and left nothing behind


def test_a_folder_a_running_campaign_holds_is_said_to_be_in_use_not_offered_to_resume(tmp_path):
    # "already holds results: pass --resume" sent the user to a --resume that was refused too
    out = tmp_path / "out"
    words = ["matrix", CORPUS, "--select", "libcz_pair_*", "--flags", "global", "--out", out]
    assert loadfuzz(*words).returncode == 1
    with (out / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the campaign still running there
        held = loadfuzz(*words)
    assert held.returncode == 2 and "in use by another campaign" in held.stderr, held.stderr
    assert "--resume" not in held.stderr
    free = loadfuzz(*words)
    assert free.returncode == 2 and "pass --resume or another --out" in free.stderr


def test_two_campaigns_started_at_once_on_one_folder_refuse_the_second(tmp_path):
    out = tmp_path / "out"
    args = [str(LOADFUZZ), "matrix", str(CORPUS), "--flags", "global", "--out", str(out)]
    both = [subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = sorted((proc.wait(timeout=300), proc.stderr.read()) for proc in both)
    (finished, _), (refused, why) = results
    assert finished == 1 and refused == 2, results  # the corpus has unexpected collisions
    assert why.count("\n") == 1 and ("in use by another campaign" in why
                                     or "already holds results" in why), why
    keys = [json.dumps(line["sequence"]) for line in whole_lines(out / "trials.jsonl")]
    assert len(keys) == len(set(keys))


def test_output_cut_short_by_its_reader_is_the_sigpipe_status_never_a_finding(tmp_path):
    """`loadfuzz matrix ... | head` under `set -o pipefail`: the campaign ran whole, only its
    grid was not read. The status is 128 + SIGPIPE (as a process killed by it), not 1, which
    would say it found something unexpected."""
    out = tmp_path / "out"
    campaign = subprocess.Popen([str(LOADFUZZ), "matrix", str(CORPUS), "--flags", "global",
                                 "--select", "libcz_registry.so", "--select", "libcz_quiet*",
                                 "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    campaign.stdout.close()  # nobody reads it
    stderr = campaign.stderr.read().decode()
    assert campaign.wait(timeout=300) == 128 + signal.SIGPIPE, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert "incomplete" not in summary and summary["trials"] == len(whole_lines(out / "trials.jsonl"))


# --- what a SIGKILL leaves behind is swept by the next command of its kind --------------


def killed_in(code: str, cwd: Path, env: dict | None = None) -> None:
    """Run `code` in a Python that SIGKILLs itself where the code says `die()`."""
    prelude = "import os, signal\ndef die(*_):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    done = subprocess.run([str(LOADFUZZ.with_name("python")), "-c", prelude + code], cwd=cwd,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr


def aged(folder: Path, seconds: float = 3600) -> Path:
    os.utime(folder, (folder.stat().st_atime - seconds, folder.stat().st_mtime - seconds))
    return folder


def test_a_scratch_folder_is_swept_only_once_its_owner_is_gone_and_it_is_a_minute_old(tmp_path):
    from loadfuzz import scratch

    gone, _ = scratch.held(tmp_path, ".kind-")  # its owner "dies": the lock goes with it
    os.close(_)
    young, _ = scratch.held(tmp_path, ".kind-")
    os.close(_)
    alive, owner = scratch.held(tmp_path, ".kind-")
    other = tmp_path / ".other-kind"
    other.mkdir()
    aged(gone), aged(alive), aged(other)
    os.close(owner)  # and another process holds it
    hold = ("import fcntl, os, sys, time\n"
            "fcntl.flock(os.open(sys.argv[1], os.O_RDONLY), fcntl.LOCK_EX)\n"
            "print('held', flush=True)\ntime.sleep(60)\n")
    holder = subprocess.Popen([str(LOADFUZZ.with_name("python")), "-c", hold, str(alive)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert scratch.sweep(tmp_path, ".kind-") == 1
    finally:
        holder.kill()
        holder.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [young.name, alive.name, ".other-kind"])


def test_a_merge_killed_by_sigkill_leaves_a_folder_that_the_next_merge_removes(tmp_path):
    shards = []
    for k in (1, 2):
        done = loadfuzz("matrix", CORPUS, "--flags", "global", "--shard", f"{k}/2",
                        "--out", tmp_path / f"shard{k}")
        assert done.returncode in (0, 1), done.stderr
        shards.append(tmp_path / f"shard{k}")
    out = tmp_path / "merged"
    killed_in("from pathlib import Path\nfrom loadfuzz import merge, report\n"
              "report.render_junit = die\n"
              f"merge.merge([Path({str(shards[0])!r}), Path({str(shards[1])!r})], "
              f"Path({str(out)!r}))\n", cwd=tmp_path)
    [left] = tmp_path.glob(".merged.merging-*")
    assert (left / "trials.jsonl").exists() and not out.exists()
    aged(left)
    done = loadfuzz("merge", *shards, "--out", out)
    assert done.returncode in (0, 1), done.stderr
    assert not left.exists() and (out / "summary.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged", "shard1", "shard2"]


def test_a_wheel_unpack_killed_by_sigkill_is_removed_by_the_next_unpack(tmp_path):
    import zipfile

    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(LEGACY_PLUGIN, "demo/lib/libplugin.so")
        archive.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\n")
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    killed_in("from loadfuzz import targets\n"
              "real = targets.extract_safely\n"
              "targets.extract_safely = lambda *a: (real(*a), die())\n"
              f"targets.unpack_wheel(__import__('pathlib').Path({str(wheel)!r}))\n",
              cwd=tmp_path, env=cache)
    wheels = tmp_path / "cache" / "loadfuzz" / "wheels"
    [left] = wheels.glob(".unpacking-*")
    assert (left / "tree" / "demo" / "lib" / "libplugin.so").exists()
    aged(left)
    done = loadfuzz("scan", wheel, env={**os.environ, **cache})
    assert done.returncode == 0, done.stderr
    [unpacked] = wheels.iterdir()  # the wheel, unpacked again, and nothing else
    assert not unpacked.name.startswith(".") and (unpacked / "demo" / "lib").is_dir()
