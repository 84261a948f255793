"""The operator registries loadfuzz knows, and how a library's use of each shows in its ELF file.

One row per kind of process-wide registry (`REGISTRIES`): the entry point a
library that *owns* it exports, how the names it registers are left in the
file, and the signature of the classifier's catalogue that a double
registration into it produces. That last link is checked when this module
is imported: a row naming a signature `signatures.toml` lacks is an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from loadfuzz.classify import load_catalogue
from loadfuzz.elf.opnames import NAME_READERS, read_names
from loadfuzz.elf.read import ElfFacts


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
    names: str  # how the registered names are left in the file: a key of opnames.NAME_READERS
    signature: str  # the classifier signature a double registration produces
    # The owner defines its own operators once and for all: another library that spells one
    # of them only mentions it (an impl, a Python binding), since a second definition would
    # abort every process that loads the owner. Not so for ExecuTorch, whose owner library
    # registers kernels that a plugin may really register again.
    owner_names_are_mentions: bool = False
    # How far a predicted double registration can be trusted: "high" when the names read are
    # the registrations themselves (ExecuTorch's kernel tables), "medium" when a name read may
    # still be a mention (a schema string beside an impl for another dispatch key).
    confidence: str = "high"


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
        owner_names_are_mentions=True,
        confidence="medium",
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


def entry_symbols(kind: RegistryKind, names: Iterable[str]) -> frozenset[str]:
    """The symbols among `names` that are an entry point of this kind of registry."""
    hinted = [name for name in names if kind.hint in name]  # libtorch_cpu.so has 75 000 names
    return frozenset(name for name in hinted if kind.entry.fullmatch(qualified_name(name) or ""))


@dataclass(frozen=True)
class EntryPoints:
    """A library's entry points into one kind of registry."""

    kind: str
    defined: frozenset[str]  # it owns a copy of the registry
    imported: frozenset[str]  # it calls into a copy someone else owns

    @property
    def symbol(self) -> str:
        """The entry point its registrations call (the first, by name)."""
        return min(self.defined | self.imported)


def entry_points(facts: ElfFacts) -> tuple[EntryPoints, ...]:
    """Per registry kind the library uses, its defined and imported entry points."""
    found = []
    for kind in REGISTRIES:
        defined, imported = entry_symbols(kind, facts.defines), entry_symbols(kind, facts.undefined)
        if defined or imported:
            found.append(EntryPoints(kind.name, defined, imported))
    return tuple(found)


def registrations(facts: ElfFacts, entries: Iterable[EntryPoints],
                  names: Callable[[Path, str], tuple[str, ...]] = read_names,
                  ) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(registry kind, operator names in registration order) for each registry it uses.

    `names(path, reader)` reads them (`opnames.read_names`, or an `ElfReader`'s
    `names`, which keeps them).
    """
    return tuple((e.kind, names(facts.path, REGISTRY_BY_NAME[e.kind].names)) for e in entries)


def check_against_catalogue() -> None:
    """Every kind's signature is in the catalogue and every reader exists: else this is a bug."""
    names = {signature.name for signature in load_catalogue()}
    for kind in REGISTRIES:
        if kind.signature not in names:
            raise RuntimeError(f"registry {kind.name!r} names signature {kind.signature!r}, "
                               "which signatures.toml does not have")
        if kind.names not in NAME_READERS:
            raise RuntimeError(f"registry {kind.name!r} names an unknown reader {kind.names!r}")


check_against_catalogue()
