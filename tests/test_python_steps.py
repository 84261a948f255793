"""Python steps load as Python does: `py:` imports an extension under its qualified module
name (parent packages first), `import:NAME` imports a module by name, and the `python` flags
mode loads each library the way Python code would. Checked against real CPython running the
same imports, pair by pair, over the wheel's extension modules."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from loadfuzz.run.pycode import module_name
from support import ET, FIXTURES, LEGACY_PLUGIN, SITE, loadfuzz

AOT = ET / "kernels" / "quantized" / "libquantized_ops_aot_lib.so"


def extension_modules():
    return sorted(ET.rglob("*.cpython-311-x86_64-linux-gnu.so"))


def qualified(path: Path) -> str:
    return ".".join(path.relative_to(SITE).with_suffix("").with_suffix("").parts)


def cpython(source: str) -> tuple[str, str]:
    """What real CPython does with `source`: ("clean", ""), ("signal", number) or ("raised",
    what it printed: the traceback, with the exception chain)."""
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                          timeout=120)
    if done.returncode == 0:
        return "clean", ""
    if done.returncode < 0:
        return "signal", str(-done.returncode)
    return "raised", done.stderr


def agree(record: dict, real: tuple[str, str]) -> bool:
    """Clean, killed by the same signal, or an exception whose line loadfuzz reports (the
    exception, or the line of it a signature named) is the one CPython printed."""
    if record["outcome"] == "clean" or record["signal"] is not None:
        mine = ("clean", "") if record["outcome"] == "clean" else ("signal", str(record["signal"]))
        return mine == real
    return real[0] == "raised" and record["outcome"] in ("load-error", "reregister") and (
        record["detail"] in real[1])


def test_an_extension_is_named_as_import_finds_it_from_sys_path():
    data_loader = ET / "extension" / "pybindings" / "data_loader.cpython-311-x86_64-linux-gnu.so"
    assert module_name(data_loader, [str(SITE)]) == (
        "executorch.extension.pybindings.data_loader", None)
    # from a deeper entry too, the longest dotted name wins: its packages are imported first
    assert module_name(data_loader, [str(ET / "extension"), str(SITE)])[0] == (
        "executorch.extension.pybindings.data_loader")
    outside = FIXTURES / "signatures" / "fxdup.cpython-311-x86_64-linux-gnu.so"
    assert module_name(outside, [str(SITE)]) == ("fxdup", outside.parent)


def test_an_extension_reached_through_a_symbolic_link_or_dots_keeps_its_qualified_name(tmp_path):
    """A venv's lib64 is a link to lib: the import system finds the file under its package
    whichever way its path is written, so its packages are imported first either way."""
    site = tmp_path / "lib" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (tmp_path / "lib64").symlink_to("lib")
    name = "ext.cpython-311-x86_64-linux-gnu.so"
    for written in (tmp_path / "lib64" / "site-packages" / "pkg" / name,
                    site / "pkg" / ".." / "pkg" / name):
        assert module_name(written, [str(site)]) == ("pkg.ext", None), written
    # and an entry written through the link finds the file written without it
    assert module_name(site / "pkg" / name, [str(tmp_path / "lib64" / "site-packages")]) == (
        "pkg.ext", None)


def test_a_py_step_through_a_linked_folder_runs_the_packages_that_cpython_runs(tmp_path):
    """_training_lib's package imports modules this environment lacks: CPython's import fails,
    and so must the step, however the path to the file is written."""
    (tmp_path / "site").symlink_to(SITE)
    module = Path("executorch/extension/training/pybindings/_training_lib"
                  ".cpython-311-x86_64-linux-gnu.so")
    real = cpython(f"import {qualified(SITE / module)}")
    assert real[0] == "raised"
    for path in (SITE / module, tmp_path / "site" / module):
        record = json.loads(loadfuzz("run", "--json", f"py:{path}").stdout)
        assert agree(record, real), (path, record["outcome"], record["detail"])


@pytest.fixture(scope="module")
def python_matrix(tmp_path_factory):
    out = tmp_path_factory.mktemp("python-matrix")
    done = loadfuzz("matrix", "executorch", "--select", "*.cpython-311-x86_64-linux-gnu.so",
                    "--flags", "python", "--out", out, "--json")
    assert done.returncode in (0, 1), done.stderr
    return [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]


def test_python_mode_imports_every_pair_of_extensions_as_cpython_does(python_matrix):
    by_id = {path.relative_to(ET).as_posix(): path for path in extension_modules()}
    assert len(python_matrix) == len(by_id) * (len(by_id) - 1)
    pairs = [[by_id[step["lib"]] for step in record["sequence"]] for record in python_matrix]
    assert {step["flags"] for r in python_matrix for step in r["sequence"]} == {"python"}
    assert {step["kind"] for r in python_matrix for step in r["sequence"]} == {"import"}
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # one CPython process per pair
        reals = list(pool.map(lambda pair: cpython(
            f"import {qualified(pair[0])}; import {qualified(pair[1])}"), pairs))
    differ = [(first.name, second.name, record["outcome"], record["detail"], real)
              for record, (first, second), real in zip(python_matrix, pairs, reals, strict=True)
              if not agree(record, real)]
    assert differ == []


def test_the_pair_that_cried_wolf_imports_cleanly_under_its_qualified_names():
    """data_loader then _C: imported by file under their bare names, _C bound data_loader's
    pybind11 types a second time; imported as CPython does, it finds them in sys.modules."""
    pybindings = ET / "extension" / "pybindings"
    steps = [f"py:{pybindings / name}" for name in ("data_loader.cpython-311-x86_64-linux-gnu.so",
                                                     "_C.cpython-311-x86_64-linux-gnu.so")]
    for order in (steps, steps[::-1]):
        done = loadfuzz("run", "--json", *order)
        assert json.loads(done.stdout)["outcome"] == "clean", done.stdout


@pytest.mark.parametrize("reverse", [False, True])
def test_export_plugins_load_through_torch_ops_load_library_and_collide_as_in_cpython(reverse):
    pair = [AOT, LEGACY_PLUGIN][::-1 if reverse else 1]
    done = loadfuzz("run", "--json", *(f"python:{path}" for path in pair))
    record = json.loads(done.stdout)
    real = cpython(f"import torch; torch.ops.load_library({str(pair[0])!r}); "
                   f"torch.ops.load_library({str(pair[1])!r})")
    assert real == ("signal", "6") and agree(record, real)
    assert (record["outcome"], record["signature"], record["step"]) == (
        "reregister", "executorch-reregister", 1)


def test_a_python_step_of_an_extension_module_imports_it_as_python_code_would():
    """`python:` loads a library as Python code does: an extension module by its import (as
    `matrix --flags python` does), not by ctypes, which would never run its PyInit."""
    module = FIXTURES / "signatures" / "fxdup.cpython-311-x86_64-linux-gnu.so"  # binds FxType twice
    done = loadfuzz("run", "--json", f"python:{module}")
    record = json.loads(done.stdout)
    real = cpython(f"import sys; sys.path.insert(0, {str(module.parent)!r}); import fxdup")
    assert real[0] == "raised" and agree(record, real), (record, real)
    assert record["sequence"][0]["kind"] == "import"
    assert (record["outcome"], record["signature"], record["op"]) == (
        "reregister", "pybind11-duplicate-type", "FxType")
    # its repro command reruns that very trial: the same steps, flags and all
    again = json.loads(subprocess.run(record["repro"] + " --json", shell=True, capture_output=True,
                                      text=True, timeout=120).stdout)
    assert again["sequence"] == record["sequence"] and again["outcome"] == record["outcome"]


def test_import_by_name_records_the_exception_and_a_missing_module_is_its_own_signature():
    done = loadfuzz("run", "--json", "import:json", "import:loadfuzz_no_such_module")
    record = json.loads(done.stdout)
    assert done.returncode == 1
    assert record["sequence"][1] == {"kind": "module", "lib": "loadfuzz_no_such_module",
                                     "flags": "python"}
    assert (record["outcome"], record["step"], record["signature"], record["op"]) == (
        "load-error", 1, "python-missing-module", "loadfuzz_no_such_module")
    assert record["detail"] == "ModuleNotFoundError: No module named 'loadfuzz_no_such_module'"
    assert "import:loadfuzz_no_such_module" in record["repro"]


def test_a_missing_python_dependency_is_an_environment_problem_not_an_unexpected_finding(tmp_path):
    done = loadfuzz("matrix", FIXTURES / "environment", "--flags", "python", "--out", tmp_path,
                    "--json")
    summary = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr
    assert summary["unexpected"] == [] and len(summary["environment"]) == 2
    assert {r["op"] for r in summary["environment"]} == {
        "loadfuzz_fixture_dependency_nobody_installed"}
    report = (tmp_path / "report.md").read_text()
    assert "## Environment problems (2)" in report
    # the verdict says so too (it counted them as expected, which no entry had vouched for)
    assert ("**Nothing unexpected: 2 findings, 0 of them expected, 2 environment problems "
            "(never unexpected).**") in report
