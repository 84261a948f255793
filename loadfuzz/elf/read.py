"""Read one ELF file the way the dynamic loader sees it: its dynamic section and dynamic symbols.

In the manner of auditwheel's `lddtree.py`: small, pure, pyelftools only (no
`readelf`, no `nm`). `ElfReader` reads each file once and keeps what it
read for as long as the reader lives; given an `ElfCache` (`elf.cache`), a
file is read once for as long as it does not change. There is no
module-level cache.
"""

from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from loadfuzz.elf.opnames import read_names

# pyelftools is imported where a file is parsed: a command whose answers come from a warm
# cache (`elf.cache`, `derived`) never parses a file and never pays for importing it.
if TYPE_CHECKING:
    from elftools.elf.elffile import ELFFile

    from loadfuzz.derived import Consulted
    from loadfuzz.elf.cache import ElfCache


class BadElf(Exception):
    """A file that is not a usable shared library for this machine; the message says why."""


STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
STV_PROTECTED = 3
STT_FUNC = 2
STT_GNU_IFUNC = 10
SHN_ABS = 0xFFF1
DF_SYMBOLIC = 0x2
DF_1_PIE = 0x08000000  # DT_FLAGS_1: an executable built -pie, which ld.so will not dlopen
# C++ names that are the standard library's, not a library's own API.
STD_PREFIXES = ("_ZSt", "_ZNSt", "_ZNKSt", "_ZN9__gnu_cxx", "_ZNK9__gnu_cxx", "_ZT", "_ZGV")
LOADER_HOOKS = frozenset({"_init", "_fini"})


@dataclass(frozen=True)
class Machine:
    """What the loader matches a dependency on: ELF class, byte order and machine."""

    elf_class: int  # 32 | 64
    little_endian: bool
    machine: str  # "EM_X86_64", ...

    def __str__(self) -> str:
        order = "little-endian" if self.little_endian else "big-endian"
        return f"{self.elf_class}-bit {order} {self.machine.removeprefix('EM_')}"


@dataclass(frozen=True)
class ElfFacts:
    """What the loader and the registries care about in one shared library."""

    path: Path  # absolute, as found (symlinks kept: $ORIGIN is the folder it was found in)
    identity: tuple[int, int]  # (st_dev, st_ino): one file however it is reached
    machine: Machine
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]  # as written ($ORIGIN unexpanded)
    runpath: tuple[str, ...]
    symbolic: bool  # DT_SYMBOLIC / DF_SYMBOLIC: its own definitions come first for its calls
    defines: frozenset[str] = field(repr=False)  # exported dynamic symbols
    protected: frozenset[str] = field(repr=False)  # those of them with protected visibility
    undefined: frozenset[str] = field(repr=False)  # strong undefined dynamic symbols
    # weak undefined ones: bound where a definition is in scope, else left null (never an error)
    weak: frozenset[str] = field(repr=False)
    # the exported definitions bound STB_GLOBAL: a copy a library means to be the one (malloc,
    # operator new), where a weak one is an inline or template instance any copy may stand for
    strong: frozenset[str] = field(repr=False)
    # the exported definitions its own dynamic relocations name: bound at load time, like an
    # import, to whichever definition comes first in scope (another object's copy, if earlier)
    own_lookups: frozenset[str] = field(repr=False)
    exports_api: bool = False  # a global function (C or C++) outside the C++ standard library
    # exported definitions by an IFUNC resolver: run while a load relocates, before any
    # constructor of that load (what it picks may depend on what constructors ran before)
    ifuncs: frozenset[str] = field(default=frozenset(), repr=False)

    def binds_to_itself(self, symbol: str) -> bool:
        return symbol in self.defines and (self.symbolic or symbol in self.protected)


def host_machine() -> Machine:
    """The ELF class and machine of the interpreter running loadfuzz: what trials can load."""
    from elftools.elf.elffile import ELFFile

    with open(os.path.realpath(sys.executable), "rb") as stream:
        elf = ELFFile(stream)
        return Machine(elf.elfclass, elf.little_endian, elf["e_machine"])


class ElfReader:
    """Reads ELF files once each; one reader per inventory (what it keeps dies with it).

    With a `cache`, what was read from a file in an earlier command comes back
    from it for as long as the file does not change. With `consulted`, every
    path it reads or is told about (`note`) is noted there: what a result
    derived from its answers depends on (see `derived`).
    """

    def __init__(self, cache: ElfCache | None = None, consulted: Consulted | None = None) -> None:
        self.host = cache.host() if cache is not None else host_machine()
        self.cache = cache
        self.consulted = consulted
        self._facts: dict[Path, ElfFacts | BadElf] = {}
        self._names: dict[tuple[Path, str], tuple[str, ...]] = {}

    def note(self, path: Path) -> None:
        """A path whose state the answers depend on besides the files read (a folder searched)."""
        if self.consulted is not None:
            self.consulted.note(path)

    def facts(self, path: Path) -> ElfFacts:
        """The facts of `path`; raises BadElf with the reason when it is unusable."""
        path = Path(os.path.abspath(path))
        if path not in self._facts:
            self.note(path)
            try:
                self._facts[path] = (self.cache.facts(path, self.host) if self.cache
                                     else read_facts(path, self.host))
                if self.consulted is not None:
                    self.consulted.note_read(path)
            except BadElf as exc:
                self._facts[path] = exc
        found = self._facts[path]
        if isinstance(found, BadElf):
            raise found
        return found

    def names(self, path: Path, reader: str) -> tuple[str, ...]:
        """The operator names `reader` (a key of `opnames.NAME_READERS`) finds in the file."""
        key = (Path(os.path.abspath(path)), reader)
        if key not in self._names:
            self.note(key[0])
            self._names[key] = self.cache.names(*key) if self.cache else read_names(*key)
        return self._names[key]

    def matches(self, path: Path) -> bool:
        """Whether the loader would take this file (an ELF of the host's class and machine)."""
        try:
            self.facts(path)
        except BadElf:
            return False
        return True


def read_facts(path: Path, host: Machine) -> ElfFacts:
    from elftools.common.exceptions import ELFError, ELFParseError
    from elftools.elf.elffile import ELFFile

    try:
        size = path.stat().st_size
        with open(path, "rb") as stream:
            if stream.read(4) != b"\x7fELF":
                raise BadElf(f"{path}: not an ELF file")
            stream.seek(0)
            return parse_facts(path, ELFFile(stream), size, host)
    except OSError as exc:
        raise BadElf(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except (ELFError, ELFParseError, struct.error, ValueError, IndexError, KeyError) as exc:
        raise BadElf(f"{path}: broken ELF file ({exc or type(exc).__name__}); truncated?") from None


def parse_facts(path: Path, elf: ELFFile, size: int, host: Machine) -> ElfFacts:
    from elftools.elf.dynamic import DynamicSection

    machine = Machine(elf.elfclass, elf.little_endian, elf["e_machine"])
    if machine != host:
        raise BadElf(f"{path}: a {machine} ELF file; this interpreter is {host}")
    if elf["e_type"] != "ET_DYN":
        raise BadElf(f"{path}: not a shared library ({elf['e_type']})")
    headers_end = elf["e_shoff"] + elf["e_shnum"] * elf["e_shentsize"]
    if headers_end > size:
        raise BadElf(f"{path}: truncated ({size} bytes; its section headers end at {headers_end})")
    dynamic = next((s for s in elf.iter_sections() if isinstance(s, DynamicSection)), None)
    dynsym = elf.get_section_by_name(".dynsym")
    if dynamic is None or dynsym is None:
        raise BadElf(f"{path}: not a dynamically linked shared library (no dynamic section)")
    for section in (dynamic, dynsym, elf.get_section(dynsym["sh_link"])):
        if section["sh_offset"] + section["sh_size"] > size:
            raise BadElf(f"{path}: truncated ({size} bytes; {section.name} ends at "
                         f"{section['sh_offset'] + section['sh_size']})")
    tags: dict[str, list] = {}
    for tag in dynamic.iter_tags():
        tags.setdefault(tag.entry.d_tag, []).append(tag)

    def split(name: str, attr: str) -> tuple[str, ...]:
        return tuple(part for tag in tags.get(name, ()) for part in getattr(tag, attr).split(":")
                     if part)

    if sum(tag.entry.d_val for tag in tags.get("DT_FLAGS_1", ())) & DF_1_PIE:
        raise BadElf(f"{path}: a position-independent executable, not a shared library "
                     "(dlopen refuses it)")
    flags = sum(tag.entry.d_val for tag in tags.get("DT_FLAGS", ()))
    versions = version_tags(elf)  # absolute symbols no relocation names: left out of every set
    symbols = [s for s in dynamic_symbols(elf, dynsym) if not (s.absolute and s.name in versions)]
    named = relocated_symbols(elf, dynsym)
    defines = frozenset(s.name for s in symbols if s.exported)
    undefined = frozenset(s.name for s in symbols if s.undefined and s.bind == STB_GLOBAL)
    weak = frozenset(s.name for s in symbols if s.undefined and s.bind == STB_WEAK)
    return ElfFacts(
        path=path,
        identity=(path.stat().st_dev, path.stat().st_ino),
        machine=machine,
        soname=tags["DT_SONAME"][0].soname if "DT_SONAME" in tags else None,
        needed=tuple(tag.needed for tag in tags.get("DT_NEEDED", ())),
        rpath=split("DT_RPATH", "rpath"),
        runpath=split("DT_RUNPATH", "runpath"),
        symbolic="DT_SYMBOLIC" in tags or bool(flags & DF_SYMBOLIC),
        defines=defines,
        protected=frozenset(s.name for s in symbols if s.exported and s.visibility == STV_PROTECTED),
        undefined=undefined,
        weak=weak,
        strong=frozenset(s.name for s in symbols if s.exported and s.bind == STB_GLOBAL),
        own_lookups=frozenset(s.name for s in symbols if s.exported and s.index in named),
        exports_api=any(s.exported and s.bind == STB_GLOBAL and s.kind == STT_FUNC
                        and not s.name.startswith(STD_PREFIXES) and s.name not in LOADER_HOOKS
                        for s in symbols),
        ifuncs=frozenset(s.name for s in symbols if s.exported and s.kind == STT_GNU_IFUNC),
    )


@dataclass(frozen=True)
class Symbol:
    index: int  # in the dynamic symbol table: what a relocation names it by
    name: str
    bind: int
    kind: int
    visibility: int
    undefined: bool
    absolute: bool = False  # SHN_ABS: a value, not an address in the object

    @property
    def exported(self) -> bool:
        return (not self.undefined and self.bind in (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE)
                and self.visibility in (0, STV_PROTECTED))


def dynamic_symbols(elf: ELFFile, dynsym) -> list[Symbol]:
    """The dynamic symbol table, decoded in bulk.

    pyelftools finds the sections; the fixed-size entries are unpacked with
    `struct` because decoding them one by one through pyelftools takes
    seconds on libtorch_cpu.so (75 000 symbols).
    """
    order = "<" if elf.little_endian else ">"
    if elf.elfclass == 64:  # st_name st_info st_other st_shndx st_value st_size
        fmt, name_at, info_at, other_at, shndx_at = order + "IBBHQQ", 0, 1, 2, 3
    else:  # st_name st_value st_size st_info st_other st_shndx
        fmt, name_at, info_at, other_at, shndx_at = order + "IIIBBH", 0, 3, 4, 5
    strtab = elf.get_section(dynsym["sh_link"]).data()
    data = dynsym.data()
    width = struct.calcsize(fmt)
    symbols = []
    for index, entry in enumerate(struct.iter_unpack(fmt, data[:len(data) - len(data) % width])):
        offset = entry[name_at]
        if offset == 0:
            continue
        end = strtab.find(b"\0", offset)
        name = strtab[offset:end if end >= 0 else len(strtab)].decode("utf-8", "replace")
        info = entry[info_at]
        symbols.append(Symbol(index, name, info >> 4, info & 0xF, entry[other_at] & 0x3,
                              entry[shndx_at] == 0, entry[shndx_at] == SHN_ABS))
    return symbols


def version_tags(elf: ELFFile) -> frozenset[str]:
    """The names of the symbol versions the object defines (GLIBC_2.2.5, CXXABI_1.3, VA...):
    the linker adds an absolute symbol of each name, which is no definition of anything."""
    from elftools.elf.gnuversions import GNUVerDefSection

    return frozenset(aux.name for section in elf.iter_sections()
                     if isinstance(section, GNUVerDefSection)
                     for _, auxiliaries in section.iter_versions() for aux in auxiliaries)


def relocated_symbols(elf: ELFFile, dynsym) -> set[int]:
    """The indices into the dynamic symbol table that the dynamic relocations name (.rela.dyn,
    .rela.plt or their REL forms), unpacked in bulk with `struct` (libtorch_cpu.so has
    ~360 000 relocations); the relocation type is not needed, only the symbol."""
    order = "<" if elf.little_endian else ">"
    table = elf.get_section_index(dynsym.name)
    named: set[int] = set()
    for section in elf.iter_sections():
        kind = section["sh_type"]
        if kind not in ("SHT_RELA", "SHT_REL") or section["sh_link"] != table:
            continue
        word, shift = ("Q", 32) if elf.elfclass == 64 else ("I", 8)
        fmt = order + word * 2 + (word.lower() if kind == "SHT_RELA" else "")
        width = struct.calcsize(fmt)
        data = section.data()
        named.update(entry[1] >> shift for entry in
                     struct.iter_unpack(fmt, data[:len(data) - len(data) % width]))
    named.discard(0)
    return named
