"""Inventory: what a target ships, read statically from its ELF files (pyelftools only).

For every shared library of a target (a wheel, a directory, an installed
distribution, or one `.so`) this finds, without loading anything:

- its dynamic section: SONAME, NEEDED, RPATH/RUNPATH, and its dynamic symbols;
- its dependency closure, resolved the way the dynamic loader of a trial
  process would (see `SearchPath`), with the NEEDED names nobody provides;
- which operator registries it owns or registers into, and the operator names
  it registers (see `REGISTRIES`, a table: one row per kind of registry);
- its role (see `ROLES`, a table of rules), and whether it needs libpython.

Everything read is kept in a `LinkMap` inside the `Inventory`, so that
`predict` can replay any load order against the same facts. Parsed files are
cached in the `ElfReader` made for one call, never in a module global.

Registrations of libraries outside the target (torch's, the system's) are not
read: the target is what is under test.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import importlib.metadata
import os
import posixpath
import re
import shutil
import stat
import struct
import sys
import sysconfig
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from elftools.common.exceptions import ELFError, ELFParseError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from loadfuzz import hostenv
from loadfuzz.model import Role, UsageError

# --- operator registries: one row per kind --------------------------------------


@dataclass(frozen=True)
class RegistryKind:
    """A process-wide operator registry and how a library's use of it shows in its ELF file.

    A library *owns* the registry when it exports an entry point (a dynamic
    symbol whose qualified name matches `entry`); it *registers into* it when
    it imports or defines one. Its registrations are then the operator names
    that `names` (a key of `NAME_READERS`) finds in its read-only data.
    """

    name: str  # "executorch" | "torch": what `Library.registry` says
    title: str  # for explanations
    hint: str  # a substring of every entry point's mangled name (a cheap pre-filter)
    entry: re.Pattern[str]  # on the qualified name, e.g. "executorch::runtime::register_kernels"
    names: str  # how the registered names are left in the file: "kernel-names" | "schemas"
    signature: str  # the classifier signature a double registration produces


REGISTRIES: tuple[RegistryKind, ...] = (
    RegistryKind(
        name="executorch",
        title="the ExecuTorch kernel registry",
        hint="register_kernels",
        # executorch::runtime::register_kernels(Span<const Kernel>); ET_RUNTIME_NAMESPACE may
        # add namespaces (runtime::aten); older releases spelled it torch::executor::.
        entry=re.compile(r"executorch(::\w+)*::register_kernels|torch::executor::register_kernels"),
        names="kernel-names",
        signature="executorch-reregister",
    ),
    RegistryKind(
        name="torch",
        title="the PyTorch dispatcher",
        hint="Library",
        # TORCH_LIBRARY(ns, m) constructs a torch::Library (defined in libtorch_cpu.so);
        # each m.def(schema) in it defines an operator.
        entry=re.compile(r"torch::Library::Library"),
        names="schemas",
        signature="torch-duplicate-op",
    ),
)

REGISTRY_BY_NAME = {kind.name: kind for kind in REGISTRIES}


def qualified_name(symbol: str) -> str | None:
    """The `a::b::c` a mangled nested name spells, or None for anything else.

    `_ZN10executorch7runtime16register_kernelsENS0_...` -> `executorch::runtime::register_kernels`;
    a constructor (`C1`, `C2`) ends in its class name again: `torch::Library::Library`.
    """
    start = re.match(r"_ZN[rVK]*[RO]?", symbol)
    if start is None:
        return None
    pos, parts = start.end(), []
    while pos < len(symbol):
        if symbol[pos].isdigit():
            digits = re.match(r"\d+", symbol[pos:])
            assert digits is not None
            length, pos = int(digits.group()), pos + len(digits.group())
            parts.append(symbol[pos:pos + length])
            pos += length
        elif symbol.startswith("B", pos) and parts:  # an ABI tag (B5cxx11): not part of the name
            tag = re.match(r"B(\d+)", symbol[pos:])
            if tag is None:
                return None
            pos += len(tag.group()) + int(tag.group(1))
        elif symbol[pos] == "C" and symbol[pos + 1:pos + 2] in ("1", "2", "3") and parts:
            parts.append(parts[-1])
            pos += 2
        else:
            break
    if not parts or pos >= len(symbol) or symbol[pos] != "E":
        return None
    return "::".join(parts)


# --- one ELF file -----------------------------------------------------------------


class BadElf(Exception):
    """A file that is not a usable shared library for this machine; the message says why."""


STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
STV_PROTECTED = 3
STT_FUNC = 2
DF_SYMBOLIC = 0x2
# C++ names that are the standard library's, not a library's own API.
STD_PREFIXES = ("_ZSt", "_ZNSt", "_ZNKSt", "_ZN9__gnu_cxx", "_ZNK9__gnu_cxx", "_ZT", "_ZGV")
LOADER_HOOKS = frozenset({"_init", "_fini"})
# Read-only data that never holds string literals.
NOT_STRINGS = (".eh_frame", ".eh_frame_hdr", ".gcc_except_table", ".interp", ".note")


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
    exports_api: bool = False  # a global function (C or C++) outside the C++ standard library
    # per registry kind: (kind, defined entry points, imported entry points), kinds it uses only
    entries: tuple[tuple[str, frozenset[str], frozenset[str]], ...] = ()

    def binds_to_itself(self, symbol: str) -> bool:
        return symbol in self.defines and (self.symbolic or symbol in self.protected)

    def entry_points(self, kind: str) -> tuple[frozenset[str], frozenset[str]]:
        """(defined, imported) entry-point symbols of a registry kind."""
        return next(((d, i) for name, d, i in self.entries if name == kind),
                    (frozenset(), frozenset()))


def entry_symbols(kind: RegistryKind, names: Iterable[str]) -> frozenset[str]:
    return frozenset(name for name in names if kind.hint in name
                     and kind.entry.fullmatch(qualified_name(name) or ""))


def host_machine() -> Machine:
    """The ELF class and machine of the interpreter running loadfuzz: what trials can load."""
    with open(os.path.realpath(sys.executable), "rb") as stream:
        elf = ELFFile(stream)
        return Machine(elf.elfclass, elf.little_endian, elf["e_machine"])


class ElfReader:
    """Reads ELF files once each; one reader per inventory (its caches die with it)."""

    def __init__(self) -> None:
        self.host = host_machine()
        self._facts: dict[Path, ElfFacts | BadElf] = {}
        self._strings: dict[Path, tuple[tuple[int, bytes], ...]] = {}

    def facts(self, path: Path) -> ElfFacts:
        """The facts of `path`; raises BadElf with the reason when it is unusable."""
        path = Path(os.path.abspath(path))
        if path not in self._facts:
            try:
                self._facts[path] = read_facts(path, self.host)
            except BadElf as exc:
                self._facts[path] = exc
        found = self._facts[path]
        if isinstance(found, BadElf):
            raise found
        return found

    def matches(self, path: Path) -> bool:
        """Whether the loader would take this file (an ELF of the host's class and machine)."""
        try:
            self.facts(path)
        except BadElf:
            return False
        return True

    def registrations(self, facts: ElfFacts) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(registry kind, operator names in registration order) for each registry it uses."""
        found = []
        for kind in REGISTRIES:
            if kind.name in (name for name, _, _ in facts.entries):
                with open(facts.path, "rb") as stream:
                    ops = NAME_READERS[kind.names](ELFFile(stream), stream)
                found.append((kind.name, ops))
        return tuple(found)


def read_facts(path: Path, host: Machine) -> ElfFacts:
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
    def split(name, attr):
        return (tuple(
            part for tag in tags.get(name, ()) for part in getattr(tag, attr).split(":") if part))
    flags = sum(tag.entry.d_val for tag in tags.get("DT_FLAGS", ()))
    symbols = dynamic_symbols(elf, dynsym)
    defines = frozenset(s.name for s in symbols if s.exported)
    undefined = frozenset(s.name for s in symbols if s.undefined and s.bind == STB_GLOBAL)
    entries = tuple((kind.name, d, i) for kind in REGISTRIES
                    if (d := entry_symbols(kind, defines)) | (i := entry_symbols(kind, undefined)))
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
        exports_api=any(s.exported and s.bind == STB_GLOBAL and s.kind == STT_FUNC
                        and not s.name.startswith(STD_PREFIXES) and s.name not in LOADER_HOOKS
                        for s in symbols),
        entries=entries,
    )


@dataclass(frozen=True)
class Symbol:
    name: str
    bind: int
    kind: int
    visibility: int
    undefined: bool

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
    for entry in struct.iter_unpack(fmt, data[:len(data) - len(data) % width]):
        offset = entry[name_at]
        if offset == 0:
            continue
        end = strtab.find(b"\0", offset)
        name = strtab[offset:end if end >= 0 else len(strtab)].decode("utf-8", "replace")
        info = entry[info_at]
        symbols.append(Symbol(name, info >> 4, info & 0xF, entry[other_at] & 0x3,
                              entry[shndx_at] == 0))
    return symbols


# --- operator names a library registers --------------------------------------------

IDENT = rb"[A-Za-z_][A-Za-z0-9_]*"
NAMESPACE = rb"[a-z_][a-z0-9_]*"
# A string starts after a byte that is not printable (NUL, or the end of a binary constant
# the linker put right before it) and ends at a NUL.
START = rb"(?<![\x20-\x7e])"
OP_NAME = re.compile(rb"(" + NAMESPACE + rb")::(" + IDENT + rb")(?:\.(" + IDENT + rb"))?")
OP_STRING = re.compile(START + rb"(" + NAMESPACE + rb")::(" + IDENT + rb")(?:\.(" + IDENT + rb"))?"
                       rb"(?=\x00)")
SCHEMA = re.compile(START + rb"(?:(" + NAMESPACE + rb")::)?(" + IDENT + rb")(?:\.(" + IDENT + rb"))?"
                    rb"\([\x20-\x7e]*\) -> [\x20-\x7e]+(?=\x00)")
WORD = re.compile(START + rb"(" + NAMESPACE + rb")(?=\x00)")


def read_only_data(elf: ELFFile) -> list[tuple[int, bytes]]:
    """(address, bytes) of each section of read-only data that can hold string literals."""
    found = []
    for section in elf.iter_sections():
        flags = section["sh_flags"]
        if (section["sh_type"] == "SHT_PROGBITS" and flags & 0x2 and not flags & 0x1
                and not flags & 0x4 and not section.name.startswith(NOT_STRINGS)):
            found.append((section["sh_addr"], section.data()))
    return found


def string_at(regions: Sequence[tuple[int, bytes]], address: int) -> bytes | None:
    for start, data in regions:
        if start <= address < start + len(data):
            end = data.find(b"\0", address - start, address - start + 512)
            return data[address - start:end] if end >= 0 else None
    return None


def referenced_strings(elf: ELFFile, regions: Sequence[tuple[int, bytes]]) -> list[bytes]:
    """Strings that relocated data points at, in the order of the pointers (table order).

    A static `Kernel` table is an array of {name, key, function}: in a shared
    library every name pointer is a relative relocation whose addend is the
    address of the name.
    """
    order = "<" if elf.little_endian else ">"
    fmt = order + ("QQq" if elf.elfclass == 64 else "IIi")
    width = struct.calcsize(fmt)
    low = min((start for start, _ in regions), default=0)
    high = max((start + len(data) for start, data in regions), default=0)
    pointers = []
    for section in elf.iter_sections():
        if section["sh_type"] != "SHT_RELA":
            continue
        data = section.data()
        for offset, _info, addend in struct.iter_unpack(fmt, data[:len(data) - len(data) % width]):
            if low <= addend < high:
                pointers.append((offset, addend))
    pointers.sort()
    return [text for _, address in pointers if (text := string_at(regions, address)) is not None]


def kernel_names(elf: ELFFile, _stream) -> tuple[str, ...]:
    """The `ns::op.overload` names of the ExecuTorch kernels a library registers.

    Kernel tables (pointers to the names in relocated data) come first, in
    table order. A library without one builds its kernels in code (EXECUTORCH_LIBRARY), and
    then every whole `ns::op.overload` string counts; a name without an
    overload counts only when its namespace also has a name with one (which
    keeps out C++ messages such as `vector::reserve`), and a name that is
    another one with an identifier glued on (`native_call_llama::x.out`) does not.
    """
    regions = read_only_data(elf)
    table = [text.decode() for text in referenced_strings(elf, regions) if OP_NAME.fullmatch(text)]
    loose = op_strings(regions)
    if not table:
        return loose
    # Kernels registered in code beside the table (embedding_xbit in the quantized kernels)
    # leave loose strings in the table's namespaces.
    namespaces = {name.split("::")[0] for name in table}
    return tuple(dict.fromkeys(table + [n for n in loose if n.split("::")[0] in namespaces]))


def op_strings(regions: Sequence[tuple[int, bytes]]) -> tuple[str, ...]:
    found = [m for _, data in regions for m in OP_STRING.finditer(data)]
    namespaces = {m[1] for m in found if m[3]}
    names = [m[0].decode() for m in found if m[3] or m[1] in namespaces]
    unique = set(names)
    derived = {name for name in unique for other in unique
               if name != other and name.endswith("_" + other)}
    return tuple(dict.fromkeys(name for name in names if name not in derived))


def schema_names(elf: ELFFile, _stream) -> tuple[str, ...]:
    """The `ns::op.overload` names of the operators a library defines in the PyTorch dispatcher.

    `m.def("add.out(Tensor a, ...) -> Tensor(a!)")` inside `TORCH_LIBRARY(ns, m)`
    leaves the schema string and, once, the namespace string, not joined. The
    namespace of a schema is the one it spells, else the one a string
    `ns::op.overload` of the same operator in the library spells (its
    ExecuTorch twin), else that of the nearest schema that has one, else the
    nearest namespace-looking word. This is a heuristic; a schema that code
    builds piecewise (not one string literal) is not seen.
    """
    regions = read_only_data(elf)
    schemas = [(start + m.start(), m) for start, data in regions for m in SCHEMA.finditer(data)]
    if not schemas:
        return ()
    twins: dict[bytes, set[bytes]] = {}
    for _, data in regions:
        for m in OP_STRING.finditer(data):
            twins.setdefault(m[2] + b"." + (m[3] or b""), set()).add(m[1])
            twins.setdefault(m[2], set()).add(m[1])
    known: dict[int, bytes] = {}
    for address, m in schemas:
        spelled = {m[1]} if m[1] else twins.get(m[2] + b"." + (m[3] or b""), twins.get(m[2], set()))
        if len(spelled) == 1:
            known[address] = next(iter(spelled))
    schema_words = {m[2] for _, m in schemas}
    words = [(start + w.start(), w[1]) for start, data in regions for w in WORD.finditer(data)
             if w[1] not in schema_words]
    prefixed = {w for _, w in words if any(w in spelled for spelled in twins.values())}
    words = [(a, w) for a, w in words if w in prefixed] or words

    def namespace(address: int) -> bytes:
        if address in known:
            return known[address]
        pool = list(known.items()) or words
        return min(pool, key=lambda item: abs(item[0] - address))[1] if pool else b""

    names = []
    for address, m in schemas:
        ns = namespace(address)
        names.append((ns + b"::" if ns else b"") + m[2] + (b"." + m[3] if m[3] else b""))
    return tuple(dict.fromkeys(name.decode() for name in names))


NAME_READERS: Mapping[str, Callable[[ELFFile, object], tuple[str, ...]]] = {
    "kernel-names": kernel_names,
    "schemas": schema_names,
}


# --- where the loader finds a NEEDED name -------------------------------------------


def ld_so_conf(path: Path = Path("/etc/ld.so.conf"), seen: set[Path] | None = None) -> list[Path]:
    """The folders /etc/ld.so.conf lists, following `include` lines, in order."""
    seen = set() if seen is None else seen
    if path in seen or not path.is_file():
        return []
    seen.add(path)
    folders: list[Path] = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("include"):
            pattern = line.split(None, 1)[1] if " " in line or "\t" in line else ""
            pattern = pattern if pattern.startswith("/") else str(path.parent / pattern)
            for included in sorted(glob.glob(pattern)):
                folders += ld_so_conf(Path(included), seen)
        elif line and not line.startswith("hwcap"):
            folders.append(Path(line))
    return folders


def system_folders() -> tuple[Path, ...]:
    """What the loader searches after a library's own paths: ld.so.conf, then the defaults."""
    triplet = sysconfig.get_config_var("MULTIARCH") or ""
    defaults = [Path("/lib") / triplet, Path("/usr/lib") / triplet] if triplet else []
    defaults += [Path("/lib64"), Path("/usr/lib64"), Path("/lib"), Path("/usr/lib")]
    return tuple(dict.fromkeys(ld_so_conf() + defaults))


@dataclass(frozen=True)
class SearchPath:
    """The loader's search order for a trial process.

    DT_RPATH (only when there is no DT_RUNPATH), then LD_LIBRARY_PATH, which
    loadfuzz sets to torch's lib folder and nothing else (the user's is not
    inherited), then DT_RUNPATH, then the ld.so.conf folders and the system
    defaults. `$ORIGIN` is the folder the library was found in.
    """

    library_path: tuple[Path, ...]
    system: tuple[Path, ...]

    @classmethod
    def for_trials(cls) -> SearchPath:
        torch_lib = hostenv.torch_lib_dir()
        return cls((torch_lib,) if torch_lib else (), system_folders())

    def folders(self, requester: ElfFacts) -> Iterator[Path]:
        origin = str(requester.path.parent)
        def expand(entries):
            return (
                    Path(e.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)) for e in entries)
        if not requester.runpath:
            yield from expand(requester.rpath)
        yield from self.library_path
        yield from expand(requester.runpath)
        yield from self.system

    def find(self, requester: ElfFacts, name: str, reader: ElfReader) -> Path | None:
        if "/" in name:
            candidate = Path(os.path.abspath(requester.path.parent / name))
            return candidate if reader.matches(candidate) else None
        for folder in self.folders(requester):
            candidate = Path(os.path.normpath(folder / name))
            if candidate.is_file() and reader.matches(candidate):
                return candidate
        return None


@dataclass(frozen=True)
class LinkMap:
    """Every ELF file a target reaches and where each NEEDED name of each leads: read-only.

    `search_list` is the loader's breadth-first walk, shared by the clean
    closures here and by `predict`'s replays of load orders.
    """

    files: Mapping[Path, ElfFacts]
    links: Mapping[tuple[Path, str], Path | None]  # (requester, NEEDED name) -> file

    def search_list(self, root: ElfFacts, loaded: Mapping[str, ElfFacts] | None = None,
                    ) -> tuple[list[ElfFacts], list[str]]:
        """The root and its dependencies in load order, and the NEEDED names nobody provides.

        `loaded` maps names (SONAMEs, and names objects were loaded under) to
        objects already in the process: a NEEDED name they answer is theirs,
        as ld.so shares a loaded library by name before searching the disk.
        """
        by_name = dict(loaded or {})
        by_identity = {obj.identity: obj for obj in by_name.values()}
        order, missing = [by_identity.get(root.identity, root)], []
        by_identity[root.identity] = order[0]
        if root.soname:
            by_name.setdefault(root.soname, order[0])
        position = 0
        while position < len(order):
            obj = order[position]
            position += 1
            for name in obj.needed:
                dep = by_name.get(name)
                if dep is None:
                    path = self.links.get((obj.path, name))
                    if path is None:
                        missing.append(name)
                        continue
                    dep = by_identity.setdefault(self.files[path].identity, self.files[path])
                    by_name[name] = dep
                    if dep.soname:
                        by_name.setdefault(dep.soname, dep)
                if all(dep.identity != seen.identity for seen in order):
                    order.append(dep)
        return order, list(dict.fromkeys(missing))


def link_all(roots: Iterable[ElfFacts], reader: ElfReader, search: SearchPath) -> LinkMap:
    """Resolve every NEEDED name reachable from the roots, reading each file reached."""
    files = {root.path: root for root in roots}
    links: dict[tuple[Path, str], Path | None] = {}
    pending = list(files.values())
    while pending:
        obj = pending.pop()
        for name in obj.needed:
            if (obj.path, name) in links:
                continue
            path = search.find(obj, name, reader)
            links[(obj.path, name)] = path
            if path is not None and path not in files:
                files[path] = reader.facts(path)
                pending.append(files[path])
    return LinkMap(files, links)


# --- roles: the first rule that holds -----------------------------------------------


@dataclass(frozen=True)
class Traits:
    """What the role rules look at."""

    facts: ElfFacts
    registrations: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def python_module(self) -> bool:
        return any(name.startswith("PyInit_") for name in self.facts.defines)

    @property
    def links_torch(self) -> bool:
        return any(re.fullmatch(r"lib(torch\w*|c10)\.so(\.\d+)*", n) for n in self.facts.needed)

    @property
    def registers_into_torch(self) -> bool:
        return any(kind == "torch" for kind, _ in self.registrations)


ROLES: tuple[tuple[Role, str, Callable[[Traits], bool]], ...] = (
    (Role.PYTHON_EXTENSION, "defines PyInit_<module>", lambda t: t.python_module),
    (Role.EXPORT_PLUGIN, "NEEDs libtorch*/libc10 and registers operators into the PyTorch "
     "dispatcher", lambda t: t.links_torch and t.registers_into_torch),
    (Role.RUNTIME, "has a SONAME (others can NEED it) and exports functions of its own",
     lambda t: t.facts.soname is not None and t.facts.exports_api),
    (Role.OTHER, "none of the above", lambda t: True),
)


def role_of(traits: Traits) -> Role:
    return next(role for role, _, holds in ROLES if holds(traits))


# --- the inventory ------------------------------------------------------------------


@dataclass(frozen=True)
class Library:
    id: str
    path: Path
    role: Role
    soname: str | None
    needed: tuple[str, ...]
    runpath: tuple[str, ...]
    needs_python: bool  # it or its closure has undefined Py*/_Py* symbols the closure lacks
    registry_owner: bool  # exports an operator registry's entry point
    registers: tuple[str, ...]  # operator names it registers itself (sorted)
    registry: str | None  # where its registrations go ("executorch" | "torch"); the first
    #                      kind of REGISTRIES when it registers into several (see registrations)
    closure: tuple[str, ...]  # ids (target libraries) of its dependency closure, load order
    external: tuple[Path, ...]  # dependency files outside the target, load order
    missing: tuple[str, ...]  # NEEDED names (its own or its closure's) nobody provides
    # (kind, operator names in registration order) per registry it registers into
    registrations: tuple[tuple[str, tuple[str, ...]], ...] = ()
    unresolved: tuple[str, ...] = ()  # strong undefined symbols (not Py*) its closure lacks

    def registers_into(self, kind: str) -> tuple[str, ...]:
        """The operator names it registers into one registry kind, in registration order."""
        return next((ops for name, ops in self.registrations if name == kind), ())


@dataclass(frozen=True)
class Inventory:
    target: str  # the TARGET as given
    name: str  # short name for folder names
    version: str | None
    root: Path
    libraries: tuple[Library, ...]  # sorted by id
    warnings: tuple[str, ...]
    link_map: LinkMap = field(compare=False, repr=False, default=LinkMap({}, {}))

    def get(self, lib_id: str) -> Library:
        for lib in self.libraries:
            if lib.id == lib_id:
                return lib
        raise UsageError(f"no library {lib_id!r} in {self.target}")

    def select(self, globs: Sequence[str]) -> tuple[Library, ...]:
        """The libraries whose id matches any glob; all without globs; a glob matching none is an error."""
        if not globs:
            return self.libraries
        for pattern in globs:
            if not any(fnmatch.fnmatchcase(lib.id, pattern) for lib in self.libraries):
                raise UsageError(f"--select {pattern!r} matches no library of {self.target}")
        return tuple(lib for lib in self.libraries
                     if any(fnmatch.fnmatchcase(lib.id, pattern) for pattern in globs))

    def locate(self, lib_id: str) -> Path:
        return self.get(lib_id).path

    def by_identity(self) -> dict[tuple[int, int], Library]:
        return {self.link_map.files[lib.path].identity: lib for lib in self.libraries}


SO_FILE = re.compile(r".+\.so(\.\d+)*")


def cache_folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "loadfuzz"


def load_target(target: str, add: Sequence[Path] = ()) -> Inventory:
    """Inventory a target (a .whl, a directory, an installed distribution, or one .so) plus `add`.

    Raises UsageError on bad input. Files that cannot be read inside a
    folder are skipped with a warning; a single library given on its own
    (the target or an `--add`) must be readable.
    """
    path = Path(target)
    if path.is_dir():
        root, name, version = path.absolute(), path.absolute().name, None
        candidates = [p for p in walk_libraries(root)]
    elif path.is_file() and path.suffix == ".whl":
        root, name, version = unpack_wheel(path)
        candidates = list(walk_libraries(root))
    elif path.is_file():
        root, name, version = path.absolute().parent, path.name.split(".")[0], None
        candidates = [path.absolute()]
    elif "/" in target or target.endswith((".whl", ".so")):
        raise UsageError(f"no such file or directory: {target}")
    else:
        root, name, version, candidates = installed_distribution(target)
    files = {posixpath.join(*p.relative_to(root).parts): p for p in candidates}
    single = path.is_file() and path.suffix != ".whl"
    return build(target, name, version, root, files, add, strict=single)


def load_libraries(paths: Sequence[Path]) -> Inventory:
    """An inventory of loose libraries, each with its path (as given) for id."""
    files = {str(path): Path(os.path.abspath(path)) for path in paths}
    return build(" ".join(files), "libraries", None, Path.cwd(), files, (), strict=True)


def walk_libraries(root: Path) -> Iterator[Path]:
    """The shared-library files under a folder (symlinks are not followed nor listed)."""
    for folder, subfolders, names in os.walk(root):
        subfolders.sort()
        for name in sorted(names):
            candidate = Path(folder) / name
            if SO_FILE.fullmatch(name) and not candidate.is_symlink() and candidate.is_file():
                yield candidate


def build(target: str, name: str, version: str | None, root: Path, files: Mapping[str, Path],
          add: Sequence[Path], strict: bool) -> Inventory:
    reader, warnings = ElfReader(), []
    chosen: dict[str, ElfFacts] = {}
    for lib_id, path in files.items():
        try:
            chosen[lib_id] = reader.facts(path)
        except BadElf as exc:
            if strict:
                raise UsageError(str(exc)) from None
            warnings.append(f"skipped {lib_id}: {exc}")
    for extra in add:
        lib_id = f"extra/{Path(extra).name}"
        if not Path(extra).is_file():
            raise UsageError(f"--add {extra}: no such file")
        if lib_id in chosen:
            raise UsageError(f"--add {extra}: a library with id {lib_id} is already in {target}")
        try:
            chosen[lib_id] = reader.facts(Path(extra))
        except BadElf as exc:
            raise UsageError(f"--add {exc}") from None
    if not chosen:
        why = f" ({len(warnings)} unreadable, e.g. {warnings[0]})" if warnings else ""
        raise UsageError(f"no ELF shared library in {target}{why}")
    link_map = link_all(chosen.values(), reader, SearchPath.for_trials())
    owners = {facts.identity: lib_id for lib_id, facts in chosen.items()}
    libraries = tuple(describe(lib_id, facts, link_map, owners, reader)
                      for lib_id, facts in sorted(chosen.items()))
    return Inventory(target, name, version, root, libraries, tuple(warnings), link_map)


def describe(lib_id: str, facts: ElfFacts, link_map: LinkMap, owners: Mapping[tuple[int, int], str],
             reader: ElfReader) -> Library:
    order, missing = link_map.search_list(facts)
    deps = order[1:]
    registrations = reader.registrations(facts)
    wanted_python = {n for obj in order for n in obj.undefined if n.startswith(("Py", "_Py"))}
    everything_undefined = {n for obj in order for n in obj.undefined}
    provided = {n for n in everything_undefined if any(n in obj.defines for obj in order)}
    unresolved = sorted(everything_undefined - provided - wanted_python)
    ops = sorted({op for _, names in registrations for op in names})
    return Library(
        id=lib_id,
        path=facts.path,
        role=role_of(Traits(facts, registrations)),
        soname=facts.soname,
        needed=facts.needed,
        runpath=facts.runpath or facts.rpath,
        needs_python=bool(wanted_python - provided),
        registry_owner=any(defined for _, defined, _ in facts.entries),
        registers=tuple(ops),
        registry=next((kind for kind, names in registrations if names), None),
        closure=tuple(owners[d.identity] for d in deps if d.identity in owners),
        external=tuple(d.path for d in deps if d.identity not in owners),
        missing=tuple(missing),
        registrations=registrations,
        unresolved=tuple(unresolved) if not missing else (),
    )


# --- targets: installed distributions and wheels ----------------------------------------


def package_root(base: Path, top_level: set[str]) -> Path:
    """The single top-level package folder, or `base` when there are several (or loose files)."""
    folders = [name for name in top_level if (base / name).is_dir()]
    return base / folders[0] if len(top_level) == 1 and folders else base


def installed_distribution(name: str) -> tuple[Path, str, str | None, list[Path]]:
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise UsageError(f"no such file, directory or installed distribution: {name}") from None
    records = [PurePosixPath(str(entry)) for entry in dist.files or ()]
    records = [r for r in records if r.parts and ".." not in r.parts]
    base = Path(dist.locate_file(""))
    top_level = {r.parts[0] for r in records if not r.parts[0].endswith((".dist-info", ".data"))}
    root = package_root(base, top_level)
    candidates = [Path(dist.locate_file(str(r))) for r in records if SO_FILE.fullmatch(r.name)]
    candidates = sorted(p for p in candidates if p.is_file() and not p.is_symlink()
                        and p.is_relative_to(root))
    if not candidates:
        raise UsageError(f"no ELF shared library in the installed distribution {name}")
    return root, dist.metadata["Name"] or name, dist.version, candidates


def unpack_wheel(wheel: Path) -> tuple[Path, str, str | None]:
    """Unpack a wheel (once) into the cache folder named by its SHA-256; (root, name, version)."""
    digest = hashlib.sha256()
    with open(wheel, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    wheels = cache_folder() / "wheels"
    final = wheels / digest.hexdigest()
    if not final.is_dir():
        wheels.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=wheels))
        try:
            extract_safely(wheel, scratch)
            try:
                os.rename(scratch, final)
            except OSError:
                if not final.is_dir():  # not a concurrent unpack of the same wheel that won
                    raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    info = sorted(p.name for p in final.iterdir() if p.name.endswith(".dist-info"))
    if not info:
        raise UsageError(f"{wheel}: not a wheel (no .dist-info folder inside)")
    name, _, version = info[0].removesuffix(".dist-info").partition("-")
    top_level = {p.name for p in final.iterdir() if not p.name.endswith((".dist-info", ".data"))}
    return package_root(final, top_level), name, version or None


def extract_safely(wheel: Path, into: Path) -> None:
    """Extract every entry under `into`; any entry that would land outside it is an error."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            for entry in archive.infolist():
                destination = entry_destination(wheel, entry.filename, into)
                mode = entry.external_attr >> 16
                if stat.S_ISLNK(mode):
                    link = archive.read(entry).decode("utf-8", "replace")
                    inside = posixpath.normpath(posixpath.join(posixpath.dirname(entry.filename),
                                                               link))
                    if link.startswith("/") or inside == ".." or inside.startswith("../"):
                        raise UsageError(f"{wheel}: entry {entry.filename!r} is a symlink to "
                                         f"{link!r}, outside the wheel")
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    os.symlink(link, destination)
                elif entry.is_dir():
                    destination.mkdir(parents=True, exist_ok=True)
                else:
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(entry) as source, open(destination, "wb") as sink:
                        shutil.copyfileobj(source, sink)
                    if mode & 0o777:
                        destination.chmod(mode & 0o777)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
        raise UsageError(f"corrupt wheel {wheel}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot unpack {wheel}: {exc}") from None


def entry_destination(wheel: Path, name: str, into: Path) -> Path:
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if (name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name) or ".." in parts
            or not parts):
        raise UsageError(f"{wheel}: unsafe entry {name!r} (absolute, or climbing out with ..)")
    destination = into.joinpath(*parts)
    if not destination.resolve().is_relative_to(into.resolve()):
        raise UsageError(f"{wheel}: entry {name!r} would land outside the wheel (through a symlink)")
    return destination
