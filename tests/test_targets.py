"""One campaign over several targets or a whole environment: ids say whose library it is,
libraries of one target that need another's resolve as installed, and the collisions found
across packages are those a plain one-process-per-pair harness sees."""

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from loadfuzz import hostenv
from support import LOADFUZZ, ROOT, loadfuzz

OLD_RELEASE = ROOT / "build" / "wheels" / "executorch-1.4.1-cp311-cp311-manylinux_2_28_x86_64.whl"
ALPHA, BETA = "loadfuzz-fixture-alpha-1.0", "loadfuzz-fixture-beta-1.0"
PLAIN_HARNESS = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {  /* plain MODE LIBPYTHON A B: as a Python process has it,
                                      libpython first, then A and B with RTLD_NOW | MODE */
    int mode = RTLD_NOW | (strcmp(argv[1], "global") ? RTLD_LOCAL : RTLD_GLOBAL);
    if (!dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL)) return 99;
    for (int i = 3; i < argc; i++)
        if (!dlopen(argv[i], mode)) { fprintf(stderr, "%s\n", dlerror()); return 100 + i - 3; }
    return 0;
}
"""


def findings_of(summary):
    return sorted((tuple(s["lib"] for s in r["sequence"]), r["sequence"][0]["flags"], r["outcome"],
                   r["op"]) for r in summary["findings"])


def test_scan_of_the_environment_finds_every_distribution_that_ships_libraries():
    done = loadfuzz("scan", "--env", "--json")
    assert done.returncode == 0, done.stderr
    ids = [lib["id"] for lib in json.loads(done.stdout)["libraries"]]
    for prefix in ("torch-2.13.0", "executorch-1.5.1/", f"{ALPHA}/", f"{BETA}/"):
        assert any(lib.startswith(prefix) for lib in ids), prefix
    assert f"{ALPHA}/libfxalpha_ops.so" in ids


def test_the_environment_is_what_a_trial_imports_from_not_the_working_folder(tmp_path):
    """A stray distribution in the folder loadfuzz runs from (or on PYTHONPATH) is on neither
    a trial's sys.path nor in --env, under `python -m loadfuzz` as under `loadfuzz`."""
    (tmp_path / "strayfx").mkdir()
    shutil.copy(ROOT / "build" / "fixtures" / "corpus" / "libcz_solo.so",
                tmp_path / "strayfx" / "libstray.so")
    meta = tmp_path / "strayfx-1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: strayfx\nVersion: 1.0\n")
    (meta / "RECORD").write_text("strayfx/libstray.so,,\nstrayfx-1.0.dist-info/METADATA,,\n")
    for how, env in (("python -m", None), ("PYTHONPATH", {**os.environ, "PYTHONPATH": str(tmp_path)})):
        command = [sys.executable, "-m", "loadfuzz"] if how == "python -m" else [str(LOADFUZZ)]
        done = subprocess.run([*command, "scan", "--env", "--json"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        ids = [lib["id"] for lib in json.loads(done.stdout)["libraries"]]
        assert ids and not any(lib.startswith("strayfx") for lib in ids), how


def test_two_packages_collide_in_both_orders_under_both_flags_and_nothing_else(tmp_path):
    done = loadfuzz("matrix", "loadfuzz-fixture-alpha", "loadfuzz-fixture-beta",
                    "--out", tmp_path / "out", "--json")
    assert done.returncode == 1, done.stderr
    summary = json.loads(done.stdout)
    assert summary["targets"] == [ALPHA, BETA]
    a, b = f"{ALPHA}/libfxalpha_ops.so", f"{BETA}/libfxbeta_ops.so"
    assert findings_of(summary) == sorted(
        ((first, second), mode, "reregister", "fxdist::shared_op.out")
        for first, second in ((a, b), (b, a)) for mode in ("global", "local"))
    page = (tmp_path / "out" / "matrix.html").read_text()
    assert "target-start" in page  # the targets' blocks are framed
    assert (tmp_path / "out").parent.name != "results"  # --out was honoured


def test_the_environment_campaign_finds_the_cross_package_collision_and_nothing_else(tmp_path):
    done = loadfuzz("matrix", "--env", "--exclude", "torch-*", "--exclude", "executorch-*",
                    "--out", tmp_path / "out", "--json")
    assert done.returncode == 1, done.stderr
    summary = json.loads(done.stdout)
    assert ALPHA in summary["targets"] and BETA in summary["targets"]
    assert {lib.split("/")[0] for r in summary["findings"] for lib in
            (s["lib"] for s in r["sequence"])} == {ALPHA, BETA}
    assert len(summary["findings"]) == 4


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plain")
    (folder / "plain.c").write_text(PLAIN_HARNESS)
    subprocess.run(["gcc", "-o", str(folder / "plain"), str(folder / "plain.c"), "-ldl"],
                   check=True)
    return folder / "plain"


def plain_verdict(plain, mode, first, second):
    """What a plain process that dlopens the pair says: clean, a signal, or a failed dlopen.
    It finds torch's libraries as a process of this environment does."""
    env = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(hostenv.torch_lib_dir())}
    done = subprocess.run([str(plain), mode, str(hostenv.libpython_path()), str(first),
                           str(second)], capture_output=True, env=env, timeout=60)
    if done.returncode < 0:
        return f"signal {-done.returncode}"
    return {0: "clean", 100: "load-error at 0", 101: "load-error at 1"}.get(
        done.returncode, f"exit {done.returncode}")


def loadfuzz_verdict(record):
    if record["outcome"] == "clean":
        return "clean"
    if record["signal"] is not None:
        return f"signal {record['signal']}"
    if record["outcome"] == "load-error":
        return f"load-error at {record['step']}"
    return f"exit {record['exit_code']}"


def test_two_releases_of_one_runtime_agree_with_a_plain_harness_on_every_cross_pair(
        tmp_path, plain):
    assert OLD_RELEASE.exists(), "make fixtures downloads the earlier release"
    new, old = "executorch-1.5.1", "executorch-1.4.1"
    done = loadfuzz("matrix", "executorch", OLD_RELEASE, "--out", tmp_path / "out", "--json")
    assert done.returncode in (0, 1), done.stderr
    summary = json.loads(done.stdout)
    assert summary["targets"] == [new, old]
    scan = json.loads(loadfuzz("scan", "executorch", OLD_RELEASE, "--json").stdout)
    paths = {lib["id"]: lib["path"] for lib in scan["libraries"]}
    records = [json.loads(line) for line in (tmp_path / "out" / "trials.jsonl").read_text()
               .splitlines()]
    cross = [r for r in records if len({s["lib"].split("/")[0] for s in r["sequence"]}) == 2]
    releases = [lib.split("/")[0] for lib in summary["libraries"]]
    assert len(cross) == releases.count(new) * releases.count(old) * 2 * 2  # both orders, flags

    def compare(record):
        first, second = (paths[s["lib"]] for s in record["sequence"])
        mode = record["sequence"][0]["flags"]
        mine, theirs = loadfuzz_verdict(record), plain_verdict(plain, mode, first, second)
        return None if mine == theirs else (mode, first, second, mine, theirs)

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # one plain process per pair
        differ = [found for found in pool.map(compare, cross) if found]
    assert differ == []


def test_the_torch_matrix_through_stand_ins_agrees_with_a_plain_harness_on_every_pair(
        tmp_path, plain):
    done = loadfuzz("matrix", "torch", "--flags", "global", "--out", tmp_path / "out", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert any(path.endswith("/libtorch_cpu.so") for path in summary["preload"])  # stood in
    scan = json.loads(loadfuzz("scan", "torch", "--json").stdout)
    paths = {lib["id"]: lib["path"] for lib in scan["libraries"]}
    records = [json.loads(line) for line in (tmp_path / "out" / "trials.jsonl").read_text()
               .splitlines()]
    assert len(records) == 12 * 11

    def compare(record):
        first, second = (paths[s["lib"]] for s in record["sequence"])
        mine, theirs = loadfuzz_verdict(record), plain_verdict(plain, "global", first, second)
        return None if mine == theirs else (first, second, mine, theirs)

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # one plain process per pair
        differ = [found for found in pool.map(compare, records) if found]
    assert differ == []


def test_with_torch_under_test_no_tier_preloads_any_of_its_libraries():
    """Tiers preload only what is not under test; a library under test is preloaded only as
    a stand-in (test_standins.py)."""
    from loadfuzz import inventory
    from loadfuzz.run.tiers import Tiers

    inv = inventory.load_targets(["torch", "executorch"])
    under_test = {lib.path.resolve() for lib in inv.libraries}
    preloaded = {step.path.resolve() for preload in Tiers.of(inv.libraries).preloads
                 for step in preload}
    assert any(lib.id.startswith("torch-") for lib in inv.libraries)
    assert preloaded & under_test == set()


@pytest.mark.parametrize("where", ["before the options", "after an option"])
def test_two_folders_of_one_name_are_two_targets_and_every_library_counts(tmp_path, where):
    for side, name in (("a", "one"), ("b", "two")):
        folder = tmp_path / side / "libs"
        folder.mkdir(parents=True)
        (folder / f"{name}.c").write_text(f"int {name}(void) {{ return 1; }}\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(folder / f"lib{name}.so"),
                        str(folder / f"{name}.c")], check=True)
    first, second = tmp_path / "a" / "libs", tmp_path / "b" / "libs"
    words = ([first, second, "--json"] if where == "before the options"
             else [first, "--json", second])  # a target after an option is one all the same
    done = loadfuzz("scan", *words)
    assert done.returncode == 0, done.stderr
    scan = json.loads(done.stdout)
    ids = sorted(lib["id"] for lib in scan["libraries"])
    assert ids == ["libs-unversioned-2/libtwo.so", "libs-unversioned/libone.so"]
    assert scan["targets"] == ["libs-unversioned", "libs-unversioned-2"]  # the ids' prefixes


def test_a_target_named_twice_is_one_target_with_its_own_ids_and_version():
    """The ids an expectations file names (lib/x.so) hold however often the one target is
    named: a distribution, or a folder."""
    from loadfuzz import inventory

    for name in ("executorch", str(ROOT / "build" / "fixtures" / "corpus")):
        once, twice = (inventory.load_targets([name] * n) for n in (1, 2))
        assert (twice.version, twice.labels) == (once.version, ())
        assert [lib.id for lib in twice.libraries] == [lib.id for lib in once.libraries]
    # by its name and by its folder: each file once, under the first target that has it
    once = inventory.load_targets(["executorch"])
    both = inventory.load_targets(["executorch", str(once.root)])
    assert [lib.id for lib in both.libraries] == [lib.id for lib in once.libraries]
    three = inventory.load_targets(["executorch", "torch", str(once.root)])
    paths = [lib.path.resolve() for lib in three.libraries]
    assert len(paths) == len(set(paths)) and three.labels == ("executorch-1.5.1", "torch-2.13.0+cpu")


def test_a_library_whose_name_holds_a_newline_is_found_and_loaded(tmp_path):
    # any byte but "/" may be in a file name; such a library was silently left out
    folder = tmp_path / "libs"
    folder.mkdir()
    shutil.copyfile(ROOT / "build" / "fixtures" / "corpus" / "libcz_quiet_1.so",
                    folder / "lib\nnewline.so")
    shutil.copyfile(ROOT / "build" / "fixtures" / "corpus" / "libcz_pair_a.so",
                    folder / "libplain.so")
    done = loadfuzz("matrix", folder, "--flags", "global", "--out", tmp_path / "out", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert sorted(summary["libraries"]) == ["lib\nnewline.so", "libplain.so"]
    assert summary["trials"] == 2 and summary["findings"] == []
    table = loadfuzz("scan", folder).stdout.splitlines()[2:5]  # one row each, aligned
    assert [row.index("other") for row in table[1:]] == [table[0].index("role")] * 2, table
    assert table[1].startswith("lib\\nnewline.so ")


def fake_distribution(site, name, metadata: bytes, library=None):
    """An installed distribution in `site`: its METADATA as given, and a RECORD."""
    meta = site / f"{name}-1.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_bytes(metadata)
    record = f"{name}-1.0.dist-info/METADATA,,\n"
    if library is not None:
        (site / name).mkdir()
        shutil.copy(library, site / name / f"lib{name}.so")
        record += f"{name}/lib{name}.so,,\n"
    (meta / "RECORD").write_text(record)


SOLO = ROOT / "build" / "fixtures" / "corpus" / "libcz_solo.so"


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site-packages folder that is the whole environment loadfuzz sees."""
    from loadfuzz import hostenv

    folder = tmp_path / "site-packages"
    monkeypatch.setattr(hostenv, "python_paths", lambda: [str(folder)])
    return folder


def test_a_distribution_whose_metadata_is_not_utf8_is_skipped_by_env_and_bad_input_by_name(site):
    # importlib's UnicodeDecodeError made every --env command exit 3 (could not finish)
    from loadfuzz import inventory, targets
    from loadfuzz.model import UsageError

    fake_distribution(site, "fxgood", b"Metadata-Version: 2.1\nName: fxgood\nVersion: 1.0\n",
                      SOLO)
    fake_distribution(site, "fxold", b"Metadata-Version: 2.1\nName: fxold\nVersion: 1.0\n"
                      b"Summary: caf\xe9\n", SOLO)
    inv = inventory.load_targets([], env=True)
    assert [lib.id for lib in inv.libraries] == ["fxgood-1.0/libfxgood.so"]
    [warning] = inv.warnings
    assert warning.startswith(f"skipped an installed distribution: its metadata in "
                              f"{site / 'fxold-1.0.dist-info'} is not UTF-8 (")
    with pytest.raises(UsageError, match=r"^the installed distribution fxold: its metadata"):
        targets.locate("fxold")


def test_a_library_a_distribution_lists_but_lost_is_a_warning_not_left_out_silently(site):
    from loadfuzz import inventory

    fake_distribution(site, "fxgone", b"Metadata-Version: 2.1\nName: fxgone\nVersion: 1.0\n",
                      SOLO)
    with (site / "fxgone-1.0.dist-info" / "RECORD").open("a") as record:
        record.write("fxgone/libsecond.so,,\n")  # deleted after install
    for inv in (inventory.load_target("fxgone"), inventory.load_targets([], env=True)):
        assert [lib.id.rsplit("/", 1)[-1] for lib in inv.libraries] == ["libfxgone.so"]
        assert inv.warnings == ("skipped fxgone's fxgone/libsecond.so: its RECORD lists it, "
                                "but it is not on disk",)
