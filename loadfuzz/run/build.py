"""Build the C harness: one recipe, compiled on first use into the user's cache.

The source ships inside the package (`loadfuzz/run/harness.c`, the project's
`harness_c/harness.c`), so an installed wheel needs only a C compiler. The
binary's name carries a hash of the source and the recipe: a changed source
or recipe builds a new one, and two processes building at once both end up
with a whole binary (each compiles to a file of its own, then renames).

    python -m loadfuzz.run.build [--strict]   # prints the binary's path
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from loadfuzz import entries, hostenv

CFLAGS = ("-std=c11", "-O2", "-Wall", "-Wextra")
# The harness's fork-handler counters must come before the C library's in the global scope.
LIBS = ("-ldl", "-Wl,--export-dynamic-symbol=__register_atfork",
        "-Wl,--export-dynamic-symbol=pthread_atfork")
SEAL = b"\nloadfuzz-harness-sha256:"
# The machine ran out of something: not the cache folder's fault, so not "cannot store" (the
# command line says what to do about each)
EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})


class BuildFailed(RuntimeError):
    """The harness could not be compiled or stored: the message says why and what to do."""


def source() -> bytes:
    return resources.files("loadfuzz.run").joinpath("harness.c").read_bytes()


def compiler() -> list[str]:
    """$CC as make takes it (a command with its arguments: `ccache gcc`, `gcc -m64`), or gcc."""
    return shlex.split(os.environ.get("CC", "")) or ["gcc"]


def recipe(output: Path, source_path: Path, strict: bool = False) -> list[str]:
    """The one command line that compiles the harness (`strict`: warnings are errors)."""
    return [*compiler(), *CFLAGS, *(["-Werror"] if strict else []), "-o", str(output),
            str(source_path), *LIBS]


def harness_binary(strict: bool = False) -> Path:
    """The compiled harness for the shipped source, built into the cache if it is not there."""
    text = source()
    digest = hashlib.sha256(text + "\0".join(recipe(Path("out"), Path("in.c"))).encode())
    binary = hostenv.cache_folder() / f"harness-{digest.hexdigest()[:16]}"
    if os.access(binary, os.X_OK) and whole(binary):
        return binary
    try:
        binary.parent.mkdir(parents=True, exist_ok=True)
        sweep(binary.parent)
        with tempfile.TemporaryDirectory(prefix=".harness-", dir=binary.parent) as scratch:
            source_path, output = Path(scratch) / "harness.c", Path(scratch) / "harness"
            source_path.write_bytes(text)
            done = subprocess.run(recipe(output, source_path, strict), capture_output=True,
                                  text=True)
            if done.returncode != 0:
                first = next((line for line in done.stderr.splitlines() if line.strip()), "")
                said = f": {first}" if first else f" (exit status {done.returncode})"
                raise BuildFailed(f"cannot compile the harness with {shlex.join(compiler())}{said};"
                                  " install gcc, or set CC to a C compiler that works")
            seal(output)
            if binary.is_dir() and not binary.is_symlink():  # (no file replaces a folder)
                shutil.rmtree(binary)
            os.replace(output, binary)
    except FileNotFoundError as exc:
        raise BuildFailed(f"cannot compile the harness: no C compiler ({exc.filename}); "
                          "install gcc or set CC") from None
    except OSError as exc:
        if exc.errno in EXHAUSTED:
            raise
        raise BuildFailed(f"cannot store the harness in {binary.parent}: {exc.strerror or exc}; "
                          "set XDG_CACHE_HOME to a writable folder") from None
    return binary


def seal(binary: Path) -> None:
    """Append the binary's own digest to it (after the ELF's last byte, where nothing reads)."""
    data = binary.read_bytes()
    binary.write_bytes(data + SEAL + hashlib.sha256(data).hexdigest().encode())


def whole(binary: Path) -> bool:
    """Whether the binary ends in the seal of its contents (not cut short, nor replaced). A
    binary that cannot be read for want of file descriptors or memory is an error, not a
    reason to build it again."""
    try:
        data = entries.read_regular(binary)
    except OSError as exc:
        if exc.errno in EXHAUSTED:
            raise
        return False
    body, sep, digest = data.rpartition(SEAL)
    return bool(sep) and hashlib.sha256(body).hexdigest().encode() == digest


def sweep(folder: Path) -> None:
    """Remove build folders older than an hour: a build killed before it could clean up."""
    for left in folder.glob(".harness-*"):
        with contextlib.suppress(OSError):
            if time.time() - left.stat().st_mtime > 3600:
                shutil.rmtree(left)


def main(argv: list[str]) -> int:
    try:
        print(harness_binary(strict="--strict" in argv))
    except BuildFailed as exc:
        print(f"loadfuzz: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
