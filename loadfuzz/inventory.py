"""Inventory: what a target ships, read statically from its ELF files (pyelftools only).

For every shared library of a target (see `targets`) this finds, without
loading anything:

- its dynamic section (SONAME, NEEDED, RPATH/RUNPATH) and dynamic symbols
  (`elf.read`);
- its dependency closure, resolved the way the dynamic loader of a trial
  process would (`elf.loader`), with the NEEDED names nobody provides;
- which operator registries it owns or registers into, and the operator names
  it registers (`registries`);
- its role (`ROLES`, a table of rules), and whether it needs libpython.

Everything read is kept in the `LinkMap` inside the `Inventory`, so that
`predict` can replay any load order against the same facts; across commands,
the reader keeps it in the cache folder (`elf.cache`), so a file is parsed
once for as long as it does not change. Registrations of
libraries outside the target (torch's, the system's) are not read: the
target is what is under test.
"""

from __future__ import annotations

import fnmatch
import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from loadfuzz import hostenv
from loadfuzz.elf.cache import ElfCache
from loadfuzz.elf.loader import LinkMap, SearchPath, link_all
from loadfuzz.elf.read import BadElf, ElfFacts, ElfReader
from loadfuzz.model import Role, UsageError
from loadfuzz.registries import EntryPoints, entry_points, registrations

if TYPE_CHECKING:
    from loadfuzz.derived import Consulted

PYTHON_NAMES = ("Py", "_Py")  # what libpython defines: a library that needs them needs Python

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
        return any(hostenv.is_torch_library(name) for name in self.facts.needed)

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
    entries: tuple[EntryPoints, ...] = ()  # its entry points, per registry kind it uses

    @cached_property
    def registered(self) -> Mapping[str, frozenset[str]]:
        """Per registry kind, the operator names it registers, as a set (for lookups)."""
        return {kind: frozenset(names) for kind, names in self.registrations}

    @property
    def reaches_torch(self) -> bool:
        """Whether loading it maps PyTorch's libraries (it or its closure NEEDs them)."""
        return any(hostenv.is_torch_library(dep.name) for dep in self.external)

    def to_json(self) -> dict:
        """The library as `scan --json` lists it."""
        return {
            "id": self.id,
            "path": str(self.path),
            "role": self.role.value,
            "soname": self.soname,
            "needed": list(self.needed),
            "runpath": list(self.runpath),
            "needs_python": self.needs_python,
            "registry_owner": self.registry_owner,
            "registers": list(self.registers),
            "closure": list(self.closure),
            "missing": list(self.missing),
        }


@dataclass(frozen=True)
class Inventory:
    target: str  # the TARGET as given (several: joined by spaces; --env: "--env")
    name: str  # short name for folder names
    version: str | None
    root: Path
    libraries: tuple[Library, ...]  # sorted by id
    warnings: tuple[str, ...]
    link_map: LinkMap = field(compare=False, repr=False, default=LinkMap({}, {}))
    labels: tuple[str, ...] = ()  # with several targets: `<name>-<version>` of each, the ids' prefix

    @property
    def folder_name(self) -> str:
        """The results folder's name for this inventory: `<name>-<version>`, or the labels."""
        if self.labels:
            return self.name
        return f"{self.name}-{self.version or 'unversioned'}"

    def get(self, lib_id: str) -> Library:
        found = self.by_id.get(lib_id)
        if found is None:
            raise UsageError(f"no library {lib_id!r} in {self.target}")
        return found

    @cached_property
    def by_id(self) -> Mapping[str, Library]:
        return {lib.id: lib for lib in self.libraries}

    def select(self, globs: Sequence[str], exclude: Sequence[str] = ()) -> tuple[Library, ...]:
        """The libraries whose id matches any of `globs` (all without any) and none of `exclude`;
        a glob that matches no library is an error, and so is selecting none."""
        for option, patterns in (("--select", globs), ("--exclude", exclude)):
            for pattern in patterns:
                if not any(fnmatch.fnmatchcase(lib.id, pattern) for lib in self.libraries):
                    raise UsageError(f"{option} {pattern!r} matches no library of {self.target}")
        chosen = tuple(lib for lib in self.libraries
                       if (not globs or any(fnmatch.fnmatchcase(lib.id, p) for p in globs))
                       and not any(fnmatch.fnmatchcase(lib.id, p) for p in exclude))
        if not chosen:
            raise UsageError(f"--select and --exclude leave no library of {self.target}")
        return chosen

    def locate(self, lib_id: str) -> Path:
        return self.get(lib_id).path

    @cached_property
    def by_identity(self) -> Mapping[tuple[int, int], Library]:
        """The libraries by the identity of their file (device, inode)."""
        return {self.link_map.files[lib.path].identity: lib for lib in self.libraries}

    @cached_property
    def _lacking(self) -> dict[tuple[int, int], frozenset[str]]:
        return {}

    def lacking(self, obj: ElfFacts) -> frozenset[str]:
        """The strong undefined names of `obj` that no object of its own search list defines
        (libpython's aside: a library that needs them has libpython loaded first): those
        another object must bring into its lookup scope, or RTLD_NOW fails its load. Names
        only: a definition under another symbol version counts. Worked out once an object."""
        if obj.identity not in self._lacking:
            left = {name for name in obj.undefined if not name.startswith(PYTHON_NAMES)}
            for other in self.link_map.search_list(obj)[0]:
                if not left:
                    break
                left -= other.defines
            self._lacking[obj.identity] = frozenset(left)
        return self._lacking[obj.identity]


def load_target(target: str, add: Sequence[Path] = (), reader: ElfReader | None = None,
                consulted: Consulted | None = None) -> Inventory:
    """Inventory a target (a .whl, a directory, an installed distribution, or one .so) plus `add`.

    Raises UsageError on bad input. Files that cannot be read inside a
    folder are skipped with a warning; a single library given on its own
    (the target or an `--add`) must be readable. `reader` reads the files
    (default: one that keeps what it reads in the cache folder, `elf.cache`).
    `consulted` gets every path looked at (see `derived`); with a `reader`,
    it must be the reader's own.
    """
    from loadfuzz import targets  # here: an inventory from the derived cache never needs it

    reader = reader or ElfReader(ElfCache.default(), consulted)
    found = targets.locate(target, reader.consulted)
    return build(target, found.name, found.version, found.root, found.files, add,
                 strict=found.single, reader=reader, warnings=found.notes)


def load_targets(names: Sequence[str], add: Sequence[Path] = (), env: bool = False,
                 reader: ElfReader | None = None, consulted: Consulted | None = None,
                 ) -> Inventory:
    """Inventory one or several targets, or the whole environment (`env`), in one campaign.

    One target keeps its ids (`lib/x.so`). With several, or `env`, a library's id is
    `<name>-<version>/<path in its target>`, and a library of one target that NEEDs another
    target's is resolved as the installed layout resolves it (one link map over all).
    `consulted`: as for `load_target`.
    """
    if len(names) == 1 and not env:
        return load_target(names[0], add, reader, consulted)
    if not names and not env:
        raise UsageError("give a TARGET (one or several), or --env")
    from loadfuzz import targets

    reader = reader or ElfReader(ElfCache.default(), consulted)
    installed, skipped = targets.environment(reader.consulted) if env else ([], [])
    found = [targets.locate(name, reader.consulted) for name in names] + installed
    # A file is the first target's that has it: a target named twice (or by its name and its
    # folder, or by name and by --env) adds nothing, and one target after all keeps its own ids
    kept: list[tuple[int, dict[str, Path]]] = []  # (position in `found`, its files not seen yet)
    seen: set[Path] = set()
    for position, target in enumerate(found):
        new = {lib_id: path for lib_id, path in target.files.items() if path.resolve() not in seen}
        seen |= {path.resolve() for path in new.values()}
        if new:
            kept.append((position, new))
    if len(kept) == 1 and not env:
        return load_target(names[kept[0][0]], add, reader, consulted)
    files: dict[str, Path] = {}
    labels: list[str] = []
    for position, own in kept:
        # two folders of one name (a/libs, b/libs): the second is libs-2, so no id is lost
        label = next(label for label in itertools.chain(
            [found[position].label], (f"{found[position].label}-{n}" for n in itertools.count(2)))
            if label not in labels)
        labels.append(label)
        files |= {f"{label}/{lib_id}": path for lib_id, path in own.items()}
    roots = [str(target.root) for target in found]
    name = "env" if env and not names else "+".join(labels)
    return build(" ".join([*names, *(["--env"] if env else [])]), name, None,
                 Path(os.path.commonpath(roots)) if roots else Path("/"), files, add,
                 strict=False, reader=reader, labels=tuple(labels),
                 warnings=[*skipped, *(note for target in found for note in target.notes)])


def load_libraries(paths: Sequence[Path], reader: ElfReader | None = None) -> Inventory:
    """An inventory of loose libraries, each with its path (as given) for id."""
    files = {str(path): Path(os.path.abspath(path)) for path in paths}
    return build(" ".join(files), "libraries", None, Path.cwd(), files, (), strict=True,
                 reader=reader)


def build(target: str, name: str, version: str | None, root: Path, files: Mapping[str, Path],
          add: Sequence[Path], strict: bool, reader: ElfReader | None = None,
          labels: tuple[str, ...] = (), warnings: Sequence[str] = ()) -> Inventory:
    """The inventory of these files (`warnings`: what reading the targets found already)."""
    reader = reader or ElfReader(ElfCache.default())
    warnings = list(warnings)
    chosen: dict[str, ElfFacts] = {}
    first_name: dict[tuple[int, int], str] = {}  # a file's identity -> its first id
    for lib_id, path in files.items():
        try:
            facts = reader.facts(path)
        except BadElf as exc:
            if strict:
                raise UsageError(str(exc)) from None
            warnings.append(f"skipped {lib_id}: {exc}")
            continue
        if (held := first_name.setdefault(facts.identity, lib_id)) != lib_id:
            # one file under two names (hard links): one library, never paired with itself
            warnings.append(f"skipped {lib_id}: the same file as {held} (a hard link)")
            continue
        chosen[lib_id] = facts
    for position, extra in enumerate(add):
        lib_id = f"extra/{Path(extra).name}"
        if Path(extra).is_dir():
            raise UsageError(f"--add {extra}: a folder, not a library (give a TARGET for a "
                             "folder of libraries)")
        if not Path(extra).is_file():
            raise UsageError(f"--add {extra}: " + ("not a regular file" if Path(extra).exists()
                                                    else "no such file"))
        if lib_id in chosen:
            where = ("another --add" if any(Path(other).name == Path(extra).name
                                            for other in add[:position]) else target)
            raise UsageError(f"--add {extra}: a library with id {lib_id} is already in {where}")
        try:
            facts = reader.facts(Path(extra))
        except BadElf as exc:
            raise UsageError(f"--add {exc}") from None
        held = [held_id for held_id, other in chosen.items() if other.identity == facts.identity]
        if held:  # (else one file under two ids: paired with itself)
            raise UsageError(f"--add {extra}: {target} already holds it, as {held[0]}")
        chosen[lib_id] = facts
    if not chosen:
        why = f" ({len(warnings)} unreadable, e.g. {warnings[0]})" if warnings else ""
        raise UsageError(f"no ELF shared library in {target}{why}")
    link_map = link_all(chosen.values(), reader, SearchPath.for_trials(reader.consulted))
    owners = {facts.identity: lib_id for lib_id, facts in chosen.items()}
    libraries = tuple(describe(lib_id, facts, link_map, owners, reader)
                      for lib_id, facts in sorted(chosen.items()))
    return Inventory(target, name, version, root, libraries, tuple(warnings), link_map, labels)


def describe(lib_id: str, facts: ElfFacts, link_map: LinkMap,
             owners: Mapping[tuple[int, int], str], reader: ElfReader) -> Library:
    order, missing = link_map.search_list(facts)
    deps = order[1:]
    entries = entry_points(facts)
    found = registrations(facts, entries, reader.names)
    wanted_python = {n for obj in order for n in obj.undefined if n.startswith(PYTHON_NAMES)}
    provided = {n for n in wanted_python if any(n in obj.defines for obj in order)}
    ops = sorted({op for _, names in found for op in names})
    return Library(
        id=lib_id,
        path=facts.path,
        role=role_of(Traits(facts, found)),
        soname=facts.soname,
        needed=facts.needed,
        runpath=facts.runpath or facts.rpath,
        needs_python=bool(wanted_python - provided),
        registry_owner=any(e.defined for e in entries),
        registers=tuple(ops),
        registry=next((kind for kind, names in found if names), None),
        closure=tuple(owners[d.identity] for d in deps if d.identity in owners),
        external=tuple(d.path for d in deps if d.identity not in owners),
        missing=tuple(missing),
        registrations=found,
        entries=entries,
    )
