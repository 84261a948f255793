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
import itertools
import keyword
import os
from collections.abc import Sequence
from pathlib import Path

from loadfuzz.model import Flags, Step, StepKind


def module_name(path: Path, search: Sequence[str]) -> tuple[str, Path | None]:
    """The dotted name `import` gives the extension module at `path` from the sys.path `search`
    (symbolic links and `..` resolved too), and the folder to put first on sys.path when no
    entry holds it (else None)."""
    name = path.name
    suffix = next((s for s in sorted(importlib.machinery.EXTENSION_SUFFIXES, key=len, reverse=True)
                   if name.endswith(s)), None)
    stem = name[:-len(suffix)] if suffix else name.split(".")[0]
    best: str | None = None
    # as written and as the file system resolves it (a venv's lib64 -> lib, a `..`), against
    # each entry as written and resolved: the import system finds the file either way
    places = dict.fromkeys((path, path.parent.resolve() / path.name))
    entries = dict.fromkeys(form for given in search if given
                            for form in (given, os.path.realpath(given)))
    for entry, place in itertools.product(entries, places):
        try:
            parts = place.relative_to(entry).parts[:-1]
        except ValueError:
            continue
        dotted = ".".join([*parts, stem])
        if all(part.isidentifier() for part in [*parts, stem]) and (
                best is None or dotted.count(".") > best.count(".")):
            best = dotted
    return (best, None) if best is not None else (stem, path.parent)


def dotted_name(name: str) -> bool:
    """Whether an `import` statement can name this module (so that it is safe to write one)."""
    return all(part.isidentifier() and not keyword.iskeyword(part) for part in name.split("."))


def import_statement(name: str) -> str:
    """`import NAME`, as `python -c` would run it (the harness runs a step in __main__, so
    that warnings and frames are attributed as CPython attributes them); importlib's call for a
    name no statement can say (a keyword, a file name that is no identifier)."""
    if dotted_name(name):
        return f"import {name}\n"
    return f"__import__('importlib').import_module({name!r})\n"


# The import of an extension module by file, then a check (that leaves no name behind) that it
# found that very file: a module must be it. (An object that is no module and names no file is
# one the module put in its own place in sys.modules, a lazy or proxy module, as CPython allows.)
IMPORT = """\
{prefix}{statement}_loadfuzz_found = __import__('sys').modules.get({name!r})
if isinstance(_loadfuzz_found, type(__import__('sys'))) or hasattr(_loadfuzz_found, '__file__'):
    _loadfuzz_found = getattr(_loadfuzz_found, '__file__', None)
    if not _loadfuzz_found or not __import__('os').path.samefile(_loadfuzz_found, {path!r}):
        raise ImportError('import ' + {name!r} + ' found ' + str(_loadfuzz_found) + ', not ' + {path!r})
del _loadfuzz_found
"""


def source(step: Step, reaches_torch: bool, search: Sequence[str]) -> str:
    """The Python source of one Python step (an import, a module by name, or a library loaded
    with Flags.PYTHON: by torch.ops.load_library when it reaches torch, else ctypes.CDLL)."""
    path = os.fsdecode(step.path)
    if step.kind is StepKind.MODULE:
        return import_statement(step.lib)
    if step.kind is StepKind.IMPORT:
        name, folder = module_name(step.path, search)
        prefix = f"__import__('sys').path.insert(0, {os.fsdecode(folder)!r})\n" if folder else ""
        return IMPORT.format(prefix=prefix, statement=import_statement(name), name=name,
                             path=path)
    assert step.flags is Flags.PYTHON, "dlopen steps are not Python"
    if reaches_torch:
        return f"import torch\ntorch.ops.load_library({path!r})\n"
    return f"import ctypes\nctypes.CDLL({path!r})\n"
