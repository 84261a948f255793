"""The machine loadfuzz runs on: torch's libraries, libpython, the import path and the cache folder.

Looked up without importing torch (which takes seconds) and without any
global cache: callers that need the answers often keep them. torch is not
a requirement: where it is not installed, trials simply have no torch.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import sysconfig
from pathlib import Path

# The file names of PyTorch's own libraries: libtorch*.so, libc10*.so (with any version suffix).
TORCH_LIBRARY = re.compile(r"lib(torch\w*|c10\w*)\.so(\.\d+)*")


def is_torch_library(file_name: str) -> bool:
    """Whether a file (or NEEDED) name is one of PyTorch's libraries."""
    return TORCH_LIBRARY.fullmatch(file_name) is not None


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


def cache_folder() -> Path:
    """Where loadfuzz keeps what it derives from files: the built harness, unpacked wheels,
    what ELF files say (`elf/`) and what is derived from many (`derived/`)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "loadfuzz"
