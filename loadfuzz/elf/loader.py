"""Where the dynamic loader finds each NEEDED name, and in which order it loads a closure.

`SearchPath` is ld.so's search order for a trial process (DT_RPATH,
LD_LIBRARY_PATH, DT_RUNPATH, ld.so.conf, the defaults; `$ORIGIN`
expanded); `LinkMap` holds every file a set of roots reaches and where each
NEEDED name leads, and `search_list` walks it breadth-first as ld.so does.
Read-only once built, so `predict` can replay any load order against it.
"""

from __future__ import annotations

import glob
import os
import sysconfig
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from loadfuzz import hostenv
from loadfuzz.elf.read import ElfFacts, ElfReader

if TYPE_CHECKING:
    from loadfuzz.derived import Consulted


def ld_so_conf(path: Path = Path("/etc/ld.so.conf"), seen: set[Path] | None = None) -> list[Path]:
    """The folders /etc/ld.so.conf lists, following `include` lines, in order. `seen` gets
    every path looked at: the files, and the folders their `include` patterns search."""
    seen = set() if seen is None else seen
    if path in seen or not path.is_file():
        seen.add(path)
        return []
    seen.add(path)
    folders: list[Path] = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("include"):
            pattern = line.split(None, 1)[1] if " " in line or "\t" in line else ""
            pattern = pattern if pattern.startswith("/") else str(path.parent / pattern)
            # the folders the pattern lists, and where a wildcard in a folder name looks
            folder = Path(pattern).parent
            seen.add(folder)
            seen.update(Path(found) for found in glob.glob(str(folder)))
            while glob.has_magic(str(folder)) and folder != folder.parent:
                folder = folder.parent
                seen.add(folder)
            for included in sorted(glob.glob(pattern)):
                folders += ld_so_conf(Path(included), seen)
        elif line and not line.startswith("hwcap"):
            folders.append(Path(line))
    return folders


def system_folders(consulted: Consulted | None = None) -> tuple[Path, ...]:
    """What the loader searches after a library's own paths: ld.so.conf, then the defaults.
    `consulted` gets the configuration files and folders read."""
    triplet = sysconfig.get_config_var("MULTIARCH") or ""
    defaults = [Path("/lib") / triplet, Path("/usr/lib") / triplet] if triplet else []
    defaults += [Path("/lib64"), Path("/usr/lib64"), Path("/lib"), Path("/usr/lib")]
    seen: set[Path] = set()
    folders = ld_so_conf(seen=seen)
    for path in seen if consulted is not None else ():
        consulted.note(path)
    return tuple(dict.fromkeys(folders + defaults))


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
    def for_trials(cls, consulted: Consulted | None = None) -> SearchPath:
        """`consulted` gets what decides it: the import path torch is looked for on, and the
        loader's configuration files."""
        torch_lib = hostenv.torch_lib_dir()
        if consulted is not None:
            consulted.note_import_path()
        return cls((torch_lib,) if torch_lib else (), system_folders(consulted))

    def folders(self, requester: ElfFacts) -> Iterator[Path]:
        origin = str(requester.path.parent)

        def expand(entries: Iterable[str]) -> Iterator[Path]:
            # a relative entry is relative to the process's working folder: a trial's is an
            # empty folder of its own, where nothing is found (not loadfuzz's)
            found = (Path(e.replace("${ORIGIN}", origin).replace("$ORIGIN", origin))
                     for e in entries)
            return (folder for folder in found if folder.is_absolute())

        if not requester.runpath:
            yield from expand(requester.rpath)
        yield from self.library_path
        yield from expand(requester.runpath)
        yield from self.system

    def find(self, requester: ElfFacts, name: str, reader: ElfReader) -> Path | None:
        if "/" in name:  # a path, not searched for: relative to the process's working
            candidate = Path(os.path.normpath(name))  # folder, a trial's empty one
            return candidate if candidate.is_absolute() and reader.matches(candidate) else None
        for folder in self.folders(requester):
            reader.note(folder)  # a library added to it later would be found first
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

    @cached_property
    def dependencies(self) -> Mapping[Path, tuple[tuple[str, ElfFacts | None], ...]]:
        """Per file, each NEEDED name and the file it leads to (None: nobody provides it)."""
        return {path: self.resolve(obj) for path, obj in self.files.items()}

    def resolve(self, obj: ElfFacts) -> tuple[tuple[str, ElfFacts | None], ...]:
        found = ((name, self.links.get((obj.path, name))) for name in obj.needed)
        return tuple((name, None if path is None else self.files[path]) for name, path in found)

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
        in_order = {root.identity}
        if root.soname:
            by_name.setdefault(root.soname, order[0])
        position = 0
        while position < len(order):
            obj = order[position]
            position += 1
            needs = self.dependencies.get(obj.path)
            for name, found in self.resolve(obj) if needs is None else needs:
                dep = by_name.get(name)
                if dep is None:
                    if found is None:
                        missing.append(name)
                        continue
                    dep = by_identity.setdefault(found.identity, found)
                    by_name[name] = dep
                    if dep.soname:
                        by_name.setdefault(dep.soname, dep)
                if dep.identity not in in_order:
                    in_order.add(dep.identity)
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
