"""Targets: which shared-library files a TARGET names, under which ids.

A TARGET is a `.whl` (unpacked once into the cache, safely), a directory, an
installed distribution's name, or one `.so`. `locate` turns it into a
`TargetFiles`: the root that ids are relative to, the name and version for
result folders, and every candidate library file by id. Nothing here reads
ELF contents; `inventory` does. Given a `derived.Consulted`, each function
notes there every path it looked at (the folders walked, the wheel, the
import path and the metadata files of installed distributions).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import importlib.metadata
import json
import os
import posixpath
import re
import shutil
import stat
import time
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from loadfuzz import entries, hostenv, scratch
from loadfuzz.model import UsageError

if TYPE_CHECKING:
    from loadfuzz.derived import Consulted

SO_FILE = re.compile(r".+\.so(\.\d+)*", re.DOTALL)  # any byte but / may be in a name: \n too
UNPACKING = ".unpacking-"  # a wheel being unpacked into the cache (`unpack_wheel`)
MANIFEST = ".loadfuzz-manifest.json"  # in an unpacked wheel: what it held when it was made
UNPACK_LAYOUT = "installed"  # unpacked as pip installs it (`installed_name`); part of the folder name
INSTALLED_DATA = re.compile(r"[^/]+\.data/(?:platlib|purelib)/")


@dataclass(frozen=True)
class TargetFiles:
    """What a TARGET names: candidate library files by id, and what to call it."""

    target: str  # as given
    name: str  # short name, for folder names
    version: str | None
    root: Path  # ids are paths relative to it
    files: Mapping[str, Path]  # id -> file
    single: bool  # one library given on its own: it must be readable
    notes: tuple[str, ...] = ()  # warnings: what it lists but does not have

    @property
    def label(self) -> str:
        """`<name>-<version>`: the first part of its libraries' ids in a campaign of several."""
        return f"{self.name}-{self.version or 'unversioned'}"


def locate(target: str, consulted: Consulted | None = None) -> TargetFiles:
    """The files of a .whl, a directory, an installed distribution or one .so; UsageError if none."""
    if not target.strip():  # Path("") is the working folder: never what an empty word meant
        raise UsageError("a target is empty: give a .whl, a folder, a library or a distribution")
    path = Path(target)
    if consulted is not None:
        consulted.note(path)  # a folder of this name would be the target, not a distribution
    notes: tuple[str, ...] = ()
    if path.is_dir():
        root, name, version = path.absolute(), path.absolute().name, None
        candidates = list(walk_libraries(root, consulted))
    elif path.is_file() and path.suffix == ".whl":
        root, name, version = unpack_wheel(path)
        candidates = list(walk_libraries(root, consulted))
    elif path.is_file():
        root, name, version = path.absolute().parent, path.name.split(".")[0], None
        candidates = [path.absolute()]
    elif path.exists():  # a FIFO, a socket, a device: nothing a library is read from
        raise UsageError(f"not a regular file nor a folder: {target}")
    elif "/" in target or target.endswith((".whl", ".so")):
        raise UsageError(f"no such file or directory: {target}")
    else:
        root, name, version, candidates, notes = installed_distribution(target, consulted)
    files = {posixpath.join(*p.relative_to(root).parts): p for p in candidates}
    single = path.is_file() and path.suffix != ".whl"
    return TargetFiles(target, name, version, root, files, single, notes)


def walk_libraries(root: Path, consulted: Consulted | None = None) -> Iterator[Path]:
    """The shared-library files under a folder (symlinks are not followed nor listed)."""
    for folder, subfolders, names in os.walk(root):
        if consulted is not None:
            consulted.note(folder)  # a file added, removed or renamed in it changes it
        subfolders.sort()
        for name in sorted(names):
            candidate = Path(folder) / name
            if SO_FILE.fullmatch(name) and not candidate.is_symlink() and candidate.is_file():
                yield candidate


def package_root(base: Path, top_level: set[str]) -> Path:
    """The single top-level package folder, or `base` when there are several (or loose files)."""
    folders = [name for name in top_level if (base / name).is_dir()]
    return base / folders[0] if len(top_level) == 1 and folders else base


def installed_distribution(name: str, consulted: Consulted | None = None,
                           ) -> tuple[Path, str, str | None, list[Path], tuple[str, ...]]:
    if consulted is not None:
        consulted.note_import_path()  # where importlib looks for the distribution
    dist = next(iter(importlib.metadata.distributions(name=name, path=hostenv.python_paths())),
                None)
    if dist is None:
        raise UsageError(f"no such file, directory or installed distribution: {name}")
    try:
        return distribution_files(dist, name, consulted)
    except UnicodeDecodeError as exc:
        raise UsageError(f"the installed distribution {name}: {not_utf8(dist, exc)}") from None


def not_utf8(dist: importlib.metadata.Distribution, exc: UnicodeDecodeError) -> str:
    """What is wrong with a distribution whose METADATA or RECORD importlib cannot read."""
    where = getattr(dist, "_path", None)  # its metadata folder, when importlib says
    return (f"its metadata{f' in {where}' if where else ''} is not UTF-8 "
            f"({exc.reason} at byte {exc.start})")


def environment(consulted: Consulted | None = None) -> tuple[list[TargetFiles], list[str]]:
    """Every distribution installed in this environment that ships shared libraries, by name
    (`--env`); the first of two distributions with one name wins, as importlib has it. The
    environment is the import path a trial has (`hostenv.python_paths`): not loadfuzz's
    working folder, nor PYTHONPATH, whether it runs as `loadfuzz` or `python -m loadfuzz`.
    Also a warning for each distribution skipped because its metadata cannot be read."""
    if consulted is not None:
        consulted.note_import_path()
    found, seen, skipped = [], set(), []
    for dist in importlib.metadata.distributions(path=hostenv.python_paths()):
        try:
            target = environment_target(dist, seen, consulted)
        except UnicodeDecodeError as exc:  # one old package must not stop every --env campaign
            skipped.append(f"skipped an installed distribution: {not_utf8(dist, exc)}")
            if consulted is not None:  # its metadata mended, the next --env reads it again
                note_metadata(dist, [], consulted)
            continue
        if target is not None:
            found.append(target)
    return sorted(found, key=lambda t: t.name.lower()), skipped


def environment_target(dist: importlib.metadata.Distribution, seen: set[str],
                       consulted: Consulted | None) -> TargetFiles | None:
    """One distribution of `environment`: None unless it is the first of its name and ships
    shared libraries (UnicodeDecodeError when its metadata is not UTF-8)."""
    name = dist.metadata["Name"]
    if not name or name.lower() in seen:
        return None
    seen.add(name.lower())
    recorded = recorded_parts(dist)
    if consulted is not None:
        note_metadata(dist, recorded, consulted)
    if not any(parts and SO_FILE.fullmatch(parts[-1]) for parts in recorded):
        return None
    try:
        root, name, version, candidates, notes = distribution_files(dist, name, consulted,
                                                                    recorded)
    except UsageError:
        return None  # it lists libraries but ships none here (symlinks, files outside it)
    files = {posixpath.join(*p.relative_to(root).parts): p for p in candidates}
    return TargetFiles(name, name, version, root, files, single=False, notes=notes)


def distribution_files(dist: importlib.metadata.Distribution, name: str,
                       consulted: Consulted | None = None,
                       recorded: list[tuple[str, ...]] | None = None,
                       ) -> tuple[Path, str, str | None, list[Path], tuple[str, ...]]:
    """(root, name, version, library files, warnings) of an installed distribution
    (`recorded`: its `recorded_parts`, when already read); a library its RECORD lists that
    is gone from the disk is a warning, not left out without a word."""
    recorded = recorded_parts(dist) if recorded is None else recorded
    records = [parts for parts in recorded if parts and ".." not in parts]
    base = Path(dist.locate_file(""))
    top_level = {parts[0] for parts in records if not parts[0].endswith((".dist-info", ".data"))}
    root = package_root(base, top_level)
    candidates = [Path(dist.locate_file(str(PurePosixPath(*parts)))) for parts in records
                  if SO_FILE.fullmatch(parts[-1])]
    if consulted is not None:
        note_metadata(dist, recorded, consulted)
        for candidate in candidates:
            consulted.note(candidate)
    gone = [p for p in candidates if not p.exists() and not p.is_symlink()]
    candidates = sorted(p for p in candidates if p.is_file() and not p.is_symlink()
                        and p.is_relative_to(root))
    if not candidates:
        raise UsageError(f"no ELF shared library in the installed distribution {name}")
    name = dist.metadata["Name"] or name
    notes = tuple(f"skipped {name}'s {p.relative_to(base) if p.is_relative_to(base) else p}: "
                  "its RECORD lists it, but it is not on disk" for p in gone)
    return root, name, dist.version, candidates, notes


def note_metadata(dist: importlib.metadata.Distribution, recorded: list[tuple[str, ...]],
                  consulted: Consulted) -> None:
    """Note the files of a distribution's metadata folder (its RECORD and METADATA among
    them, or an .egg-info's PKG-INFO and SOURCES.txt) and that folder: what says which files
    it has, and its name and version."""
    # where importlib.metadata read it, when it says (an .egg-info lists none of its own files)
    folder = getattr(dist, "_path", None)
    if folder is not None and Path(folder).is_dir():
        consulted.note(folder)
        for path in Path(folder).iterdir():
            consulted.note(path)
        return
    for parts in recorded:  # else the files its RECORD lists in its .dist-info folder
        if len(parts) == 2 and parts[0].endswith(".dist-info"):
            path = Path(dist.locate_file(str(PurePosixPath(*parts))))
            consulted.note(path)
            consulted.note(path.parent)


def recorded_parts(dist: importlib.metadata.Distribution) -> list[tuple[str, ...]]:
    """The parts of each path the distribution lists, as `PurePosixPath(entry).parts` of `dist.files`.

    Read from RECORD as text: `dist.files` makes a path object per entry, and
    torch lists 15,000 of them (half a second); the rare absolute entry, or a
    distribution without RECORD, goes the slow way.
    """
    text = dist.read_text("RECORD")
    names = ([row[0] for row in csv.reader(text.splitlines()) if row] if text
             else [str(entry) for entry in dist.files or ()])
    split = [(name, name.split("/")) for name in names]
    return [PurePosixPath(name).parts if name.startswith("/")
            else tuple(parts) if "" not in parts and "." not in parts
            else tuple(part for part in parts if part not in ("", "."))
            for name, parts in split]


def unpack_wheel(wheel: Path) -> tuple[Path, str, str | None]:
    """Unpack a wheel (once) into the cache folder named by its SHA-256; (root, name, version)."""
    digest = hashlib.sha256()
    with open(wheel, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    wheels = hostenv.cache_folder() / "wheels"
    final = wheels / f"{digest.hexdigest()}-{UNPACK_LAYOUT}"
    if not intact(final):
        wheels.mkdir(parents=True, exist_ok=True)
        scratch.sweep(wheels, UNPACKING)  # what an unpack killed by SIGKILL left (a whole wheel)
        folder, owner = scratch.held(wheels, UNPACKING)
        try:
            with contextlib.suppress(FileNotFoundError):  # a damaged one (or another's) goes
                os.rename(final, folder / "damaged")
            (folder / "tree").mkdir()
            extract_safely(wheel, folder / "tree")
            dist_info(wheel, folder / "tree")  # no wheel is kept in the cache that is not one
            seal(folder / "tree")
            try:
                os.rename(folder / "tree", final)
            except OSError:
                if not final.is_dir():  # not a concurrent unpack of the same wheel that won
                    raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            os.close(owner)
    name, _, version = dist_info(wheel, final).removesuffix(".dist-info").partition("-")
    top_level = {p.name for p in final.iterdir()
                 if not p.name.endswith((".dist-info", ".data")) and p.name != MANIFEST}
    return package_root(final, top_level), name, version or None


def tree_state(root: Path, sealed_ns: int | None = None) -> dict[str, list[int]] | None:
    """Every entry under `root` (its manifest aside) with its mode, size and mtime; None when
    one changed after `sealed_ns` (its ctime: a write, a chmod, a `touch -r`)."""
    state: dict[str, list[int]] = {}
    for folder, subfolders, names in os.walk(root):
        for name in subfolders + names:
            path = os.path.join(folder, name)
            if folder == str(root) and name == MANIFEST:
                continue
            info = os.lstat(path)
            if sealed_ns is not None and info.st_ctime_ns > sealed_ns:
                return None
            state[os.path.relpath(path, root)] = [info.st_mode, info.st_size, info.st_mtime_ns]
    return state


def seal(root: Path) -> None:
    """Note what an unpacked wheel holds, in its manifest, so that a later use can tell it whole."""
    state = tree_state(root)
    (root / MANIFEST).write_text(json.dumps({"sealed_ns": time.time_ns(), "entries": state}))


def intact(root: Path) -> bool:
    """Whether an unpacked wheel in the cache holds what it held when it was sealed: no entry
    added, removed, or changed since (a cache damaged by hand is unpacked again, never used)."""
    try:
        manifest = json.loads(entries.read_regular(root / MANIFEST).decode("utf-8"))
        return manifest["entries"] == tree_state(root, manifest["sealed_ns"])
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, TypeError, KeyError):
        return False


def dist_info(wheel: Path, unpacked: Path) -> str:
    """The name of the unpacked wheel's .dist-info folder (the first, sorted)."""
    info = sorted(p.name for p in unpacked.iterdir() if p.name.endswith(".dist-info"))
    if not info:
        raise UsageError(f"{wheel}: not a wheel (no .dist-info folder inside)")
    return info[0]


def extract_safely(wheel: Path, into: Path) -> None:
    """Extract every entry under `into`; any entry that would land outside it is an error."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            for entry in archive.infolist():
                name = installed_name(entry.filename)
                if not name:  # the folder `<dist>.data/platlib/` itself
                    continue
                destination = entry_destination(wheel, name, into)
                mode = entry.external_attr >> 16
                if stat.S_ISLNK(mode):
                    link = archive.read(entry).decode("utf-8", "replace")
                    inside = posixpath.normpath(posixpath.join(posixpath.dirname(name), link))
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


def installed_name(name: str) -> str:
    """Where pip installs a wheel entry, relative to site-packages: `<dist>.data/platlib/x`
    and `<dist>.data/purelib/x` are `x`, beside the wheel's packages (their `$ORIGIN`
    depends on it); any other entry stays where it is."""
    found = INSTALLED_DATA.match(name)
    return name[found.end():] if found else name


def entry_destination(wheel: Path, name: str, into: Path) -> Path:
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if (name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name) or ".." in parts
            or not parts):
        raise UsageError(f"{wheel}: unsafe entry {name!r} (absolute, or climbing out with ..)")
    destination = into.joinpath(*parts)
    if not destination.resolve().is_relative_to(into.resolve()):
        raise UsageError(f"{wheel}: entry {name!r} would land outside the wheel (through a symlink)")
    return destination
