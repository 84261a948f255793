"""`pytest --loadfuzz TARGET` in any project: one test per ordered pair and flags mode.

Every run here is a separate pytest process in an empty folder outside the
repository (a user's project), with the legacy plugin fixture and the shipped
expectations file copied into it: pytest picks its root folder from path-like
arguments, so paths into this repository would make it the root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from loadfuzz.api import Outcome, UsageError, run_load_order
from support import AOT, LEGACY_PLUGIN, QUANTIZED, ROOT, hostile

PYTEST = Path(sys.executable).parent / "pytest"
SHIPPED = ROOT / "results" / "expectations" / "executorch.toml"
PLUGIN_ID = "extra/libquantized_ops_legacy_plugin.so"
KQ_ID = "lib/libexecutorch_kernels_quantized.so"
AOT_ID = "kernels/quantized/libquantized_ops_aot_lib.so"
# The seed's collision: the plugin beside the run-time quantized kernels, or beside the
# export-time library that NEEDs them; in both orders.
COLLIDING = {f"{PLUGIN_ID} -> {KQ_ID} @ global", f"{KQ_ID} -> {PLUGIN_ID} @ global",
             f"{PLUGIN_ID} -> {AOT_ID} @ global", f"{AOT_ID} -> {PLUGIN_ID} @ global"}
LIBRARIES = 19  # the wheel's 18 plus the added plugin


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """An empty project folder holding only the plugin under test and its expectations."""
    folder = tmp_path_factory.mktemp("a project")
    (folder / "build").mkdir()
    shutil.copy(LEGACY_PLUGIN, folder / "build")
    shutil.copy(SHIPPED, folder / "executorch.toml")
    return folder


def pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    env["COLUMNS"] = "400"  # summary lines whole, not cut at 80 characters
    return subprocess.run([str(PYTEST), "-p", "no:cacheprovider", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)


def target_args(*extra: str) -> list[str]:
    return ["--loadfuzz", "executorch", "--loadfuzz-add", f"build/{LEGACY_PLUGIN.name}", *extra]


def results(junit: Path) -> dict[str, tuple[str, dict]]:
    """test name -> (passed | failed | xfailed, its trial record), from a JUnit XML file."""
    found = {}
    for case in ET.parse(junit).iter("testcase"):
        if case.find("failure") is not None:
            state = "failed"
        elif (skipped := case.find("skipped")) is not None:
            state = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
        else:
            state = "passed"
        records = [json.loads(p.get("value")) for p in case.iter("property")
                   if p.get("name") == "loadfuzz_record"]
        found[case.get("name")] = (state, records[0] if records else {})
    return found


@pytest.fixture(scope="module")
def whole_matrix(project) -> tuple[subprocess.CompletedProcess, dict]:
    """Every pair of the wheel plus the plugin, global, over two xdist workers, no expectations."""
    run = pytest_in(project, *target_args("--loadfuzz-flags", "global", "-n", "2",
                                          "--junitxml", "whole.xml"))
    return run, results(project / "whole.xml")


def test_every_ordered_pair_is_one_test_and_only_the_colliding_pairs_fail(whole_matrix):
    run, tests = whole_matrix
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout[-2000:]
    assert len(tests) == LIBRARIES * (LIBRARIES - 1)
    failed = {name for name, (state, _) in tests.items() if state == "failed"}
    assert failed == COLLIDING
    assert all(state == "passed" for name, (state, _) in tests.items() if name not in failed)
    assert f"4 failed, {len(tests) - 4} passed" in run.stdout


def test_a_failing_pair_shows_its_outcome_detail_cause_fixes_repro_and_record(whole_matrix):
    run, tests = whole_matrix
    _, record = tests[f"{KQ_ID} -> {PLUGIN_ID} @ global"]
    assert (record["outcome"], record["signature"], record["op"], record["step"]) == (
        "reregister", "executorch-reregister", "quantized_decomposed::add.out", 1)
    section = run.stdout.split(f"_ {KQ_ID} -> {PLUGIN_ID} @ global _", 1)[1]
    lines = [line for line in section.splitlines()[1:] if not line.startswith("[gw")]  # xdist's
    assert lines[0].startswith("reregister executorch-reregister quantized_decomposed::add.out")
    assert lines[1] == f"detail: {record['detail']}"
    assert lines[2] == "cause: duplicate-registration (observed)"
    assert lines[3] == record["cause"]["text"]
    repro = next(n for n, line in enumerate(lines) if line.startswith("repro:  "))
    ours = lines[:repro]  # the other failing pairs' sections follow
    assert {KQ_ID, PLUGIN_ID} <= {line.split()[1] for line in ours if line.startswith("copy: ")}
    fixes = [line for line in ours if line.startswith("fix")]
    assert len(fixes) == len(record["fixes"]) and fixes[-1].startswith("fix (last resort): ")
    assert lines[repro] == f"repro:  {record['repro']}"
    assert json.loads(lines[repro + 1].removeprefix("record: ")) == record


def test_the_repro_command_of_a_failing_pair_reruns_it(whole_matrix):
    _, tests = whole_matrix
    _, record = tests[f"{PLUGIN_ID} -> {AOT_ID} @ global"]
    rerun = subprocess.run(["sh", "-c", record["repro"].replace(" run ", " run --json ", 1)],
                           capture_output=True, text=True)
    assert rerun.stdout.startswith("{"), rerun.stderr[-2000:]
    again = json.loads(rerun.stdout)
    assert (again["outcome"], again["op"], again["step"]) == (
        record["outcome"], record["op"], record["step"])


def test_findings_the_expectations_cover_are_xfail_and_the_run_passes(project):
    run = pytest_in(project, *target_args("--loadfuzz-flags", "global", "-n", "2",
                                          "--loadfuzz-expect", "executorch.toml",
                                          "--junitxml", "expected.xml"))
    tests = results(project / "expected.xml")
    assert run.returncode == pytest.ExitCode.OK, run.stdout[-2000:]
    assert {name for name, (state, _) in tests.items() if state == "xfailed"} == COLLIDING
    assert sum(state == "passed" for state, _ in tests.values()) == len(tests) - 4
    assert "4 findings: 4 expected, 0 unexpected" in run.stdout


def test_pairs_are_collected_in_one_order_with_ids_first_then_second_at_flags(project):
    args = target_args("--loadfuzz-select", KQ_ID, "--loadfuzz-select", "extra/*",
                       "--collect-only", "-q")
    first, second = pytest_in(project, *args), pytest_in(project, *args)
    ids, again = ([line for line in run.stdout.splitlines() if line.startswith("loadfuzz::")]
                  for run in (first, second))
    assert ids == again == [
        f"loadfuzz::{PLUGIN_ID} -> {KQ_ID} @ global",
        f"loadfuzz::{KQ_ID} -> {PLUGIN_ID} @ global",
        f"loadfuzz::{PLUGIN_ID} -> {KQ_ID} @ local",
        f"loadfuzz::{KQ_ID} -> {PLUGIN_ID} @ local",
    ]


def test_a_pair_with_an_extension_module_is_named_at_python_as_matrix_names_it(project):
    # an extension module is imported under `python` (a `py:` step): the id was
    # `python:a -> python:b`, with no `@ python`, unlike matrix's junit name for the pair
    extension = "extension/pybindings/data_loader.cpython-311-x86_64-linux-gnu.so"
    args = target_args("--loadfuzz-select", KQ_ID, "--loadfuzz-select", extension,
                       "--loadfuzz-flags", "python", "--collect-only", "-q")
    ids = [line for line in pytest_in(project, *args).stdout.splitlines()
           if line.startswith("loadfuzz::")]
    assert ids == [f"loadfuzz::{extension} -> {KQ_ID} @ python",
                   f"loadfuzz::{KQ_ID} -> {extension} @ python"]


def test_local_flags_and_a_selection_run_beside_the_project_own_tests(project, tmp_path):
    for name in ("build", "executorch.toml"):
        os.symlink(project / name, tmp_path / name)
    (tmp_path / "test_own.py").write_text("def test_own():\n    assert True\n")
    run = pytest_in(tmp_path, *target_args("--loadfuzz-select", "lib/libexecutorch.so",
                                           "--loadfuzz-select", KQ_ID, "--loadfuzz-select",
                                           "extra/*", "--loadfuzz-flags", "local",
                                           "--loadfuzz-expect", "executorch.toml", "-rx"))
    assert run.returncode == pytest.ExitCode.OK, run.stdout[-2000:]
    assert "5 passed, 2 xfailed" in run.stdout  # test_own and 4 clean pairs; the 2 collisions
    assert f"XFAIL loadfuzz::{KQ_ID} -> {PLUGIN_ID} @ local - reregister" in run.stdout


def test_a_folder_target_with_a_crashing_library_fails_both_orders_at_its_step(tmp_path):
    (tmp_path / "libs").mkdir()
    for name in ("clean", "segv"):
        shutil.copy(hostile(name), tmp_path / "libs")
    run = pytest_in(tmp_path, "--loadfuzz", "libs", "--loadfuzz-flags", "global", "-rf",
                    "--junitxml", "libs.xml")
    tests = results(tmp_path / "libs.xml")
    assert run.returncode == pytest.ExitCode.TESTS_FAILED
    assert {name: state for name, (state, _) in tests.items()} == {
        "libfx_clean.so -> libfx_segv.so @ global": "failed",
        "libfx_segv.so -> libfx_clean.so @ global": "failed",
    }
    assert ("FAILED loadfuzz::libfx_clean.so -> libfx_segv.so @ global - crash "
            f"{signal.SIGSEGV.name} at step 1 (libfx_segv.so)") in run.stdout


def test_a_missing_python_module_is_skipped_as_a_problem_of_the_environment_as_matrix_files_it(
        tmp_path):
    # the fixture extension imports a module nobody installed: `matrix` files it under
    # `environment` and exits 0; the plugin failed those pairs as unexpected findings
    shutil.copytree(ROOT / "build" / "fixtures" / "environment", tmp_path / "libs")
    run = pytest_in(tmp_path, "--loadfuzz", "libs", "--loadfuzz-flags", "python",
                    "--junitxml", "env.xml")
    tests = results(tmp_path / "env.xml")
    assert run.returncode == pytest.ExitCode.OK, run.stdout[-2000:]
    assert "skipped" in {state for state, _ in tests.values()}
    assert "problems of the environment (skipped)" in run.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--loadfuzz", "no-such-distribution"], "no such file, directory or installed distribution"),
    (["--loadfuzz", "executorch", "--loadfuzz-flags", "global,sideways"], "unknown flags mode"),
    (["--loadfuzz", "executorch", "--loadfuzz-expect", "missing.toml"], "no such expectations"),
    (["--loadfuzz", "executorch", "--loadfuzz-expect", "bad.toml"], "unknown top-level key"),
    (["--loadfuzz", "executorch", "--loadfuzz-add", "missing.so"], "--loadfuzz-add missing.so"),
    (["--loadfuzz", "executorch", "--loadfuzz-select", "nothing/*"], "matches no library"),
    (["--loadfuzz", "executorch", "--loadfuzz-select", KQ_ID], "a pair needs two"),
    # a CI job's `--loadfuzz="$TARGET"` whose variable is unset: not a green run of nothing
    (["--loadfuzz="], "a target is empty"),
    # Path("") is the working folder: "--loadfuzz-add .: a folder, not a library"
    (["--loadfuzz", "executorch", "--loadfuzz-add="], "--loadfuzz-add: an empty path"),
    (["--loadfuzz=executorch", "--loadfuzz-expect="], "--loadfuzz-expect: an empty path"),
])
def test_bad_input_is_a_one_line_usage_error_before_any_worker_starts(tmp_path, args, message):
    (tmp_path / "bad.toml").write_text("[[expectd]]\nfirst = 'a'\n")
    run = pytest_in(tmp_path, *args, "-n", "2")
    assert run.returncode == pytest.ExitCode.USAGE_ERROR
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR: loadfuzz: ") and message in lines[0]
    assert "Traceback" not in run.stdout + run.stderr and "gw0" not in run.stdout


def test_without_the_option_the_plugin_adds_no_test_and_imports_nothing(tmp_path):
    (tmp_path / "test_quiet.py").write_text(
        "import sys\n\n"
        "def test_loadfuzz_is_registered_but_idle(pytestconfig):\n"
        "    assert pytestconfig.pluginmanager.has_plugin('loadfuzz')\n"
        "    ours = ('loadfuzz', 'elftools', 'psutil')\n"
        "    loaded = sorted(m for m in sys.modules if m.split('.')[0] in ours)\n"
        "    assert loaded == ['loadfuzz', 'loadfuzz.pytest_plugin']\n")
    run = pytest_in(tmp_path, "--loadfuzz-flags", "global", "-q")  # a lone option: still idle
    assert run.returncode == pytest.ExitCode.OK, run.stdout
    assert "1 passed" in run.stdout and "loadfuzz" not in run.stdout


def test_a_project_test_runs_one_load_order_with_the_loadfuzz_run_fixture(project, tmp_path):
    os.symlink(project / "build", tmp_path / "build")
    (tmp_path / "test_plugin_loads.py").write_text(
        "ADD = ['build/libquantized_ops_legacy_plugin.so']\n\n"
        "def test_the_plugin_loads_beside_the_runtime(loadfuzz_run):\n"
        "    record = loadfuzz_run('executorch', 'lib/libexecutorch.so',\n"
        "                          'local:extra/libquantized_ops_legacy_plugin.so', add=ADD)\n"
        "    assert record.clean, record.detail\n\n"
        "def test_the_plugin_collides_with_the_quantized_kernels(loadfuzz_run):\n"
        "    record = loadfuzz_run('executorch', 'extra/libquantized_ops_legacy_plugin.so',\n"
        "                          'lib/libexecutorch_kernels_quantized.so', add=ADD)\n"
        "    assert record.clean, record.detail\n")
    run = pytest_in(tmp_path, "-q")
    assert run.returncode == pytest.ExitCode.TESTS_FAILED
    assert "1 failed, 1 passed" in run.stdout
    assert "Re-registering quantized_decomposed::add.out" in run.stdout


def test_run_load_order_takes_ids_of_a_target_or_plain_paths():
    by_id = run_load_order("executorch", KQ_ID, f"local:{PLUGIN_ID}", add=[LEGACY_PLUGIN])
    assert (by_id.outcome, by_id.step, by_id.op) == (
        Outcome.REREGISTER, 1, "quantized_decomposed::add.out")
    assert [(s.lib, s.flags.value) for s in by_id.sequence] == [
        (KQ_ID, "global"), (PLUGIN_ID, "local")]
    by_path = run_load_order(None, LEGACY_PLUGIN, QUANTIZED, flags="local")
    assert (by_path.outcome, by_path.step) == (Outcome.REREGISTER, 1)
    assert run_load_order(None, AOT).clean  # needs libpython: loaded first, as in Python


def test_run_load_order_names_a_target_file_by_its_id_however_it_was_given():
    # by its path as a step, and where the cause names the files its entry points bound to:
    # the ids expectations and matrix records use, not a path or a bare file name
    record = run_load_order("executorch", QUANTIZED, f"global:{LEGACY_PLUGIN}")
    assert (record.outcome, [s.lib for s in record.sequence]) == (
        Outcome.REREGISTER, [KQ_ID, str(LEGACY_PLUGIN)])
    symbols = record.to_json()["cause"]["symbols"]
    named = {name for symbol in symbols for name in [
        *symbol["defined_by"], *(end for binding in symbol["bindings"]
                                 for end in (binding["from"], binding["to"]))]}
    assert "lib/libexecutorch.so" in named and "libexecutorch.so" not in named, symbols


@pytest.mark.parametrize(("steps", "options", "says"), [
    ((), {}, "at least one step"),
    (("lib/no-such-library.so",), {}, "no-such-library"),
    ((KQ_ID,), {"flags": "sideways"}, "unknown flags mode 'sideways'"),
    ((KQ_ID,), {"flags": "global,local"}, "the one mode"),  # matrix's list is not one mode
    ((KQ_ID,), {"timeout": 0}, "timeout"),
    ((KQ_ID,), {"timeout": float("nan")}, "timeout"),
    ((KQ_ID,), {"timeout": float("inf")}, "timeout"),
    # the wrong types say which argument, not a KeyError or "--add /: no such file"
    ((KQ_ID,), {"add": str(LEGACY_PLUGIN)}, "add is a list of library paths"),
    ((KQ_ID,), {"add": [None]}, "add is a list of library paths"),
    ((KQ_ID,), {"add": [""]}, "add: an empty path"),
    ((KQ_ID,), {"flags": None}, "flags is a mode's name"),
    ((KQ_ID,), {"timeout": "10"}, "timeout is a number of seconds"),
    ((KQ_ID,), {"timeout": True}, "timeout is a number of seconds"),
])
def test_run_load_order_rejects_bad_input_with_a_usage_error_that_says_what(steps, options, says):
    with pytest.raises(UsageError, match=re.escape(says)):
        run_load_order("executorch", *steps, **options)


def test_run_load_order_without_a_target_refuses_add_rather_than_ignore_it():
    with pytest.raises(UsageError, match="add names extra libraries of a target"):
        run_load_order(None, QUANTIZED, add=[LEGACY_PLUGIN])
