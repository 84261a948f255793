"""Writing a results file: atomically, so a reader never sees half of one; and a set of files
together (`staged`), so a folder never shows one report whose companions could not be written."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write_file(path: Path, text: str, mode: int = 0o644, raw_paths: bool = False) -> Path:
    """Write `text` atomically: a temporary file beside `path`, then os.replace.

    Lone surrogates (from undecodable bytes in a path) are written as `\\udcXX`,
    which is exactly their JSON escape and readable text elsewhere; `raw_paths`: as the
    bytes they stand for (a script, whose commands must name the very files).
    """
    with staged() as stage:
        stage.write(path, text, mode, raw_paths)
    return path


class Staged:
    """Files written beside their places, each put in place only once every one is written."""

    def __init__(self) -> None:
        self.pending: list[tuple[Path, Path]] = []  # (temporary, its place)

    def write(self, path: Path, text: str, mode: int = 0o644, raw_paths: bool = False) -> Path:
        self.pending.append((written_beside(path, text, mode, raw_paths), path))
        return path


@contextlib.contextmanager
def staged() -> Iterator[Staged]:
    """A `Staged` whose files are put in place when the block ends, or removed if it fails
    (a full disk half-way must not leave a report that reads as a finished campaign's)."""
    stage = Staged()
    try:
        yield stage
        for temporary, path in stage.pending:
            os.replace(temporary, path)
    finally:
        for temporary, _ in stage.pending:  # those not put in place
            temporary.unlink(missing_ok=True)


def written_beside(path: Path, text: str, mode: int, raw_paths: bool) -> Path:
    """`text` in a new temporary file beside `path` (its folder made if need be)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(encoded(text, raw_paths))
        os.chmod(temporary, mode)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return Path(temporary)


def encoded(text: str, raw_paths: bool) -> bytes:
    if raw_paths:
        try:
            return text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate that stands for no byte: shown, as elsewhere
            pass
    return text.encode("utf-8", "backslashreplace")
