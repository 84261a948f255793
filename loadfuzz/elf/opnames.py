"""Operator names a library registers, read from its read-only data (pyelftools only).

Two ways a registration leaves its names in a file, one reader each
(`NAME_READERS`, keyed by the reader name a registry kind gives):

- `kernel-names`: ExecuTorch kernel tables, arrays of {name, ...} whose name
  pointers are relocations into read-only data (else loose `ns::op.overload`
  strings, for kernels registered in code);
- `schemas`: PyTorch `m.def("op.overload(...) -> ...")` schema strings, with
  the namespace worked out from nearby strings.

These are heuristics on string literals; `registries.py` decides whose.
`carries_string` and `carries_op` ask the plainer question of a whole file
(does it hold this name at all?), for `explain` and `repro`.
"""

from __future__ import annotations

import bisect
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a file is read (see `read`)
    from elftools.elf.elffile import ELFFile

# Read-only data that never holds string literals.
NOT_STRINGS = (".eh_frame", ".eh_frame_hdr", ".gcc_except_table", ".interp", ".note")

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


def kernel_names(elf: ELFFile) -> tuple[str, ...]:
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


def schema_names(elf: ELFFile) -> tuple[str, ...]:
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
    spelled_anywhere = set().union(*twins.values())
    words = [(a, w) for a, w in words if w in spelled_anywhere] or words
    nearest = Nearest.of(list(known.items()) or words)
    names = []
    for address, m in schemas:
        ns = known[address] if address in known else nearest.at(address)
        names.append((ns + b"::" if ns else b"") + m[2] + (b"." + m[3] if m[3] else b""))
    return tuple(dict.fromkeys(name.decode() for name in names))


@dataclass(frozen=True)
class Nearest:
    """The value nearest an address among (address, value) items; the earlier item on a tie.

    What `min(items, key=distance)` answers, by bisection: `schema_names` asks it
    once per schema, and libtorch_cpu.so has thousands of both.
    """

    addresses: tuple[int, ...]  # sorted, each once
    ranked: tuple[tuple[int, bytes], ...]  # (position in the items, value), per address

    @classmethod
    def of(cls, items: Sequence[tuple[int, bytes]]) -> Nearest:
        first: dict[int, tuple[int, bytes]] = {}
        for position, (address, value) in enumerate(items):
            first.setdefault(address, (position, value))
        addresses = tuple(sorted(first))
        return cls(addresses, tuple(first[a] for a in addresses))

    def at(self, address: int) -> bytes:
        at = bisect.bisect_left(self.addresses, address)
        around = [i for i in (at - 1, at) if 0 <= i < len(self.addresses)]
        if not around:
            return b""
        best = min(around, key=lambda i: (abs(self.addresses[i] - address), self.ranked[i][0]))
        return self.ranked[best][1]


NAME_READERS: Mapping[str, Callable[[ELFFile], tuple[str, ...]]] = {
    "kernel-names": kernel_names,
    "schemas": schema_names,
}


def read_names(path: Path, reader: str) -> tuple[str, ...]:
    """The operator names the reader `reader` (a key of NAME_READERS) finds in the file."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as stream:
        return NAME_READERS[reader](ELFFile(stream))


def carries_string(path: str | Path, text: str) -> bool:
    """Whether the file holds `text` as a C string of its own (NUL on both sides)."""
    needle = b"\0" + text.encode() + b"\0"
    return needle in found_in(path, [needle])


def carries_op(path: str | Path, op: str) -> bool:
    """Whether the file holds the operator `ns::name[.overload]`: whole, or as PyTorch's
    TORCH_LIBRARY(ns, m) { m.def("name(...) -> ...") } keeps it, the namespace and the schema
    two strings of their own (a C string `ns`, and one that begins `name(`)."""
    namespace, _, name = op.partition("::")
    whole, own_namespace, schema = (op.encode(), b"\0" + namespace.encode() + b"\0",
                                    b"\0" + name.encode() + b"(")
    found = found_in(path, [whole, own_namespace, schema] if name else [whole])
    return whole in found or {own_namespace, schema} <= found


def found_in(path: str | Path, needles: Sequence[bytes], chunk: int = 1 << 22) -> set[bytes]:
    """Which of the byte strings the file holds. Read a chunk at a time (never the whole file:
    libtorch_cpu.so is 430 MB), not mapped: a file rewritten in place while it is searched
    would end the process (SIGBUS). An unreadable file holds none."""
    found: set[bytes] = set()
    keep = max(map(len, needles), default=1) - 1  # what a needle across two chunks needs
    tail = b""
    try:
        with open(path, "rb") as stream:
            while len(found) < len(needles) and (block := stream.read(chunk)):
                window = tail + block
                found.update(needle for needle in needles if needle in window)
                tail = window[-keep:] if keep else b""
    except OSError:
        pass
    return found
