"""The machine loadfuzz runs on: torch's libraries, libpython, the import path, the cache folder
and the cores it may use.

Looked up without importing torch (which takes seconds) and without any
global cache: callers that need the answers often keep them. torch is not
a requirement: where it is not installed, trials simply have no torch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
import site
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
    """The import path a trial's interpreter has, but for the '' it puts first (its own empty
    folder): this interpreter's, without what only this process has (see "What a trial gets"):
    the folder of its main script or the working folder that Python put first, PYTHONPATH's
    entries and the user's site-packages (a trial's environment has neither)."""
    only_here = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                 if p}
    if site.ENABLE_USER_SITE:
        only_here.add(os.path.abspath(site.getusersitepackages()))
    script = os.path.dirname(os.path.abspath(sys.argv[0])) if sys.argv and sys.argv[0] else None
    paths = list(sys.path)
    if paths and paths[0] and os.path.abspath(paths[0]) in {script, os.getcwd()}:
        paths = paths[1:]
    return [p for p in paths if p and os.path.abspath(p) not in only_here]


def cache_folder() -> Path:
    """Where loadfuzz keeps what it derives from files: the built harness, unpacked wheels,
    what ELF files say (`elf/`) and what is derived from many (`derived/`). A relative
    XDG_CACHE_HOME is ignored, as the XDG spec says (it would mean a cache per working folder)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "loadfuzz"


def usable_cores() -> int:
    """The CPUs this process may run on (the default `--jobs`): its affinity mask, capped by
    its cgroup's CPU quota (a CI container sees every core of its host, but may be given the
    time of two)."""
    cores = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    return cores
