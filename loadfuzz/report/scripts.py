"""repro/NNN.sh and repro.sh: one executable script per finding that reruns it cold.

Each script's comment says what the finding was; control characters in it
are shown as escapes, so a library id cannot break out of the comment.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from loadfuzz.model import step_label
from loadfuzz.report.output import write_file
from loadfuzz.report.view import ended_in, script_name, visible
from loadfuzz.spelling import headline

_SCRIPT_NAME = re.compile(r"^\d{3,}\.sh$")


def _script(number: int, record: Mapping[str, Any]) -> str:
    comment = [
        f"loadfuzz finding {number}: {headline(record)}",
        f"sequence: {' -> '.join(step_label(s) for s in record['sequence'])}",
        f"ended in: {ended_in(record) or '-'}",
        f"detail: {record.get('detail') or '-'}",
    ]
    lines = ["#!/bin/sh", *(f"# {visible(line)}" for line in comment),
             f"exec {record['repro']}", ""]
    return "\n".join(lines)


def write_repro_scripts(out: Path, findings: list[Mapping[str, Any]],
                        write: Callable[..., Path] = write_file) -> list[Path]:
    """repro/001.sh, ...: one executable script per finding, in order, that execs its repro
    command; numbered scripts left from an earlier render with more findings are removed.
    `write`: how a file is written (`write_file`, or a `Staged`'s)."""
    folder = out / "repro"
    folder.mkdir(parents=True, exist_ok=True)
    written = [
        write(folder / script_name(n, len(findings)), _script(n, record), mode=0o755,
              raw_paths=True)
        for n, record in enumerate(findings, start=1)
    ]
    for old in folder.iterdir():
        if _SCRIPT_NAME.match(old.name) and old not in written:
            old.unlink()
    return written


def write_repro_script(out: Path, record: Mapping[str, Any]) -> Path:
    """repro.sh: the one standalone script `loadfuzz repro` leaves."""
    return write_file(out / "repro.sh", _script(1, record), mode=0o755, raw_paths=True)
