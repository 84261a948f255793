"""Writing a results file: atomically, so a reader never sees half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_file(path: Path, text: str, mode: int = 0o644, raw_paths: bool = False) -> Path:
    """Write `text` atomically: a temporary file beside `path`, then os.replace.

    Lone surrogates (from undecodable bytes in a path) are written as `\\udcXX`,
    which is exactly their JSON escape and readable text elsewhere; `raw_paths`: as the
    bytes they stand for (a script, whose commands must name the very files).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(encoded(text, raw_paths))
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def encoded(text: str, raw_paths: bool) -> bytes:
    if raw_paths:
        try:
            return text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate that stands for no byte: shown, as elsewhere
            pass
    return text.encode("utf-8", "backslashreplace")
