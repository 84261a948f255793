"""`scan` reads a target's ELF files (pyelftools only) and says what each library is and does."""

import json
import os
import shutil
import struct
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from loadfuzz import inventory
from loadfuzz.model import Role, UsageError
from support import ET, FIXTURES, LEGACY_PLUGIN, QUANTIZED, executorch_ids, loadfuzz

EXPECTED_ROLES = {
    "lib/": Role.RUNTIME,
    ".cpython-311-x86_64-linux-gnu.so": Role.PYTHON_EXTENSION,
    "kernels/quantized/libquantized_ops_aot_lib.so": Role.EXPORT_PLUGIN,
    "extension/llm/custom_ops/libcustom_ops_aot_lib.so": Role.EXPORT_PLUGIN,
}


@pytest.fixture(scope="module")
def et():
    return inventory.load_target("executorch")


def test_every_library_the_installed_wheel_ships_is_found_with_its_role(et):
    assert [lib.id for lib in et.libraries] == executorch_ids()
    for lib in et.libraries:
        [role] = {role for part, role in EXPECTED_ROLES.items()
                  if lib.id.startswith(part) or lib.id.endswith(part) or lib.id == part}
        assert lib.role is role, lib.id


def test_the_run_time_quantized_kernels_register_all_21_quantized_decomposed_operators(et):
    lib = et.get("lib/libexecutorch_kernels_quantized.so")
    assert len(lib.registers) == 21
    assert all(op.startswith("quantized_decomposed::") for op in lib.registers)
    assert lib.registrations[0][1][0] == "quantized_decomposed::add.out"  # table order
    assert lib.registry == "executorch"


def test_the_python_extension_does_not_depend_on_the_run_time_quantized_kernels(et):
    ext = et.get("extension/pybindings/_C.cpython-311-x86_64-linux-gnu.so")
    assert ext.needs_python
    assert "lib/libexecutorch_kernels_quantized.so" not in ext.closure
    assert ext.closure  # it does reach other libraries of the wheel


def test_libexecutorch_owns_the_registry_and_is_the_only_owner(et):
    assert [lib.id for lib in et.libraries if lib.registry_owner] == ["lib/libexecutorch.so"]


def test_the_export_plugin_reaches_the_run_time_kernels_through_its_dependencies(et):
    aot = et.get("kernels/quantized/libquantized_ops_aot_lib.so")
    assert "lib/libexecutorch_kernels_quantized.so" in aot.closure
    assert aot.registry == "torch"
    assert any(path.name.startswith("libtorch") for path in aot.external)


def test_an_added_library_gets_an_extra_id_and_its_operators_are_read(tmp_path):
    inv = inventory.load_target("executorch", [LEGACY_PLUGIN])
    plugin = inv.get("extra/libquantized_ops_legacy_plugin.so")
    assert set(plugin.registers) == set(inv.get("lib/libexecutorch_kernels_quantized.so").registers)
    assert "lib/libexecutorch.so" in plugin.closure


def test_scan_json_has_the_contract_shape():
    done = loadfuzz("scan", "executorch", "--add", LEGACY_PLUGIN, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["target"] == "executorch"
    keys = {"id", "role", "soname", "needed", "runpath", "needs_python", "registry_owner",
            "registers", "closure"}
    assert all(keys <= set(lib) for lib in data["libraries"])
    assert len(data["predicted"]) == 8
    assert all(set(p) == {"first", "second", "flags", "outcome", "op", "why", "confidence",
                          "evidence"}
               for p in data["predicted"])


def test_scan_prints_a_table_and_the_predicted_collisions():
    done = loadfuzz("scan", "executorch", "--add", LEGACY_PLUGIN)
    assert done.returncode == 0, done.stderr
    assert "lib/libexecutorch.so" in done.stdout and "owner" in done.stdout
    assert "predicted collisions: 8" in done.stdout


def demo_wheel(folder: Path) -> Path:
    """A wheel of two ExecuTorch libraries, `demo/lib/...`."""
    wheel = folder / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(QUANTIZED, "demo/lib/libexecutorch_kernels_quantized.so")
        archive.write(ET / "lib" / "libexecutorch.so", "demo/lib/libexecutorch.so")
        archive.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\n")
    return wheel


def test_a_wheel_file_is_unpacked_into_a_cache_keyed_by_its_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    inv = inventory.load_target(str(demo_wheel(tmp_path)))
    assert [lib.id for lib in inv.libraries] == ["lib/libexecutorch.so",
                                                 "lib/libexecutorch_kernels_quantized.so"]
    assert (inv.name, inv.version) == ("demo", "1.0")
    assert inv.root.is_relative_to(tmp_path / "cache" / "loadfuzz" / "wheels")



def remove_library(tree: Path) -> None:
    (tree / "demo" / "lib" / "libexecutorch.so").unlink()


def truncate_library(tree: Path) -> None:
    with open(tree / "demo" / "lib" / "libexecutorch.so", "r+b") as file:
        file.truncate(1000)


def rewrite_keeping_size_and_mtime(tree: Path) -> None:
    library = tree / "demo" / "lib" / "libexecutorch.so"
    was = library.stat()
    library.write_bytes(b"\0" * was.st_size)
    os.utime(library, ns=(was.st_atime_ns, was.st_mtime_ns))


def add_library(tree: Path) -> None:
    shutil.copyfile(LEGACY_PLUGIN, tree / "demo" / "lib" / "libextra.so")


def replace_by_a_file(tree: Path) -> None:
    shutil.rmtree(tree)
    tree.write_text("not a folder\n")


@pytest.mark.parametrize("damage", [remove_library, truncate_library,
                                    rewrite_keeping_size_and_mtime, add_library,
                                    replace_by_a_file])
def test_an_unpacked_wheel_damaged_in_the_cache_is_unpacked_again(tmp_path, monkeypatch, damage):
    """A cache changed by hand must not change what a wheel holds: a library gone from it was a
    pair less in the matrix, and a file in its place made every command exit 3."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    wheel = demo_wheel(tmp_path)
    first = inventory.load_target(str(wheel))
    [tree] = (tmp_path / "cache" / "loadfuzz" / "wheels").iterdir()
    time.sleep(0.01)  # (a change is told by its time: past the moment the tree was sealed)
    damage(tree)
    again = inventory.load_target(str(wheel))
    assert [lib.id for lib in again.libraries] == [lib.id for lib in first.libraries]
    assert (again.root / "lib" / "libexecutorch.so").read_bytes() == \
        (ET / "lib" / "libexecutorch.so").read_bytes()
    assert [p.name for p in tree.parent.iterdir()] == [tree.name]  # nothing else left behind


def test_a_wheel_library_under_data_platlib_is_unpacked_where_pip_installs_it(tmp_path, monkeypatch):
    """`<dist>.data/platlib/x` is installed as `x` beside the wheel's packages: there the
    kernels' RUNPATH ($ORIGIN) finds the runtime, as after `pip install`."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    wheel = tmp_path / "demo-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(QUANTIZED, "demo-1.0.data/platlib/demo/lib/libexecutorch_kernels_quantized.so")
        archive.write(ET / "lib" / "libexecutorch.so", "demo/lib/libexecutorch.so")
        archive.write(ET / "lib" / "libexecutorch_threadpool.so",
                      "demo-1.0.data/purelib/demo/lib/libexecutorch_threadpool.so")
        archive.writestr("demo-1.0.data/platlib/", b"")
        archive.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\n")
    inv = inventory.load_target(str(wheel))
    assert [lib.id for lib in inv.libraries] == ["lib/libexecutorch.so",
                                                 "lib/libexecutorch_kernels_quantized.so",
                                                 "lib/libexecutorch_threadpool.so"]
    kernels = next(lib for lib in json.loads(loadfuzz("scan", wheel, "--json").stdout)["libraries"]
                   if lib["id"] == "lib/libexecutorch_kernels_quantized.so")
    assert kernels["missing"] == [] and "lib/libexecutorch.so" in kernels["closure"]

# --- bad input: one clear line, exit 2 -------------------------------------------------


def elf32(path):
    """A minimal 32-bit x86 ELF shared-object header: valid, of the wrong class here."""
    ident = b"\x7fELF" + bytes([1, 1, 1]) + bytes(9)
    header = struct.pack("<HHIIIIIHHHHHH", 3, 3, 1, 0, 0, 0, 0, 52, 0, 0, 40, 0, 0)
    path.write_bytes(ident + header)
    return path


def other_machine(path):
    data = bytearray(QUANTIZED.read_bytes())
    data[18:20] = struct.pack("<H", 183)  # EM_AARCH64
    path.write_bytes(bytes(data))
    return path


def text_file(path):
    path.write_text("not a library\n")
    return path


def truncated(path):
    path.write_bytes(QUANTIZED.read_bytes()[:4096])
    return path


def pie_executable(path):
    """A program built -pie and named .so: ET_DYN like a library, but ld.so will not dlopen
    it (it was listed as a library, and every trial of it was a load-error)."""
    source = path.with_suffix(".c")
    source.write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-pie", "-fPIE", "-o", str(path), str(source)], check=True)
    source.unlink()
    return path


BAD_LIBRARIES = {
    "text named .so": (text_file, "not an ELF file"),
    "pie executable": (pie_executable, "a position-independent executable"),
    "truncated": (truncated, "truncated"),
    "32-bit": (elf32, "32-bit"),
    "aarch64": (other_machine, "AARCH64"),
}


@pytest.mark.parametrize("kind", BAD_LIBRARIES)
def test_a_bad_library_is_refused_with_one_line_naming_the_problem(tmp_path, kind):
    make, words = BAD_LIBRARIES[kind]
    bad = make(tmp_path / "libbad.so")
    done = loadfuzz("scan", bad, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["libbad.so"]


def test_a_broken_file_inside_a_folder_is_a_warning_that_names_it(tmp_path):
    shutil.copy(QUANTIZED, tmp_path / "libgood.so")
    (tmp_path / "libbroken.so").write_bytes(QUANTIZED.read_bytes()[:2000])
    inv = inventory.load_target(str(tmp_path))
    assert [lib.id for lib in inv.libraries] == ["libgood.so"]
    assert len(inv.warnings) == 1 and "libbroken.so" in inv.warnings[0]
    done = loadfuzz("scan", tmp_path)
    assert done.returncode == 0 and "warning: skipped libbroken.so" in done.stdout
    # a campaign says it too, on stderr: a library left out of a release check is news
    campaign = tmp_path / "campaign"  # two libraries that load anywhere (a pair to run)
    campaign.mkdir()
    for name in ("libcz_solo.so", "libcz_quiet_1.so"):
        shutil.copy(FIXTURES / "corpus" / name, campaign)
    shutil.copy(tmp_path / "libbroken.so", campaign)
    done = loadfuzz("matrix", campaign, "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("loadfuzz: warning: skipped libbroken.so"), done.stderr


def test_a_folder_without_any_library_is_bad_input(tmp_path):
    (tmp_path / "README").write_text("nothing here")
    with pytest.raises(UsageError, match="no ELF shared library"):
        inventory.load_target(str(tmp_path))


def test_a_missing_target_is_bad_input(tmp_path):
    done = loadfuzz("scan", tmp_path / "nope.whl")
    assert done.returncode == 2 and "no such file" in done.stderr


def test_a_corrupt_wheel_is_bad_input(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    wheel = tmp_path / "bad-1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK\x03\x04 this is not a zip")
    with pytest.raises(UsageError, match="corrupt wheel"):
        inventory.load_target(str(wheel))


@pytest.mark.parametrize(("entry", "why"), [
    ("plain/libplain.so", "not a wheel"),  # a zip with no .dist-info folder
    ("evil/../../escaped.so", "unsafe entry"),  # an entry that climbs out of the folder
])
def test_a_refused_wheel_writes_nothing_outside_and_leaves_nothing_in_the_cache(
        tmp_path, monkeypatch, entry, why):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(entry, b"\x7fELF")
    with pytest.raises(UsageError, match=why):
        inventory.load_target(str(wheel))
    assert not (tmp_path / "escaped.so").exists()
    assert not (tmp_path / "cache" / "escaped.so").exists()
    assert not list((tmp_path / "cache" / "loadfuzz" / "wheels").iterdir())


def test_names_and_runpaths_relative_to_the_working_folder_are_missing_as_in_a_trial(tmp_path):
    # both were resolved against loadfuzz's own folder (or the library's): scan said nothing
    # was missing, and every trial was a load-error it had not predicted
    libs = tmp_path / "libs"
    (libs / "sub").mkdir(parents=True)
    (libs / "outside").mkdir()

    def build(output, source, *link):
        (tmp_path / "x.c").write_text(source)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(output), str(tmp_path / "x.c"),
                        *link], cwd=libs, check=True)

    build(libs / "sub" / "libdep2.so", "int dep2(void) { return 2; }\n")
    build(libs / "outside" / "libdep.so", "int dep(void) { return 1; }\n")
    build(libs / "libslash.so", "int dep2(void); int slash(void) { return dep2(); }\n",
          "sub/libdep2.so")  # no SONAME: DT_NEEDED is the path as linked
    build(libs / "libuser.so", "int dep(void); int user(void) { return dep(); }\n",
          "-Loutside", "-ldep", "-Wl,-rpath,outside", "-Wl,--enable-new-dtags")
    done = loadfuzz("matrix", libs, "--select", "libslash.so", "--select", "libuser.so",
                    "--flags", "global", "--out", tmp_path / "out", "--json", cwd=libs)
    summary = json.loads(done.stdout)
    assert {r["outcome"] for r in summary["findings"]} == {"load-error"}, done.stderr
    assert summary["prediction"]["disagree"] == [] and summary["prediction"]["agree"] == 2


def test_one_file_under_two_hard_linked_names_is_one_library_and_a_warning(tmp_path):
    # it was two libraries, so the matrix paired the file with itself (as --add of a file the
    # target holds would, which is refused)
    import os

    shutil.copy(QUANTIZED, tmp_path / "libone.so")
    os.link(tmp_path / "libone.so", tmp_path / "libtwo.so")
    shutil.copy(FIXTURES / "corpus" / "libcz_solo.so", tmp_path / "libother.so")
    for inv in (inventory.load_target(str(tmp_path)),
                inventory.load_targets([str(tmp_path / "libone.so"), str(tmp_path / "libtwo.so"),
                                        str(tmp_path / "libother.so")])):
        names = [lib.id.rsplit("/", 1)[-1] for lib in inv.libraries]
        assert sorted(names) == ["libone.so", "libother.so"], names
        assert any("the same file as" in w and "libtwo.so" in w for w in inv.warnings), (
            inv.warnings)
