"""Python steps as the Python source the harness runs: the import CPython would do, and the ways
Python code loads a library (torch.ops.load_library, ctypes.CDLL).

`py:PATH` imports the extension module at PATH under its qualified module name,
worked out from where it lies on the environment's sys.path (the longest
dotted name an entry gives), so that its parent packages are imported first,
exactly as `import a.b.c` would; the step then checks that the import found
that very file. A file on no sys.path entry is imported by its bare name
from its own folder, as `python` run in that folder would.
"""

from __future__ import annotations

import importlib.machinery
import os
from collections.abc import Sequence
from pathlib import Path

from loadfuzz.model import Flags, Step, StepKind


def module_name(path: Path, search: Sequence[str]) -> tuple[str, Path | None]:
    """The dotted name `import` gives the extension module at `path` from the sys.path `search`,
    and the folder to put first on sys.path when no entry holds it (else None)."""
    name = path.name
    suffix = next((s for s in sorted(importlib.machinery.EXTENSION_SUFFIXES, key=len, reverse=True)
                   if name.endswith(s)), None)
    stem = name[:-len(suffix)] if suffix else name.split(".")[0]
    best: str | None = None
    for entry in search:
        try:
            parts = path.relative_to(entry).parts[:-1]
        except ValueError:
            continue
        dotted = ".".join([*parts, stem])
        if all(part.isidentifier() for part in [*parts, stem]) and (
                best is None or dotted.count(".") > best.count(".")):
            best = dotted
    return (best, None) if best is not None else (stem, path.parent)


IMPORT = """\
import importlib, os, sys
{prefix}module = importlib.import_module({name!r})
found = getattr(module, '__file__', None)
if not found or not os.path.samefile(found, {path!r}):
    raise ImportError(f'import {name} found {{found}}, not {path}')
"""


def source(step: Step, reaches_torch: bool, search: Sequence[str]) -> str:
    """The Python source of one Python step (an import, a module by name, or a library loaded
    with Flags.PYTHON: by torch.ops.load_library when it reaches torch, else ctypes.CDLL)."""
    path = os.fsdecode(step.path)
    if step.kind is StepKind.MODULE:
        return f"import importlib\nimportlib.import_module({step.lib!r})\n"
    if step.kind is StepKind.IMPORT:
        name, folder = module_name(step.path, search)
        prefix = f"sys.path.insert(0, {os.fsdecode(folder)!r})\n" if folder else ""
        return IMPORT.format(prefix=prefix, name=name, path=path)
    assert step.flags is Flags.PYTHON, "dlopen steps are not Python"
    if reaches_torch:
        return f"import torch\ntorch.ops.load_library({path!r})\n"
    return f"import ctypes\nctypes.CDLL({path!r})\n"
