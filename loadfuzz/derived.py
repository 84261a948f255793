"""A persistent cache of what is derived from many files: kept while every file it read is unchanged.

`elf.cache` keeps what one ELF file says; this keeps what a command derives
from a whole target (the `scan` output, an inventory), so that asking again
reads one entry instead of every file, its dependencies and the installed
distributions' metadata.

While a result is derived, everything that looks at the disk notes what it
looked at in a `Consulted` (files read, folders listed or searched, the
metadata of installed distributions). The entry keeps each of those paths with
its identity (`stat` and `lstat`: device, inode, size, mtime_ns, ctime_ns,
mode; None for a path that did not exist), and is used only while every one
of them still has that identity: a library touched, replaced, added to a
folder that was searched, or removed sends the command back to the files.

The entry's key is what the result is a function of besides those files:
what was derived (`what`, with the command's words: targets, `--add`,
`--env`), the working folder, the interpreter and its `sys.path`, the cache
folder, and `code_digest()` (loadfuzz's own source and pyelftools' version),
so a new loadfuzz never reads an older one's entries. One entry per
(what, words, working folder, interpreter): a new key replaces the entry
instead of piling up. As in `elf.cache`, a result whose files changed less
than `settle_ns` before it was derived (or while it was) is not kept, and
entries are written whole (`entries`), so concurrent commands see whole
entries only. Entries live in `hostenv.cache_folder() / "derived"`;
deleting that folder (or the whole cache folder) empties the cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from loadfuzz import entries, hostenv

FORMAT = 1

Identity = tuple[tuple[int, ...] | None, tuple[int, ...] | None]


def identity(path: str) -> Identity:
    """What says a path is unchanged: its `stat` (the file it reaches) and its `lstat` (the
    name itself: a file replaced by a symlink to it is a change)."""

    def of(stat_call) -> tuple[int, ...] | None:
        try:
            found = stat_call(path)
        except (OSError, ValueError):
            return None
        return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns,
                found.st_mode)

    return of(os.stat), of(os.lstat)


@dataclass
class Consulted:
    """The paths a derivation looked at (mutable; one per derivation, never shared)."""

    paths: set[str] = field(default_factory=set)
    read: set[str] = field(default_factory=set)  # those of them that were there and were read

    def note(self, path: Path | str) -> None:
        """A file read or a folder listed or searched: the result depends on its state."""
        self.paths.add(os.path.abspath(path))

    def note_read(self, path: Path | str) -> None:
        """A file that was there and was read: a result is not kept if it is gone by then."""
        self.note(path)
        self.read.add(os.path.abspath(path))

    def note_import_path(self) -> None:
        """`sys.path`'s folders: which distributions and packages are installed."""
        for folder in sys.path:
            self.note(folder or os.getcwd())


def code_digest() -> str:
    """A digest of loadfuzz's source (every .py and .toml of the package) and pyelftools'
    version file: any change to the code that derives a result invalidates every entry."""
    package = Path(__file__).parent
    digest = hashlib.sha256(f"{FORMAT}".encode())
    for path in sorted(package.rglob("*")):
        if path.suffix in (".py", ".toml") and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    spec = importlib.util.find_spec("elftools")
    if spec is not None and spec.origin:
        digest.update(Path(spec.origin).read_bytes())
    return digest.hexdigest()[:32]


def context() -> tuple:
    """What every derived result depends on besides its files and words."""
    return (FORMAT, code_digest(), sys.executable, sys.version, tuple(sys.path), os.getcwd(),
            str(hostenv.cache_folder()))


@dataclass(frozen=True)
class DerivedCache:
    """Results derived from many files, kept in `folder` (one file per entry) across commands."""

    folder: Path
    settle_ns: int = entries.SETTLE_NS  # results of files changed this recently are not kept

    @classmethod
    def default(cls) -> DerivedCache:
        return cls(hostenv.cache_folder() / "derived")

    def entry(self, key: tuple) -> Path:
        """One file per (what, words, working folder, interpreter), whatever the rest."""
        what, words, (_, _, executable, _, _, cwd, _) = key
        name = hashlib.sha256(repr((what, words, executable, cwd)).encode("utf-8",
                                                                        "surrogateescape"))
        return self.folder / f"{name.hexdigest()[:40]}.pickle"

    def key(self, what: str, words: tuple) -> tuple:
        return (what, words, context())

    def get(self, key: tuple) -> object | None:
        """The result kept under this key while every path it was derived from is unchanged."""
        stored = entries.read(self.entry(key), key)
        if not (isinstance(stored, tuple) and len(stored) == 2 and isinstance(stored[0], tuple)):
            return None
        witnesses, result = stored
        try:
            if any(identity(path) != seen for path, seen in witnesses):
                return None
        except (TypeError, ValueError):
            return None
        return result

    def keep(self, key: tuple, consulted: Consulted, started_ns: int, result: object) -> None:
        """Keep a result (plain values only) derived from what `consulted` holds, from
        `started_ns` (`time.time_ns()` before the derivation began) on; not when a path
        changed since a moment before it began (see the module doc)."""
        witnesses = tuple((path, identity(path)) for path in sorted(consulted.paths))
        if any(path in consulted.read and not any(seen) for path, seen in witnesses):
            return  # a file read was removed meanwhile: its absence would match next time
        newest = max((max(stat[3], stat[4]) for pair in witnesses for stat in pair[1] if stat),
                     default=0)
        if newest >= started_ns - self.settle_ns or time.time_ns() < started_ns:
            return
        entries.write(self.entry(key), key, (witnesses, result))
