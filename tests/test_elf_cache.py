"""What is read from an ELF file is kept across commands (`elf.cache`) and never comes back stale."""

import importlib.metadata
import io
import os
import pickle
import shutil
import sys
import threading
import time
from pathlib import Path, PurePosixPath

import pytest

from loadfuzz import hostenv, inventory, targets
from loadfuzz.elf import cache as elf_cache
from loadfuzz.elf import opnames, read
from loadfuzz.elf.cache import ElfCache
from loadfuzz.elf.read import ElfReader
from loadfuzz.entries import PlainData
from support import AOT, ET, FIXTURES, LEGACY_PLUGIN, QUANTIZED, loadfuzz

CORPUS = FIXTURES / "corpus"


def fresh_cache(folder: Path) -> ElfCache:
    """A cache that keeps even a file written a moment ago (the tests' copies are)."""
    cache = ElfCache.at(folder, settle_ns=0)
    assert cache is not None
    return cache


def entries(folder: Path) -> list[Path]:
    """The entries of the files read (not the interpreter's, which every reader keeps first)."""
    interpreter = ElfCache(folder, "").entry(("", "", "host", os.path.realpath(sys.executable)))
    return sorted(set(folder.glob("*.pickle")) - {interpreter}) if folder.is_dir() else []


def reads(monkeypatch) -> list[tuple[str, Path]]:
    """Every file the readers below the cache parse from now on, as (what, path)."""
    done: list[tuple[str, Path]] = []
    facts, names = read.read_facts, opnames.read_names

    def read_facts(path, host):
        done.append(("facts", Path(path)))
        return facts(path, host)

    def read_names(path, reader):
        done.append((reader, Path(path)))
        return names(path, reader)

    monkeypatch.setattr(read, "read_facts", read_facts)
    monkeypatch.setattr(opnames, "read_names", read_names)
    return done


def snapshot(inv: inventory.Inventory) -> tuple:
    """Everything an inventory says, with every file's facts."""
    return inv.libraries, inv.warnings, dict(inv.link_map.files), dict(inv.link_map.links)


def test_a_warm_inventory_reads_no_file_again_and_says_exactly_what_a_cold_one_says(
        tmp_path, monkeypatch):
    folder = tmp_path / "elf"
    uncached = inventory.load_target("executorch", [LEGACY_PLUGIN], reader=ElfReader())
    cold = inventory.load_target("executorch", [LEGACY_PLUGIN],
                                 reader=ElfReader(fresh_cache(folder)))
    assert entries(folder)
    done = reads(monkeypatch)
    warm = inventory.load_target("executorch", [LEGACY_PLUGIN],
                                 reader=ElfReader(fresh_cache(folder)))
    assert done == []
    assert snapshot(warm) == snapshot(cold) == snapshot(uncached)
    assert warm.get("lib/libexecutorch_kernels_quantized.so").registrations[0][1][0] == \
        "quantized_decomposed::add.out"


def test_the_fixture_corpus_inventories_the_same_with_and_without_the_cache(tmp_path):
    folder = tmp_path / "elf"
    uncached = inventory.load_target(str(CORPUS), reader=ElfReader())
    for _ in ("cold", "warm"):
        cached = inventory.load_target(str(CORPUS), reader=ElfReader(fresh_cache(folder)))
        assert snapshot(cached) == snapshot(uncached)


@pytest.mark.parametrize("target", ["executorch", str(CORPUS)])
def test_scan_json_is_the_same_cold_and_warm(target, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cold = loadfuzz("scan", "--json", target)
    assert cold.returncode == 0, cold.stderr
    assert entries(tmp_path / "cache" / "loadfuzz" / "elf")
    warm = loadfuzz("scan", "--json", target)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout == cold.stdout


def test_a_command_served_by_a_warm_cache_never_imports_pyelftools(tmp_path, monkeypatch):
    """Not even for the interpreter's own machine, which keys every entry: it is kept too."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # what each import cost, on stderr
    cold, warm = (loadfuzz("matrix", CORPUS, "--flags", "global", "--out", tmp_path / name)
                  for name in ("cold", "warm"))
    assert "elftools.elf.elffile" in cold.stderr and warm.returncode == cold.returncode
    assert "elftools.elf" not in warm.stderr


def test_a_library_overwritten_with_another_is_read_again(tmp_path, monkeypatch):
    folder, copy = tmp_path / "elf", tmp_path / "libcopy.so"
    shutil.copyfile(QUANTIZED, copy)
    first = inventory.load_libraries([copy], reader=ElfReader(fresh_cache(folder))).libraries[0]
    assert first.registry == "executorch" and len(first.registers) == 21
    shutil.copyfile(AOT, copy)  # the same inode, another size and time
    done = reads(monkeypatch)
    second = inventory.load_libraries([copy], reader=ElfReader(fresh_cache(folder))).libraries[0]
    assert ("facts", copy) in done
    expected = inventory.load_libraries([copy], reader=ElfReader()).libraries[0]
    assert second == expected
    assert second.registry == "torch" and second != first


def test_a_change_that_keeps_size_and_mtime_is_still_seen(tmp_path):
    """`cp -p`-like rewrites restore the mtime; the ctime, which nothing can set, still moves."""
    folder, copy = tmp_path / "elf", tmp_path / "libcopy.so"
    shutil.copyfile(QUANTIZED, copy)
    before = ElfReader(fresh_cache(folder)).facts(copy)
    name = sorted(n for n in before.defines if len(n) > 12)[0].encode()
    renamed = name[:-1] + (b"X" if name[-1:] != b"X" else b"Y")
    stat = copy.stat()
    time.sleep(0.05)  # past the clock tick of the copy, so the ctime moves
    copy.write_bytes(copy.read_bytes().replace(b"\0" + name + b"\0", b"\0" + renamed + b"\0"))
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (copy.stat().st_size, copy.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    after = ElfReader(fresh_cache(folder)).facts(copy)
    assert renamed.decode() in after.defines and name.decode() not in after.defines
    assert after == ElfReader().facts(copy)


def test_a_file_changed_a_moment_ago_is_read_but_not_kept(tmp_path):
    folder, copy = tmp_path / "elf", tmp_path / "libcopy.so"
    shutil.copyfile(QUANTIZED, copy)
    cache = ElfCache.at(folder, settle_ns=3600 * 10**9)
    assert ElfReader(cache).facts(copy) == ElfReader().facts(copy)
    assert ElfReader(cache).names(copy, "kernel-names") == opnames.read_names(copy, "kernel-names")
    assert entries(folder) == []


def test_torn_corrupt_or_foreign_entries_are_ignored_and_replaced(tmp_path, monkeypatch):
    folder = tmp_path / "elf"
    expected = ElfReader().facts(QUANTIZED)
    ElfReader(fresh_cache(folder)).facts(QUANTIZED)
    [entry] = entries(folder)
    whole = entry.read_bytes()
    for damaged in (b"", whole[:len(whole) // 2], whole[:40], b"\0" * len(whole),
                    whole[:-10] + b"0123456789", b"garbage"):
        entry.write_bytes(damaged)
        assert ElfReader(fresh_cache(folder)).facts(QUANTIZED) == expected
        assert entry.read_bytes() == whole  # read again, and kept again
    entry.unlink()
    entry.mkdir()  # not even a file
    assert ElfReader(fresh_cache(folder)).facts(QUANTIZED) == expected
    entry.rmdir()

    # An entry that names a class (here a Path; it could be os.system) is refused, not loaded.
    monkeypatch.setattr(elf_cache, "facts_to", lambda facts: (Path("/"),))
    ElfReader(fresh_cache(folder)).facts(QUANTIZED)
    assert b"pathlib" in entry.read_bytes()
    monkeypatch.undo()
    with pytest.raises(pickle.UnpicklingError):
        PlainData(io.BytesIO(pickle.dumps(Path("/")))).load()
    assert ElfReader(fresh_cache(folder)).facts(QUANTIZED) == expected
    assert entry.read_bytes() == whole


def test_a_change_to_the_readers_invalidates_every_entry(tmp_path, monkeypatch):
    folder = tmp_path / "elf"
    ElfReader(ElfCache(folder, "reader one", settle_ns=0)).facts(QUANTIZED)
    done = reads(monkeypatch)
    ElfReader(ElfCache(folder, "reader one", settle_ns=0)).facts(QUANTIZED)
    assert done == []
    ElfReader(ElfCache(folder, "reader two", settle_ns=0)).facts(QUANTIZED)
    assert done == [("facts", QUANTIZED)]
    assert len(entries(folder)) == 1  # replaced, not piled up


def test_an_unwritable_cache_folder_just_means_no_caching(tmp_path):
    (tmp_path / "in the way").write_text("a file, not a folder")
    cache = fresh_cache(tmp_path / "in the way" / "elf")
    uncached = inventory.load_target("executorch", reader=ElfReader())
    assert snapshot(inventory.load_target("executorch", reader=ElfReader(cache))) == \
        snapshot(uncached)


def test_concurrent_writers_and_readers_only_ever_see_whole_entries(tmp_path):
    folder = tmp_path / "elf"
    expected = ElfReader().facts(ET / "lib" / "libexecutorch.so")
    seen, failures = [], []

    def work():
        try:
            for _ in range(8):
                cache = fresh_cache(folder)
                seen.append(cache.facts(ET / "lib" / "libexecutorch.so", expected.machine))
        except Exception as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and len(seen) == 32 and all(facts == expected for facts in seen)
    assert [p.name for p in folder.iterdir() if p.name.startswith(".writing-")] == []


def test_an_installed_distribution_lists_what_importlib_metadata_lists_without_its_path_objects():
    for name in ("torch", "executorch"):
        dist = importlib.metadata.distribution(name)
        assert targets.recorded_parts(dist) == [PurePosixPath(str(e)).parts for e in dist.files]

    class Recorded:
        def __init__(self, names):
            self.text = "\n".join(f"{name},sha256=x,1" for name in names)

        def read_text(self, name):
            return self.text if name == "RECORD" else None

    odd = ["a//b.so", "./a/b.so", "a/./b.so", "/abs/x.so", "//x.so", "a/b/", ".", "..",
           "../../bin/tool", "a/../b.so", "x.so"]
    assert targets.recorded_parts(Recorded(odd)) == [PurePosixPath(name).parts for name in odd]


def test_a_relative_xdg_cache_home_is_ignored_as_the_xdg_spec_says(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "cache/here")
    assert hostenv.cache_folder() == tmp_path / ".cache" / "loadfuzz"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hostenv.cache_folder() == tmp_path / "xdg" / "loadfuzz"
