"""A trial runs any load order in a process of its own and says what happened, at which step.

Every hostile fixture is run on each path, cold (a fresh process), forked from
a fork server, and forked from a row server that took the first step (shared
prefix), and must be classified the same way on each.
"""

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from loadfuzz import hostenv, inventory
from loadfuzz.model import Flags, Outcome, StepKind
from loadfuzz.plan import pairs
from loadfuzz.run.harness import Harness, HarnessDied, HarnessStep, Limits, run_cold
from loadfuzz.run.pool import ServerPool
from loadfuzz.run.schedule import run_all
from loadfuzz.run.tiers import Tiers
from loadfuzz.run.trials import Trials
from support import (
    AOT,
    ET,
    EXTENSION,
    FIXTURES,
    LEGACY_PLUGIN,
    LOADFUZZ,
    PATHS,
    QUANTIZED,
    Lib,
    alive_children,
    build,
    children_now,
    hostile,
    loadfuzz,
    processes_holding,
    step,
    trials_on,
)

LIMITS = Limits(timeout_s=2)
CLEAN = hostile("clean")

# fixture -> (outcome, signal, exit code); each loaded as step 1 between two clean libraries
HOSTILE = {
    "segv": (Outcome.CRASH, signal.SIGSEGV, None),
    "sigbus": (Outcome.CRASH, signal.SIGBUS, None),
    "sigkill": (Outcome.CRASH, signal.SIGKILL, None),
    "hang": (Outcome.TIMEOUT, signal.SIGKILL, None),
    "spin": (Outcome.TIMEOUT, signal.SIGKILL, None),
    "exit0": (Outcome.EXIT, None, 0),
    "exit7": (Outcome.EXIT, None, 7),
    "alloc30g": (Outcome.ABORT, signal.SIGABRT, None),
    "abrt_handler": (Outcome.ABORT, signal.SIGABRT, None),
    "undefined_symbol": (Outcome.LOAD_ERROR, None, 0),
    "needs_missing": (Outcome.LOAD_ERROR, None, 0),
}
# fixtures that misbehave but let the load complete
SURVIVABLE = ["fork_linger", "flood", "closefds", "rmcwd", "thread_lock"]


@pytest.fixture(scope="module", params=PATHS)
def trials(request):
    with trials_on(request.param, LIMITS) as runner:
        yield runner


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_library_gets_its_outcome_at_its_step(trials, name):
    outcome, number, code = HOSTILE[name]
    record = trials.run((step(CLEAN), step(hostile(name)), step(CLEAN, Flags.LOCAL)))
    assert (record.outcome, record.step, record.signal, record.exit_code) == (
        outcome, 1, number, code)
    assert not processes_holding(hostile(name))


@pytest.mark.parametrize("name", SURVIVABLE)
def test_libraries_that_misbehave_but_load_are_clean_and_leave_nothing(trials, name):
    record = trials.run((step(CLEAN), step(hostile(name)), step(CLEAN, Flags.LOCAL)))
    assert (record.outcome, record.step, record.exit_code) == (Outcome.CLEAN, None, 0)
    assert not processes_holding(hostile(name))


def test_a_lingering_grandchild_in_its_own_session_is_killed_and_counted(trials):
    record = trials.run((step(hostile("fork_linger")),))
    assert "leftover" in record.detail
    assert not processes_holding(hostile("fork_linger"))


def test_a_hang_is_reported_within_the_limit_plus_a_second():
    with Trials(LIMITS, cold=True) as runner:
        began = time.monotonic()
        record = runner.run((step(hostile("hang")),))
    assert record.outcome is Outcome.TIMEOUT
    assert time.monotonic() - began < LIMITS.timeout_s + 2
    assert not processes_holding(hostile("hang"))


def test_a_step_and_an_exit_each_within_the_limit_are_clean_however_long_together(
        tmp_path, monkeypatch):
    """The limit holds for each step and for the exit after the last (--at-exit runs the
    destructors): loadfuzz waits for all of them, plus a margin (made small here)."""
    from loadfuzz.run import harness

    source = tmp_path / "slow.c"
    source.write_text("#include <unistd.h>\n"
                      "__attribute__((constructor)) static void c(void) { usleep(1200000); }\n"
                      "__attribute__((destructor)) static void d(void) { usleep(1200000); }\n")
    slow = tmp_path / "libslow_both.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(slow), str(source)], check=True)
    monkeypatch.setattr(harness, "MARGIN_S", 0.5)
    with Trials(Limits(timeout_s=1.5, at_exit=True), cold=True) as runner:
        record = runner.run((step(slow),))
    assert record.outcome is Outcome.CLEAN, record.detail


def test_a_flood_of_output_is_bounded_in_the_record_and_in_loadfuzz():
    rss_before = psutil.Process().memory_info().rss
    with Trials(LIMITS, cold=True) as runner:
        record = runner.run((step(hostile("flood")),))
    assert record.outcome is Outcome.CLEAN
    assert len(record.detail) < 400
    assert psutil.Process().memory_info().rss - rss_before < 50 * 2**20


def core_files_go_to() -> tuple[Path, str]:
    """Where the kernel writes a core of the core probe, and the start of its name."""
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|"):
        pytest.skip(f"cores are piped to a program here ({pattern}): no file to look for")
    where = Path(pattern.split("%")[0])
    folder = where.parent if where.is_absolute() else FIXTURES / "core-probe"
    return folder, where.name


def cores_in(folder: Path, prefix: str) -> list[Path]:
    return [p for p in folder.glob(f"{prefix}*") if p.is_file()]


def test_a_crash_leaves_no_core_file_where_the_kernel_would_write_one(trials):
    probe = hostile("core_probe")
    folder, prefix = core_files_go_to()
    for old in cores_in(folder, prefix):
        old.unlink()
    # the control: the same crash in a plain process that allows cores (as far as it may:
    # up to its hard limit, all a user who is not root can raise) leaves one there
    if resource.getrlimit(resource.RLIMIT_CORE)[1] == 0:
        pytest.skip("core files are forbidden here (hard RLIMIT_CORE 0): no file to look for")
    subprocess.run([sys.executable, "-c", "import ctypes, resource as r, sys; hard = r.getrlimit("
                    "r.RLIMIT_CORE)[1]; r.setrlimit(r.RLIMIT_CORE, (hard, hard)); "
                    "ctypes.CDLL(sys.argv[1])", str(probe)], capture_output=True)
    written = cores_in(folder, prefix)
    assert written, f"the control crash left no core in {folder}: this check would see nothing"
    for core in written:
        core.unlink()
    record = trials.run((step(CLEAN), step(probe)))
    assert (record.outcome, record.step, record.signal) == (Outcome.CRASH, 1, signal.SIGSEGV)
    assert cores_in(folder, prefix) == []


@pytest.mark.parametrize("command", ["run", "matrix"])  # a cold trial; fork servers
def test_a_caller_that_ignores_sigchld_still_gets_every_verdict(tmp_path, command):
    # A daemon, a CI runner or an embedding program may run loadfuzz with SIGCHLD ignored,
    # which every child inherits: the kernel would reap each trial and its status be lost
    # (an abort came back as "exit 0").
    corpus = FIXTURES / "corpus"
    words = {"run": [corpus / "libcz_pair_a.so", corpus / "libcz_pair_b.so"],
             "matrix": [corpus, "--select", "libcz_pair_*", "--flags", "global",
                        "--out", tmp_path / "out"]}[command]
    done = subprocess.run([str(LOADFUZZ), command, "--json", *map(str, words)],
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN))
    assert done.returncode == 1, done.stderr
    output = json.loads(done.stdout)
    records = output["findings"] if command == "matrix" else [output]
    assert records and {(r["outcome"], r["signal"]) for r in records} == {
        ("reregister", signal.SIGABRT)}
    if command == "matrix":
        assert all(r["via"].startswith("fork-server") for r in records), records


def test_the_next_forked_trial_is_not_deadlocked_by_a_thread_holding_a_lock():
    with Trials(LIMITS) as runner:
        first = runner.run((step(hostile("thread_lock")),))
        second = runner.run((step(CLEAN), step(hostile("thread_lock"))))
    assert first.outcome is second.outcome is Outcome.CLEAN
    assert second.via == "fork-server"


def test_a_fork_server_killed_between_trials_hands_the_next_trial_on_and_the_campaign_goes_on():
    """What the OOM killer or a user's kill -9 does to a server between two trials: the next
    trial finds its control pipe broken, and goes another way with the same verdict."""
    seq = (step(CLEAN), step(hostile("exit7")))
    with Trials(LIMITS) as runner:
        first = runner.run(seq)
        assert first.via.startswith("fork-server")
        for server in runner.pool._all:  # every server it started, idle now
            os.kill(server.proc.pid, signal.SIGKILL)
            server.proc.wait()
        second = runner.run(seq)
    assert verdict(second) == verdict(first) == (Outcome.EXIT, 1, None, 7, None)


def verdict(record):
    return record.outcome, record.step, record.signal, record.exit_code, record.signature


def test_one_row_server_serves_every_fixture_after_its_first_step_as_cold_runs_do():
    row = [(step(CLEAN), step(hostile(name))) for name in [*sorted(HOSTILE), *SURVIVABLE]]
    with Trials(LIMITS) as runner:
        shared = list(runner.run_row(row))
        cold = [runner.run_cold(seq) for seq in row]
    assert {record.via.split(",")[0] for record in shared} == {"shared prefix"}
    assert [verdict(r) for r in shared] == [verdict(r) for r in cold]
    assert runner.disagreements == []
    assert (runner.usage.servers, runner.usage.rows_shared) == (1, 1)


@pytest.mark.parametrize(("name", "why"), [
    ("thread_lock", "the prefix started a thread"),
    ("fork_linger", "the prefix started a process"),
    ("closefds", "the prefix touched the server's pipes"),
    ("rmcwd", "the prefix changed its working folder"),
])
def test_a_first_step_that_a_fork_would_not_copy_whole_is_not_shared(name, why):
    row = [(step(hostile(name)), step(CLEAN)), (step(hostile(name)), step(hostile("segv")))]
    with Trials(LIMITS) as runner:
        records = list(runner.run_row(row))
    assert [(r.outcome, r.step, r.via) for r in records] == [
        (Outcome.CLEAN, None, "fork-server"), (Outcome.CRASH, 1, "fork-server, confirmed cold")]
    assert (runner.usage.rows_shared, runner.usage.rows_not_shared) == (0, {why: 1})


def test_a_first_step_that_fails_fails_every_trial_of_its_row_at_step_zero():
    row = [(step(hostile("exit7")), step(CLEAN)), (step(hostile("exit7")), step(hostile("segv")))]
    with Trials(LIMITS) as runner:
        records = list(runner.run_row(row))
    assert [(r.outcome, r.step, r.exit_code) for r in records] == [(Outcome.EXIT, 0, 7)] * 2
    assert runner.usage.rows_not_shared == {"a step of the prefix ended its process": 1}


def test_what_the_shared_first_step_printed_opens_the_output_of_each_trial_as_cold():
    flood, clean = HarnessStep("g", hostile("flood")), HarnessStep("g", CLEAN)
    cold = run_cold([flood, clean], LIMITS)
    with Harness() as server, server.sharing([flood], LIMITS) as shared:
        forked = [server.run([flood, clean], LIMITS) for _ in range(2)]
    assert shared
    for evidence in forked:
        assert (evidence.output, evidence.output_bytes, evidence.done) == (
            cold.output, cold.output_bytes, 2)
    assert b"fx_flood: done" in cold.output and cold.output_bytes > 100 * 2**20


def test_a_server_runs_the_next_trial_of_a_series_while_the_caller_reads_the_last(tmp_path):
    libpython = hostenv.libpython_path()
    mark = tmp_path / "the second trial ran"
    touch = [HarnessStep("g", libpython), HarnessStep("y", libpython, f"open({str(mark)!r}, 'w')")]
    with Harness() as server:
        results = server.run_each([([HarnessStep("g", CLEAN)], 0), (touch, 1)], LIMITS)
        first = next(results)
        deadline = time.monotonic() + 30
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert mark.exists(), "the second trial waited for its result to be asked for"
        second = next(results)
    assert (first.steps, first.done, second.steps, second.done) == (1, 1, 1, 1)


def test_a_row_left_with_a_trial_sent_closes_its_server_so_no_later_trial_reads_that_result():
    row = [(step(CLEAN), step(hostile(name))) for name in ("segv", "exit7", "clean", "exit0")]
    with Trials(LIMITS) as runner:
        records = runner.run_row(row)
        first = next(records)
        records.close()  # exit7 was sent already; a stopped campaign leaves its row like this
        again = runner.run((step(CLEAN), step(CLEAN)))
    assert (first.outcome, first.step) == (Outcome.CRASH, 1)
    assert (again.outcome, again.via, runner.disagreements) == (Outcome.CLEAN, "fork-server", [])
    assert runner.usage.servers == 2


def test_a_matrix_row_is_one_batch_and_a_cold_runner_shares_nothing():
    libs = [Lib(f"lib{n}", hostile(name))
            for n, name in enumerate(["clean", "segv", "exit7", "flood", "spin"])]
    work = pairs(libs, [Flags.GLOBAL, Flags.LOCAL])
    with Trials(LIMITS) as fast, Trials(LIMITS, cold=True) as cold:
        assert [len(batch) for batch in fast.batches(work)] == [4] * 10
        assert [seq for batch in fast.batches(work) for seq in batch] == work
        assert all(batch.route == fast.row_key(seq) for batch in fast.batches(work)
                   for seq in batch), "a row carries its key: running it routes nothing again"
        assert [len(batch) for batch in cold.batches(work)] == [1] * 40


def test_the_servers_a_matrix_needs_start_while_it_is_planned_and_each_serves_its_trials():
    """Planning (routing each pair) takes a while on a big target: the first time a fork
    server's preload comes up, that server starts in the background; the trials that need it
    take that one and no other starts for them."""
    et = inventory.load_target(str(ET))
    libs = [lib for lib in et.libraries if lib.path.name in (
        "libexecutorch.so", "libquantized_ops_aot_lib.so", "libexecutorch_kernels_quantized.so")]
    work = pairs(libs, [Flags.GLOBAL])
    with Trials(LIMITS, Tiers.of(libs, link_map=et.link_map)) as trials:
        batches = trials.batches(work)
        planned = {batch_route.preload for batch_route in map(trials.row_key,
                                                               (b[0] for b in batches))}
        deadline = time.monotonic() + 30
        while trials.usage.servers < len(planned) and time.monotonic() < deadline:
            time.sleep(0.05)  # no trial has run: only what planning started
        assert trials.usage.servers == len(planned)
        records = [record for batch in batches for record in trials.run_batch(batch)]
        assert trials.usage.servers == len(planned) >= 1
    assert [r.sequence for r in records] == [seq for b in batches for seq in b]


@pytest.mark.parametrize("flags", [Flags.GLOBAL, Flags.LOCAL])
@pytest.mark.parametrize("reverse", [False, True])
def test_run_time_quantized_kernels_and_the_legacy_plugin_reregister_in_either_order(
        flags, reverse):
    pair = [QUANTIZED, LEGACY_PLUGIN][::-1 if reverse else 1]
    result = subprocess.run([str(LOADFUZZ), "run", "--json", f"{flags.value}:{pair[0]}",
                             f"{flags.value}:{pair[1]}"], capture_output=True, text=True)
    record = json.loads(result.stdout)
    assert result.returncode == 1
    assert (record["outcome"], record["signature"], record["op"], record["step"]) == (
        "reregister", "executorch-reregister", "quantized_decomposed::add.out", 1)


def test_the_export_plugin_loaded_twice_is_a_torch_duplicate_operator(tmp_path):
    copy = tmp_path / "copy of the export plugin" / "libquantized_ops_aot_lib.so"
    copy.parent.mkdir()
    copy.write_bytes(AOT.read_bytes())
    result = subprocess.run([str(LOADFUZZ), "run", "--json", str(AOT), str(copy)],
                            capture_output=True, text=True)
    record = json.loads(result.stdout)
    assert (record["outcome"], record["signature"], record["op"], record["step"]) == (
        "reregister", "torch-duplicate-op", "quantized_decomposed::add.out", 1)


def test_the_profiler_then_the_python_extension_is_clean():
    result = subprocess.run([str(LOADFUZZ), "run", "--json", str(ET / "lib/libexecutorch_etdump.so"),
                             str(EXTENSION)], capture_output=True, text=True)
    record = json.loads(result.stdout)
    assert (result.returncode, record["outcome"], record["exit_code"]) == (0, "clean", 0)


def test_importing_the_extension_in_the_embedded_interpreter_is_clean():
    with Trials(LIMITS, cold=True) as runner:
        record = runner.run((step(ET / "lib/libexecutorch_etdump.so"),
                             step(EXTENSION, Flags.LOCAL, StepKind.IMPORT)))
    assert record.outcome is Outcome.CLEAN


def test_the_repro_command_reruns_the_trial_even_through_awkward_paths(tmp_path):
    odd = tmp_path / "a dir with spaces\nand a newline é" / "libquantized kernels.so"
    odd.parent.mkdir()
    odd.write_bytes(QUANTIZED.read_bytes())
    os.symlink(ET / "lib" / "libexecutorch.so", odd.parent / "libexecutorch.so")
    os.symlink(ET / "lib" / "libexecutorch_threadpool.so",
               odd.parent / "libexecutorch_threadpool.so")
    with Trials(LIMITS, cold=True) as runner:
        record = runner.run((step(odd), step(LEGACY_PLUGIN)))
    assert record.outcome is Outcome.REREGISTER
    rerun = subprocess.run(["sh", "-c", record.repro.replace(" run ", " run --json ", 1)],
                           capture_output=True, text=True)
    assert json.loads(rerun.stdout)["outcome"] == "reregister"


def test_trials_do_not_inherit_ld_preload(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", str(hostile("exit7")))
    with Trials(LIMITS, cold=True) as runner:
        record = runner.run((step(CLEAN),))
    assert record.outcome is Outcome.CLEAN


def test_a_trial_sees_exactly_the_environment_the_contract_lists(monkeypatch):
    """docs/contract.md, "What a trial gets"; nothing of loadfuzz's own environment."""
    monkeypatch.setenv("PYTHONPATH", "/nowhere")
    libpython = hostenv.libpython_path()
    show = "import json, os\nprint(json.dumps(dict(os.environ)), flush=True)\n"
    evidence = run_cold([HarnessStep("g", libpython), HarnessStep("y", libpython, show)], LIMITS, 1)
    seen = json.loads(evidence.output)
    assert set(seen) == {"PATH", "HOME", "TMPDIR", "LANG", "LOADFUZZ_PYTHON", "PYTHONNOUSERSITE",
                         "PYTHONDONTWRITEBYTECODE", "LD_LIBRARY_PATH"}  # torch is installed
    assert (seen["LOADFUZZ_PYTHON"], seen["LD_LIBRARY_PATH"]) == (
        sys.executable, str(hostenv.torch_lib_dir()))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("second", [QUANTIZED, AOT], ids=["kernels", "aot-lib"])
def test_the_seed_pair_is_classified_the_same_on_every_path(path, second):
    # tiers as a campaign over the wheel plus the plugin has them: the export plugin's closure
    # has libtorch_python, so it needs libpython (as a Python process has it) and torch preloaded
    tiers = Tiers.of(inventory.load_target("executorch", [LEGACY_PLUGIN]).libraries)
    with trials_on(path, LIMITS, tiers=tiers) as runner:
        record = runner.run((step(LEGACY_PLUGIN), step(second)))
    assert (record.outcome, record.signature, record.op, record.step) == (
        Outcome.REREGISTER, "executorch-reregister", "quantized_decomposed::add.out", 1)
    assert record.via == {"cold": "cold", "fork-server": "fork-server, confirmed cold",
                          "shared-prefix": "shared prefix, confirmed cold"}[path]


def test_the_scratch_folder_a_killed_loadfuzz_left_is_swept_by_the_next_pool_never_a_live_one(
        tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    killed = subprocess.run([sys.executable, "-c", (
        f"import os, signal, tempfile\ntempfile.tempdir = {str(tmp_path)!r}\n"
        "from loadfuzz.run.harness import Harness\nserver = Harness()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")])
    assert killed.returncode == -signal.SIGKILL  # no cleanup of any kind ran
    [left] = tmp_path.iterdir()
    being_made = tmp_path / (left.name[:-3] + "new")  # unlocked, but only just made
    being_made.mkdir()
    with Harness() as live:
        for folder in (left, live.scratch):
            os.utime(folder, (1, 1))  # untouched for a long time
        ServerPool().close()
        assert sorted(tmp_path.iterdir()) == sorted([being_made, live.scratch])


@pytest.mark.parametrize("preload, why", [
    ("libnowhere.so", "preloading failed"),  # the server says so
    ("exit7", "the harness died"),  # the server is gone before its greeting
    ("segv", "the harness died"),
])
def test_a_server_that_cannot_start_leaves_no_process_and_no_scratch_folder(
        tmp_path, monkeypatch, preload, why):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    path = tmp_path / preload if preload.endswith(".so") else hostile(preload)
    children_before = children_now()
    with pytest.raises(HarnessDied, match=why):
        Harness((HarnessStep("l", path),))
    assert list(scratch.iterdir()) == []
    assert alive_children(children_before) == []


@pytest.mark.parametrize("when", ["while it starts", "once it started"])
def test_a_server_started_ahead_for_trials_that_never_came_is_closed_with_its_pool(
        tmp_path, monkeypatch, when):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    children_before = children_now()
    pool = ServerPool()
    pool.prestart((HarnessStep("l", CLEAN),))
    deadline = time.monotonic() + 30
    while when == "once it started" and not pool.usage.servers and time.monotonic() < deadline:
        time.sleep(0.01)
    pool.close()
    for thread in threading.enumerate():
        if thread.name == "loadfuzz-prestart":
            thread.join(timeout=30)
    assert list(scratch.iterdir()) == []
    assert alive_children(children_before) == []


def test_trials_whose_fork_server_cannot_start_run_cold_and_the_summary_says_why(tmp_path):
    broken = ((HarnessStep("l", tmp_path / "libnowhere.so"),),) * 3
    tiers = Tiers(frozenset(), {}, broken)
    libs = [Lib(f"lib{n}", hostile(name)) for n, name in enumerate(["clean", "segv", "exit7",
                                                                      "sigbus", "clean"])]
    work = pairs(libs, [Flags.GLOBAL])
    records = []
    with Trials(LIMITS, tiers) as runner:
        run_all(runner, work, 2, records.append)
    assert len(records) == len(work) and {r.via for r in records} == {"cold"}
    by_pair = {(r.sequence[0].lib, r.sequence[1].lib): r.outcome for r in records}
    assert by_pair[("lib0", "lib1")] is Outcome.CRASH and by_pair[("lib0", "lib4")] is Outcome.CLEAN
    assert runner.usage.servers == 0
    assert list(runner.usage.servers_failed) == ["libnowhere.so"]


def test_a_repro_command_carries_the_limits_the_trial_ran_under():
    limits = Limits(timeout_s=3, mem_mb=2048, at_exit=True)
    with Trials(limits, cold=True) as runner:
        record = runner.run((step(CLEAN),))
    assert " --timeout 3 --mem 2048 --at-exit " in record.repro
    again = subprocess.run(record.repro, shell=True, capture_output=True, text=True)
    assert again.returncode == 0 and "outcome: clean" in again.stdout


def test_json_output_is_utf8_whatever_bytes_a_path_holds(tmp_path):
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/u\xe9\xff"))
    folder.mkdir()
    library = folder / "libfx_clean.so"
    library.write_bytes((FIXTURES / "hostile" / "libfx_clean.so").read_bytes())
    done = subprocess.run([str(LOADFUZZ), "run", "--json", str(library)], capture_output=True)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout.decode("utf-8"))  # strict: every byte is UTF-8
    assert record["sequence"][0]["lib"] == str(library)  # the same path, as \udcXX escapes


def test_an_exit_says_the_last_line_the_trial_printed_as_an_abort_does(tmp_path):
    build(tmp_path, "quits", '#include <stdio.h>\n#include <stdlib.h>\n'
          '__attribute__((constructor)) static void quit(void) {\n'
          '    fputs("fatal: widget table corrupt\\n  giving up  \\n", stderr);\n    exit(3);\n}\n')
    done = loadfuzz("run", tmp_path / "libquits.so")
    assert done.returncode == 1, done.stderr
    assert ("detail: the process exited with status 3 during step 0: giving up"
            in done.stdout.splitlines()), done.stdout
