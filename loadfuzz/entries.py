"""Cache entries on disk: one file of plain values under a key, written whole, read back only whole.

Shared by the caches in the cache folder (`elf.cache`, what is read from one
ELF file; `derived`, what is derived from many files). An entry is MAGIC, the
length of the pickled head, the head (the key, then the CRC and length of the
payload), then the pickled payload. `write` goes through a temporary file
renamed over the old entry (`os.replace`), so concurrent commands only ever
see whole entries; `read` gives the payload only when the file holds exactly
the wanted key and an intact payload, else None. Entries are pickles of plain
values (tuples, strings, numbers, frozensets...): `PlainData` refuses to name
any class, so loading an entry runs no code.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import pickle
import stat
import struct
import tempfile
import zlib
from pathlib import Path

MAGIC = b"loadfuzz-elf-cache\n"
# What was read from a file changed less than this long ago is not kept (the file may be
# being written still; as git does for "racily clean" files).
SETTLE_NS = 2_000_000_000
LENGTH = struct.Struct("<Q")  # the length of the pickled head, after MAGIC


class PlainData(pickle.Unpickler):
    """Unpickles builtin values only (tuples, strings, numbers, frozensets): it names no class."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"{module}.{name}: a cache entry holds plain values only")


def read_regular(path: Path) -> bytes:
    """The bytes of a regular file; OSError for anything else at `path` (a FIFO would block
    the command for good, /dev/zero never end), which a cache treats as no entry."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as stream:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return stream.read()


def read(entry: Path, key: tuple) -> object | None:
    """The payload kept in `entry` under exactly this key, or None (none, another key, torn,
    corrupt, unreadable)."""
    try:
        blob = read_regular(entry)
    except OSError:
        return None
    try:
        if not blob.startswith(MAGIC):
            return None
        start = len(MAGIC) + LENGTH.size
        (head_length,) = LENGTH.unpack_from(blob, len(MAGIC))
        head = PlainData(io.BytesIO(blob[start:start + head_length])).load()
        if not isinstance(head, tuple) or head[:-2] != key:
            return None
        crc, length = head[-2:]
        payload = memoryview(blob)[start + head_length:]
        if len(payload) != length or zlib.crc32(payload) != crc:
            return None
        return PlainData(io.BytesIO(payload)).load()
    except Exception:  # whatever the unpickler raises on bytes it did not write (OverflowError,
        return None    # UnpicklingError, EOFError, ...): a damaged entry, read again from the file


def write(entry: Path, key: tuple, payload: object) -> None:
    """Write an entry whole (a temporary file beside it, then renamed over it); an unwritable
    folder means nothing is kept."""
    data = pickle.dumps(payload, protocol=5)
    head = pickle.dumps((*key, zlib.crc32(data), len(data)), protocol=5)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=".writing-", dir=entry.parent)
    except OSError:
        return
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(MAGIC + LENGTH.pack(len(head)) + head)
            stream.write(data)
        os.replace(temporary, entry)
    except OSError:
        forget(temporary)
    except BaseException:
        forget(temporary)
        raise


def forget(temporary: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(temporary)
