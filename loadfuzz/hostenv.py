"""Where the interpreter running loadfuzz keeps what trials borrow: torch's libraries and libpython.

Looked up without importing torch (which takes seconds) and without any
global cache: callers that need the answers often keep them.
"""

from __future__ import annotations

import importlib.util
import sys
import sysconfig
from pathlib import Path


def torch_lib_dir() -> Path | None:
    """The `torch/lib` folder of the torch installed beside loadfuzz, if any."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return lib if lib.is_dir() else None


def libpython_path() -> Path | None:
    """The shared libpython of this interpreter (None for a static build)."""
    libdir = sysconfig.get_config_var("LIBDIR")
    for name in (sysconfig.get_config_var("INSTSONAME"), sysconfig.get_config_var("LDLIBRARY")):
        if libdir and name and ".so" in name and (Path(libdir) / name).exists():
            return Path(libdir) / name
    return None


def python_paths() -> list[str]:
    """The import path an embedded interpreter needs to see what this one sees."""
    return [p for p in sys.path if p]
