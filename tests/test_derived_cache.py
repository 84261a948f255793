"""What is derived from many files (`scan`'s output) is kept across commands (`derived`) and is
used only while every file, folder and metadata file it was derived from is unchanged."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from loadfuzz import derived, entries, inventory, inventory_cache
from loadfuzz.cli import commands, main
from loadfuzz.derived import Consulted, DerivedCache
from support import FIXTURES, LEGACY_PLUGIN, QUANTIZED, ROOT

CORPUS = FIXTURES / "corpus"
FIXTURE_SOURCES = ROOT / "tests" / "fixtures"


@pytest.fixture
def scans(tmp_path, monkeypatch, capsys):
    """Runs `loadfuzz scan --json ...` in this process against a derived cache in tmp_path
    that keeps even results of files written a moment ago (the tests' copies are); returns
    (the JSON printed, whether it was read from the files rather than the cache)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(DerivedCache, "default",
                        classmethod(lambda cls: cls(tmp_path / "derived", settle_ns=0)))
    derivations = []
    scan_output = commands.scan_output

    def counting(args, *rest):
        derivations.append(args.targets)
        return scan_output(args, *rest)

    monkeypatch.setattr(commands, "scan_output", counting)

    def scan(*words: str) -> tuple[dict, bool]:
        before = len(derivations)
        assert main(["scan", "--json", *words]) == 0
        return json.loads(capsys.readouterr().out), len(derivations) > before

    return scan


def cold_scan(tmp_path: Path, *words: str) -> dict:
    """The same scan with every cache empty: a fresh cache folder, in a fresh process."""
    cache = tmp_path / f"cold-{len(list(tmp_path.glob('cold-*')))}"
    done = subprocess.run([sys.executable, "-m", "loadfuzz", "scan", "--json", *words],
                          capture_output=True, text=True, check=True,
                          env=dict(os.environ, XDG_CACHE_HOME=str(cache)))
    return json.loads(done.stdout)


def copy_of_corpus(tmp_path: Path) -> Path:
    target = tmp_path / "corpus"
    shutil.copytree(CORPUS, target)
    return target


@pytest.mark.parametrize("target", ["executorch", "torch", str(CORPUS)])
def test_a_warm_scan_prints_exactly_what_a_cold_one_prints(target, scans, tmp_path):
    first, read_files = scans(target)
    assert read_files
    warm, read_files = scans(target)
    assert not read_files
    assert warm == first == cold_scan(tmp_path, target)


def test_text_and_json_come_from_one_entry(scans, tmp_path, capsys):
    scans(str(CORPUS))
    assert main(["scan", str(CORPUS)]) == 0
    text = capsys.readouterr().out
    assert "libcz_registry.so" in text and "predicted collisions" in text
    assert len(list((tmp_path / "derived").glob("*.pickle"))) == 2  # the output, the inventory


def test_touching_a_library_sends_scan_back_to_the_files(scans, tmp_path):
    target = copy_of_corpus(tmp_path)
    scans(str(target))
    library = target / "libcz_solo.so"
    stat = library.stat()
    os.utime(library, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    again, read_files = scans(str(target))
    assert read_files
    assert again == cold_scan(tmp_path, str(target))


def test_a_library_replaced_by_another_changes_the_result(scans, tmp_path):
    target = copy_of_corpus(tmp_path)
    before, _ = scans(str(target))
    shutil.copyfile(QUANTIZED, target / "libcz_solo.so.new")
    os.replace(target / "libcz_solo.so.new", target / "libcz_solo.so")
    after, read_files = scans(str(target))
    assert read_files and after != before
    solo = next(lib for lib in after["libraries"] if lib["id"] == "libcz_solo.so")
    assert "quantized_decomposed::add.out" in solo["registers"]
    assert after == cold_scan(tmp_path, str(target))


def test_a_library_added_to_a_folder_of_the_target_is_in_the_next_scan(scans, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(CORPUS, target / "lib")
    before, _ = scans(str(target))
    shutil.copyfile(QUANTIZED, target / "lib" / "libextra.so")
    after, read_files = scans(str(target))
    assert read_files
    assert [lib["id"] for lib in after["libraries"]] == sorted(
        [lib["id"] for lib in before["libraries"]] + ["lib/libextra.so"])
    assert after == cold_scan(tmp_path, str(target))


def test_a_missing_dependency_that_appears_where_the_loader_looks_is_found(scans, tmp_path):
    """Not only the files read count: a folder searched in vain is looked at again."""
    target, deps = tmp_path / "target", tmp_path / "deps"
    target.mkdir()
    cc = os.environ.get("CC") or "gcc"
    gone = tmp_path / "link-time" / "libfx_gone.so"
    gone.parent.mkdir()
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libfx_gone.so", "-o", str(gone),
                    str(FIXTURE_SOURCES / "gone.c")], check=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(target / "libneeds.so"),
                    str(FIXTURE_SOURCES / "needs_missing.c"), f"-L{gone.parent}", "-lfx_gone",
                    "-Wl,-rpath,$ORIGIN/../deps"], check=True)
    before, _ = scans(str(target))
    assert before["libraries"][0]["missing"] == ["libfx_gone.so"]
    deps.mkdir()
    shutil.copyfile(gone, deps / "libfx_gone.so")
    after, read_files = scans(str(target))
    assert read_files and after["libraries"][0]["missing"] == []
    assert after == cold_scan(tmp_path, str(target))


@pytest.mark.parametrize("named", ["by a dangling link", "by an absolute path"])
def test_a_dependency_that_appears_where_nothing_was_listed_is_found(scans, tmp_path, named):
    """Where the loader looks may name a file that is not there yet though no folder it lists
    changes when it comes: a dangling symbolic link whose target appears (elsewhere), or a
    NEEDED entry that is a path."""
    target, real = tmp_path / "target", tmp_path / "real"
    target.mkdir()
    real.mkdir()
    cc = os.environ.get("CC") or "gcc"
    gone = tmp_path / "link-time" / "libfx_gone.so"
    gone.parent.mkdir()
    soname = "libfx_gone.so" if named == "by a dangling link" else str(real / "libfx_gone.so")
    subprocess.run([cc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(gone),
                    str(FIXTURE_SOURCES / "gone.c")], check=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(target / "libneeds.so"),
                    str(FIXTURE_SOURCES / "needs_missing.c"), str(gone),
                    "-Wl,-rpath,$ORIGIN/../deps"], check=True)
    (tmp_path / "deps").mkdir()
    (tmp_path / "deps" / "libfx_gone.so").symlink_to(real / "libfx_gone.so")
    before, _ = scans(str(target))
    assert before["libraries"][0]["missing"] == [soname]
    shutil.copyfile(gone, real / "libfx_gone.so")  # neither target/ nor deps/ changes
    after, read_files = scans(str(target))
    assert read_files and after["libraries"][0]["missing"] == []
    assert after == cold_scan(tmp_path, str(target))


def test_a_new_version_of_loadfuzz_does_not_read_the_old_ones_entries(scans, tmp_path,
                                                                      monkeypatch):
    scans(str(CORPUS))
    monkeypatch.setattr(derived, "code_digest", lambda: "another loadfuzz")
    _, read_files = scans(str(CORPUS))
    assert read_files
    assert len(list((tmp_path / "derived").glob("*.pickle"))) == 2  # replaced, not piled up


def test_a_result_of_files_changed_a_moment_ago_is_not_kept(tmp_path):
    cache = DerivedCache(tmp_path / "derived", settle_ns=3600 * 10**9)
    fresh = tmp_path / "fresh.so"
    fresh.write_bytes(b"just written")
    consulted = Consulted()
    consulted.note(fresh)
    key = cache.key("test", ("fresh",))
    cache.keep(key, consulted, started_ns=time.time_ns(), result="derived from fresh.so")
    assert cache.get(key) is None


def test_an_egg_info_distributions_metadata_is_watched(scans, tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "eggdist").mkdir(parents=True)
    shutil.copyfile(CORPUS / "libcz_solo.so", site / "eggdist" / "libsolo.so")
    shutil.copyfile(CORPUS / "libcz_pair_a.so", site / "eggdist" / "libpair.so")
    info = site / "eggdist.egg-info"
    info.mkdir()
    (info / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: eggdist\nVersion: 1.0\n")
    (info / "SOURCES.txt").write_text("eggdist/libsolo.so\neggdist/libpair.so\n")
    monkeypatch.syspath_prepend(str(site))
    before, _ = scans("eggdist")
    assert before["version"] == "1.0" and len(before["libraries"]) == 2
    (info / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: eggdist\nVersion: 2.0\n")
    (info / "SOURCES.txt").write_text("eggdist/libsolo.so\n")
    after, read_files = scans("eggdist")
    assert read_files and after["version"] == "2.0"
    assert [lib["id"] for lib in after["libraries"]] == ["libsolo.so"]


def test_a_result_derived_from_a_file_removed_meanwhile_is_not_kept(tmp_path):
    cache = DerivedCache(tmp_path / "derived", settle_ns=0)
    gone = tmp_path / "gone.so"
    gone.write_bytes(b"read, then removed before the result was kept")
    consulted = Consulted()
    consulted.note_read(gone)
    gone.unlink()  # next time it is still missing: that must not match "unchanged"
    key = cache.key("test", ("gone",))
    cache.keep(key, consulted, started_ns=time.time_ns(), result="says gone.so is there")
    assert cache.get(key) is None
    consulted.read.clear()  # a path only looked for, not found: its absence is a witness
    cache.keep(key, consulted, started_ns=time.time_ns(), result="gone.so is not there")
    assert cache.get(key) == "gone.so is not there"


def test_a_wildcard_in_a_folder_of_an_ld_so_conf_include_is_watched(tmp_path):
    from loadfuzz.elf.loader import ld_so_conf

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()  # no x.conf yet: one written here later changes the search
    (tmp_path / "main.conf").write_text(f"include {tmp_path}/*/x.conf\n")
    (tmp_path / "a" / "x.conf").write_text(f"{tmp_path}/libs\n")
    seen: set[Path] = set()
    assert ld_so_conf(tmp_path / "main.conf", seen) == [tmp_path / "libs"]
    assert {tmp_path, tmp_path / "a", tmp_path / "b"} <= seen


def test_torn_or_foreign_entries_are_ignored(tmp_path):
    cache = DerivedCache(tmp_path / "derived", settle_ns=0)
    key = cache.key("test", ("words",))
    cache.keep(key, Consulted(), started_ns=time.time_ns(), result="the result")
    assert cache.get(key) == "the result"
    entry = cache.entry(key)
    whole = entry.read_bytes()
    for damaged in (b"", whole[:len(whole) // 2], whole[:-4] + b"1234", b"garbage"):
        entry.write_bytes(damaged)
        assert cache.get(key) is None
    entry.write_bytes(whole)
    assert cache.get(cache.key("test", ("other words",))) is None


def test_an_entry_damaged_in_any_byte_is_ignored_never_an_error(tmp_path):
    # A damaged length in the head made the unpickler raise OverflowError: every later
    # command exited 3 until the cache was deleted by hand.
    entry = tmp_path / "entry"
    key = ("test", "key", 1)
    entries.write(entry, key, ("payload", 123, frozenset({"a"})))
    whole = entry.read_bytes()
    for at in range(len(whole)):
        for value in (0x00, 0x7F, 0x80, 0xFF, whole[at] ^ 0x01):
            entry.write_bytes(whole[:at] + bytes([value]) + whole[at + 1:])
            assert entries.read(entry, key) in (None, ("payload", 123, frozenset({"a"})))


def test_an_entry_that_is_no_file_is_ignored_never_waited_on(tmp_path):
    # a FIFO in an entry's place blocked the command in open() until it was killed
    entry = tmp_path / "entry"
    key = ("test", "key", 1)
    os.mkfifo(entry)
    assert entries.read(entry, key) is None
    entry.unlink()
    entry.mkdir()
    assert entries.read(entry, key) is None
    assert entries.read(Path("/dev/zero"), key) is None  # (read whole, it would never end)


def test_concurrent_writers_and_readers_only_ever_see_whole_entries(tmp_path):
    cache = DerivedCache(tmp_path / "derived", settle_ns=0)
    key = cache.key("test", ("shared",))
    results = [f"result {n} " * 10_000 for n in range(4)]
    seen, failures = [], []

    def work(result: str) -> None:
        try:
            for _ in range(20):
                cache.keep(key, Consulted(), started_ns=time.time_ns(), result=result)
                seen.append(cache.get(key))
        except Exception as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(result,)) for result in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and len(seen) == 80 and set(seen) <= set(results)
    assert [p.name for p in (tmp_path / "derived").iterdir() if p.name.startswith(".writing-")] == []


def test_a_warm_scan_imports_neither_pyelftools_nor_the_inventory_nor_the_harness(tmp_path):
    probe = ("import sys\n"
             "from loadfuzz.cli import main\n"
             "main(['scan', 'executorch'])\n"
             "heavy = ('elftools', 'psutil', 'hypothesis', 'loadfuzz.inventory', "
             "'loadfuzz.predict', 'loadfuzz.run')\n"
             "print(sorted(m for m in sys.modules if m.startswith(heavy)), file=sys.stderr)\n")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    runs = [subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           env=env, check=True) for _ in ("cold", "warm")]
    assert "elftools" in runs[0].stderr  # the cold one read the files
    assert runs[1].stderr.strip() == "[]"
    assert runs[1].stdout == runs[0].stdout


def snapshot(inv: inventory.Inventory) -> tuple:
    """Everything an inventory says, with every file's facts."""
    return (inv.target, inv.name, inv.version, inv.root, inv.libraries, inv.warnings,
            dict(inv.link_map.files), dict(inv.link_map.links), inv.labels)


@pytest.mark.parametrize("targets", [["executorch"], [str(CORPUS)], ["executorch", "torch"]])
def test_a_campaigns_inventory_from_the_cache_is_the_one_read_from_the_files(
        targets, tmp_path, monkeypatch):
    cache = DerivedCache(tmp_path / "derived", settle_ns=0)
    read = inventory.load_targets(targets, [LEGACY_PLUGIN])
    reads = []
    load_targets = inventory.load_targets
    monkeypatch.setattr(inventory, "load_targets",
                        lambda *args, **kwargs: reads.append(args) or load_targets(*args, **kwargs))
    first = inventory_cache.load_targets(targets, [LEGACY_PLUGIN], cache=cache)
    again = inventory_cache.load_targets(targets, [LEGACY_PLUGIN], cache=cache)
    assert len(reads) == 1
    assert snapshot(again) == snapshot(first) == snapshot(read)


def test_a_cached_inventory_is_read_again_when_a_library_is_replaced(tmp_path):
    cache = DerivedCache(tmp_path / "derived", settle_ns=0)
    target = copy_of_corpus(tmp_path)
    before = inventory_cache.load_targets([str(target)], cache=cache)
    shutil.copyfile(QUANTIZED, target / "libcz_solo.so.new")
    os.replace(target / "libcz_solo.so.new", target / "libcz_solo.so")
    after = inventory_cache.load_targets([str(target)], cache=cache)
    assert after.get("libcz_solo.so").registers != before.get("libcz_solo.so").registers
    assert snapshot(after) == snapshot(inventory.load_targets([str(target)]))


def test_a_campaign_after_a_scan_of_the_same_targets_starts_from_the_inventory_scan_read(
        scans, tmp_path, monkeypatch):
    target = str(copy_of_corpus(tmp_path))
    scans(target)
    monkeypatch.setattr(inventory, "load_targets", lambda *args, **kwargs: pytest.fail("read"))
    cached = inventory_cache.load_targets([target], cache=DerivedCache.default())
    monkeypatch.undo()
    assert snapshot(cached) == snapshot(inventory.load_targets([target]))
