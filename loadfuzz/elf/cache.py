"""A persistent cache of what is read from ELF files: a file's facts, the operator names in it.

`ElfCache` keeps one small file per (what, path) under a folder
(`hostenv.cache_folder() / "elf"` by default). Each entry starts with its
key: the format and the version of the reading code (a digest of `read`,
`opnames`, this module and pyelftools' version), what it holds (facts for
this interpreter's machine, or the names one reader finds), the path and the
file's identity as `stat` gives it (st_dev, st_ino, st_size, st_mtime_ns,
st_ctime_ns). An entry whose key is not the wanted one is read again and
replaced, so a file that changes, or a change to the readers, never brings
back stale facts, and entries do not pile up for a path.

Entries are written and read by `entries`: whole (a temporary file renamed
over the old one), so concurrent campaigns only ever see whole entries. An
entry that is torn, corrupt or unreadable is ignored (the file is read
instead); an unwritable folder means nothing is kept. A file changed less than
`settle_ns` ago is read but not kept, as git does for "racily clean" files:
a second change within the file system's timestamp granularity would
otherwise go unseen. Entries are pickles of plain values (no class can be
named in them, so loading one runs no code) with a CRC of the payload.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from loadfuzz import entries, hostenv
from loadfuzz.elf import opnames, read
from loadfuzz.elf.read import ElfFacts, Machine

FORMAT = 1


def reader_version() -> str:
    """A digest of the code whose results are cached: a change to it invalidates every entry."""
    import elftools  # here, not at the top: a command served by a warm cache never needs it

    digest = hashlib.sha256(f"{FORMAT} pyelftools {elftools.__version__}".encode())
    for module in (read, opnames, entries):
        digest.update(Path(module.__file__ or "").read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:32]


@dataclass(frozen=True)
class ElfCache:
    """What was read from ELF files, kept in `folder` (one file per entry) across commands."""

    folder: Path
    version: str
    settle_ns: int = entries.SETTLE_NS  # a file changed this recently is not kept (see the module doc)

    @classmethod
    def at(cls, folder: Path, settle_ns: int = entries.SETTLE_NS) -> ElfCache | None:
        """A cache in `folder`; None when the reading code cannot be read to know its version."""
        try:
            return cls(Path(folder), reader_version(), settle_ns)
        except OSError:
            return None

    @classmethod
    def default(cls) -> ElfCache | None:
        return cls.at(hostenv.cache_folder() / "elf")

    def facts(self, path: Path, host: Machine) -> ElfFacts:
        """`read.read_facts(path, host)`, from the cache when this file was read before."""
        what = f"facts {host.elf_class} {host.little_endian} {host.machine}"
        before = identity(path)
        if before is None:
            return read.read_facts(path, host)
        key = self.key(what, path, before)
        stored = self.load(key)
        if stored is not None:
            try:
                return facts_from(stored, path, before)
            except (TypeError, ValueError):
                pass
        found = read.read_facts(path, host)
        self.keep(key, path, before, facts_to(found))
        return found

    def names(self, path: Path, reader: str) -> tuple[str, ...]:
        """`opnames.read_names(path, reader)`, from the cache when this file was read before."""
        before = identity(path)
        if before is None:
            return opnames.read_names(path, reader)
        key = self.key(f"names {reader}", path, before)
        stored = self.load(key)
        if isinstance(stored, tuple) and all(isinstance(name, str) for name in stored):
            return stored
        found = opnames.read_names(path, reader)
        self.keep(key, path, before, found)
        return found

    def host(self) -> Machine:
        """`read.host_machine()`, from the cache while the interpreter's file is unchanged: a
        command served by a warm cache never imports pyelftools (20 ms of every start-up)."""
        path = Path(os.path.realpath(sys.executable))
        before = identity(path)
        if before is None:
            return read.host_machine()
        key = self.key("host", path, before)
        stored = self.load(key)
        if isinstance(stored, tuple) and [type(value) for value in stored] == [int, bool, str]:
            return Machine(*stored)
        found = read.host_machine()
        self.keep(key, path, before, (found.elf_class, found.little_endian, found.machine))
        return found

    # --- entries --------------------------------------------------------------------

    def key(self, what: str, path: Path, stat: tuple[int, ...]) -> tuple:
        return (FORMAT, self.version, what, str(path), *stat)

    def entry(self, key: tuple) -> Path:
        """The file of an entry: one per (what, path), whatever the file's identity or version."""
        name = hashlib.sha256(f"{key[2]}\0{key[3]}".encode("utf-8", "surrogateescape"))
        return self.folder / f"{name.hexdigest()[:40]}.pickle"

    def load(self, key: tuple) -> object | None:
        """The payload kept under exactly this key, or None (none, another key, torn, corrupt)."""
        return entries.read(self.entry(key), key)

    def keep(self, key: tuple, path: Path, before: tuple[int, ...], payload: object) -> None:
        """Write an entry, unless the file changed while it was read or too recently to tell."""
        after = identity(path)
        if after != before or time.time_ns() - max(after[-2:]) < self.settle_ns:
            return
        entries.write(self.entry(key), key, payload)


def identity(path: Path) -> tuple[int, int, int, int, int] | None:
    """(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) of the file a path reaches; None if none."""
    try:
        stat = os.stat(path)
    except (OSError, ValueError):
        return None
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def facts_to(facts: ElfFacts) -> tuple:
    """ElfFacts as plain values (the path and identity are the entry's key)."""
    machine = facts.machine
    return ((machine.elf_class, machine.little_endian, machine.machine), facts.soname,
            facts.needed, facts.rpath, facts.runpath, facts.symbolic, facts.defines,
            facts.protected, facts.undefined, facts.weak, facts.strong, facts.own_lookups,
            facts.exports_api, facts.ifuncs)


def facts_from(stored: object, path: Path, stat: tuple[int, ...]) -> ElfFacts:
    """The ElfFacts `facts_to` gave; TypeError or ValueError for anything else."""
    if not isinstance(stored, tuple):
        raise TypeError("not an entry of facts")
    (machine, soname, needed, rpath, runpath, symbolic, defines, protected, undefined, weak,
     strong, own_lookups, exports_api, ifuncs) = stored
    for names in (needed, rpath, runpath):
        if not isinstance(names, tuple):
            raise TypeError("not an entry of facts")
    for names in (defines, protected, undefined, weak, strong, own_lookups, ifuncs):
        if not isinstance(names, frozenset):
            raise TypeError("not an entry of facts")
    return ElfFacts(path=path, identity=(stat[0], stat[1]), machine=Machine(*machine),
                    soname=soname, needed=needed, rpath=rpath, runpath=runpath,
                    symbolic=symbolic, defines=defines, protected=protected,
                    undefined=undefined, weak=weak, strong=strong,
                    own_lookups=own_lookups, exports_api=exports_api, ifuncs=ifuncs)
