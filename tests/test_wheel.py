"""loadfuzz installs the way Python tools are installed: a wheel, into a fresh venv without
torch and without this source tree, runs a trial from any folder (the harness is compiled
from the packaged source into the user's cache on first use)."""

import json
import shutil
import subprocess
import sys
import zipfile

import pytest

from support import ROOT, hostile


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    # Built from a copy of the sources: built in place, setuptools would reuse the checkout's
    # build/lib, where a module since removed is still found and would be packed.
    source = tmp_path_factory.mktemp("source") / "loadfuzz"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "results", "__pycache__", "*.egg-info", ".hypothesis"))
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-q", "-w", str(dist), str(source)],
                   check=True, capture_output=True, cwd=dist)
    [built] = dist.glob("loadfuzz-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """A fresh venv (no system site-packages) with only the wheel and its dependencies."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                    str(wheel)], check=True, capture_output=True)
    return venv


def test_the_wheel_carries_the_harness_source_and_the_report_assets_but_not_the_tools(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("loadfuzz/run/harness.c", "loadfuzz/report/matrix.css",
                   "loadfuzz/report/matrix.js", "loadfuzz/signatures.toml"):
        assert needed in names
    assert not [name for name in names if name.startswith(("tools/", "tests/"))]
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "loadfuzz").rglob("*.py")}
    assert {name for name in names if name.endswith(".py")} == modules  # no more, no fewer
    with zipfile.ZipFile(wheel) as archive:
        shipped = archive.read("loadfuzz/run/harness.c")
    assert shipped == (ROOT / "harness_c" / "harness.c").read_bytes()
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [line for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert not [line for line in requires if "torch" in line], requires


def test_an_installed_wheel_without_torch_runs_a_trial_from_any_folder(installed, tmp_path):
    python = installed / "bin" / "python"
    has_torch = subprocess.run([str(python), "-c", "import importlib.util, sys; "
                                "sys.exit(importlib.util.find_spec('torch') is not None)"])
    assert has_torch.returncode == 0, "the fresh venv must not have torch"
    elsewhere = tmp_path / "somewhere else"
    elsewhere.mkdir()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path / "home"),
           "XDG_CACHE_HOME": str(tmp_path / "empty cache")}
    done = subprocess.run([str(installed / "bin" / "loadfuzz"), "run", "--json",
                           str(hostile("clean")), f"local:{hostile('clean')}"],
                          capture_output=True, text=True, cwd=elsewhere, env=env)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["outcome"] == "clean" and record["step"] is None
    assert list((tmp_path / "empty cache" / "loadfuzz").glob("harness-*")), "built on first use"
    crash = subprocess.run([str(installed / "bin" / "loadfuzz"), "run", str(hostile("segv"))],
                           capture_output=True, text=True, cwd=elsewhere, env=env)
    assert crash.returncode == 1 and "outcome: crash" in crash.stdout
