"""Where the dynamic loader finds each NEEDED name, and in which order it loads a closure.

`SearchPath` is ld.so's search order for a trial process (DT_RPATH,
LD_LIBRARY_PATH, DT_RUNPATH, ld.so.conf, the defaults; `$ORIGIN`
expanded); `LinkMap` holds every file a set of roots reaches and where each
NEEDED name leads, and `search_list` walks it breadth-first as ld.so does.
Read-only once built, so `predict` can replay any load order against it.

DT_RPATH is inherited: an object without DT_RUNPATH searches its own DT_RPATH,
then that of the object that loaded it (whose NEEDED entry brought it in), and
so on up (glibc's `l_loader` walk; an object opened with dlopen starts the
chain). So where a name leads can depend on who loaded the object asking:
scipy's `libgfortran` (no path of its own) finds `libquadmath` in
`scipy.libs` when `_fblas`, whose DT_RPATH names that folder, loads it, and
not when it is opened alone. `LinkMap.links` holds each answer with no
inherited folders; `LinkMap.through` the answers an inherited chain changes.
"""

from __future__ import annotations

import glob
import os
import sysconfig
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
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


Chain = tuple[Path, ...]  # DT_RPATH folders inherited from the objects that loaded one


def rpath_folders(obj: ElfFacts) -> Chain:
    """The object's DT_RPATH entries as folders: `$ORIGIN` its own folder; a relative entry is
    relative to the process's working folder (a trial's is an empty folder of its own, where
    nothing is found), so it is left out."""
    return tuple(expand(obj.rpath, str(obj.path.parent)))


def expand(entries: Iterable[str], origin: str) -> Iterator[Path]:
    found = (Path(e.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)) for e in entries)
    return (folder for folder in found if folder.is_absolute())


def origin_path(folder: Path, requester: Path) -> str:
    """`folder` as a DT_RUNPATH entry of the library at `requester` ($ORIGIN-relative)."""
    where = os.path.relpath(folder, requester.parent)
    return "$ORIGIN" if where == "." else f"$ORIGIN/{where}"


def passed_on(loader: ElfFacts, inherited: Chain) -> Chain:
    """What an object `loader` loads inherits: the loader's own DT_RPATH, then what the loader
    inherited (ld.so walks up `l_loader`, whatever the DT_RUNPATH of the objects on the way)."""
    if not loader.rpath:  # (most objects: nothing to add, on every step of every walk)
        return inherited
    return tuple(dict.fromkeys((*rpath_folders(loader), *inherited)))


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

    def folders(self, requester: ElfFacts, inherited: Chain = ()) -> Iterator[Path]:
        """The folders searched for a NEEDED name of `requester`, which inherited the DT_RPATH
        folders `inherited` from the objects that loaded it (none, when it was opened itself)."""
        if not requester.runpath:
            yield from rpath_folders(requester)
            yield from inherited
        yield from self.library_path
        yield from expand(requester.runpath, str(requester.path.parent))
        yield from self.system

    def find(self, requester: ElfFacts, name: str, reader: ElfReader,
             inherited: Chain = ()) -> Path | None:
        if "/" in name:  # a path, not searched for: relative to the process's working
            candidate = Path(os.path.normpath(name))  # folder, a trial's empty one
            return candidate if candidate.is_absolute() and reader.matches(candidate) else None
        for folder in self.folders(requester, inherited):
            reader.note(folder)  # a library added to it later would be found first
            candidate = Path(os.path.normpath(folder / name))
            if candidate.is_file() and reader.matches(candidate):
                return candidate
            # a dangling link: its target may come where no folder listed here changes
            if candidate.is_symlink():
                reader.note(candidate)
        return None


@dataclass(frozen=True)
class LinkMap:
    """Every ELF file a target reaches and where each NEEDED name of each leads: read-only.

    `search_list` is the loader's breadth-first walk, shared by the clean
    closures here and by `predict`'s replays of load orders.
    """

    files: Mapping[Path, ElfFacts]
    links: Mapping[tuple[Path, str], Path | None]  # (requester, NEEDED name) -> file
    # (requester, NEEDED name, inherited DT_RPATH folders) -> file, where those folders make
    # the answer another than `links`'
    through: Mapping[tuple[Path, str, Chain], Path | None] = field(default_factory=dict)

    @cached_property
    def dependencies(self) -> Mapping[Path, tuple[tuple[str, ElfFacts | None], ...]]:
        """Per file, each NEEDED name and the file it leads to (None: nobody provides it), with
        nothing inherited."""
        return {path: self.resolve(obj) for path, obj in self.files.items()}

    @cached_property
    def inheriting(self) -> frozenset[Path]:
        """The files some of whose NEEDED names lead elsewhere with an inherited DT_RPATH."""
        return frozenset(path for path, _, _ in self.through)

    @cached_property
    def elsewhere(self) -> Mapping[tuple[Path, str], frozenset[Path]]:
        """Per (requester, NEEDED name), the files an inherited DT_RPATH leads it to instead."""
        found: dict[tuple[Path, str], set[Path]] = {}
        for (requester, name, _), path in self.through.items():
            if path is not None:
                found.setdefault((requester, name), set()).add(path)
        return {link: frozenset(paths) for link, paths in found.items()}

    def resolve(self, obj: ElfFacts, inherited: Chain = ()) -> tuple[tuple[str, ElfFacts | None], ...]:
        found = ((name, self.lookup(obj, name, inherited)) for name in obj.needed)
        return tuple((name, None if path is None else self.files[path]) for name, path in found)

    def lookup(self, obj: ElfFacts, name: str, inherited: Chain = ()) -> Path | None:
        """The file a NEEDED name of `obj` leads to, when `obj` inherited those folders."""
        default = self.links.get((obj.path, name))
        return self.through.get((obj.path, name, inherited), default) if inherited else default

    def shipped(self, name: str) -> Path | None:
        """A file of that name the campaign reached (a library whose DT_RPATH finds it, say,
        where another's search path does not), if any."""
        return min((path for path in self.files if path.name == name), default=None)

    def leads_to(self, obj: ElfFacts, name: str) -> set[Path]:
        """Every file a NEEDED name of `obj` may lead to, whoever loaded `obj` (for a walk that
        knows which objects its process holds: the one of these it holds is the one)."""
        found = set(self.elsewhere.get((obj.path, name), ()))
        if (default := self.links.get((obj.path, name))) is not None:
            found.add(default)
        return found

    def held(self, obj: ElfFacts, name: str, here: Container[object]) -> list[ElfFacts]:
        """The files of `leads_to` that a process holding `here` (identities) holds, in path
        order: the one a NEEDED name of `obj` found there."""
        return [self.files[path] for path in sorted(self.leads_to(obj, name))
                if self.files[path].identity in here]

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
        inherited: dict[tuple[int, int], Chain] = {root.identity: ()}  # (opened: none)
        if root.soname:
            by_name.setdefault(root.soname, order[0])
        position = 0
        while position < len(order):
            obj = order[position]
            position += 1
            chain = inherited.get(obj.identity, ())
            needs = None if chain and obj.path in self.inheriting else self.dependencies.get(obj.path)
            for name, found in self.resolve(obj, chain) if needs is None else needs:
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
                    inherited[dep.identity] = passed_on(obj, chain)  # obj loaded it
        return order, list(dict.fromkeys(missing))


def link_all(roots: Iterable[ElfFacts], reader: ElfReader, search: SearchPath) -> LinkMap:
    """Resolve every NEEDED name reachable from the roots, reading each file reached: with
    nothing inherited, and with each chain of DT_RPATH folders an object can inherit from the
    objects that load it (see the module's docstring)."""
    files = {root.path: root for root in roots}
    links: dict[tuple[Path, str], Path | None] = {}
    through: dict[tuple[Path, str, Chain], Path | None] = {}
    pending: list[tuple[ElfFacts, Chain]] = [(root, ()) for root in files.values()]
    walked = {(root.path, ()) for root in files.values()}
    while pending:
        obj, chain = pending.pop()
        for name in obj.needed:
            if (obj.path, name) not in links:
                links[(obj.path, name)] = search.find(obj, name, reader)
            path = links[(obj.path, name)]
            if chain and not obj.runpath and "/" not in name:
                key = (obj.path, name, chain)
                if key not in through:
                    through[key] = search.find(obj, name, reader, chain)
                path = through[key]
            if path is None:
                continue
            if path not in files:
                files[path] = reader.facts(path)
            handed = passed_on(obj, chain)
            if (path, handed) not in walked:
                walked.add((path, handed))
                pending.append((files[path], handed))
    through = {key: path for key, path in through.items() if path != links[key[:2]]}
    return LinkMap(files, links, through)
