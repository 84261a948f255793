"""Read what glibc's dynamic loader said about one trial: which objects came in, how, and where symbols bound.

A trial run with `LD_DEBUG=files,libs,bindings` (and `LD_DEBUG_OUTPUT` set)
leaves the loader's own account of the process behind, independent of
loadfuzz's ELF reading:

    file=libexecutorch.so [0];  needed by /x/libexecutorch_kernels_quantized.so [0]
    file=/x/plugin.so [0];  dynamically loaded by ./harness [0]
    calling init: /x/plugin.so
    binding file /x/plugin.so [0] to /x/libexecutorch.so [0]: normal symbol `_ZN10executorch...'

`parse` turns those lines into a `LoaderTrace`: every object in the order it
arrived and why (a `dlopen`, or as whose dependency), the constructor running
when the process ended, and the bindings a caller chose to keep (`keep`: the
output for libtorch runs to hundreds of thousands of bindings). It is a pure
function of the text, tested on recorded output.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

DEBUG_CATEGORIES = "files,libs,bindings"
MOST_BINDINGS = 500  # kept per trial, but for those `keep` ranks ALWAYS
ALWAYS = 2  # a rank `keep` may give a binding that must be kept whatever the count

_ARRIVAL = re.compile(r"file=(?P<name>.+?) \[\d+\];  (?P<how>needed|dynamically loaded) by (?P<by>.+?) \[\d+\]$")
_MAPPED = re.compile(r"file=(?P<name>.+?) \[\d+\];  generating link map$")
_TRYING = re.compile(r"trying file=(?P<path>.+)$")
_INIT = re.compile(r"calling init: (?P<path>.+?)(?: \[\d+\])?$")
_BINDING = re.compile(r"binding file (?P<caller>.+?) \[\d+\] to (?P<target>.+?) \[\d+\]: "
                      r"(?:normal|protected) symbol `(?P<symbol>[^']+)'")


@dataclass(frozen=True)
class Arrival:
    """One object the loader mapped: `by` dlopen()ed it, or needed it (DT_NEEDED)."""

    path: str  # the file the loader mapped (as it opened it)
    dlopened: bool
    by: str  # the caller of dlopen (the program, libpython, ...) or the object that needed it


@dataclass(frozen=True)
class Binding:
    caller: str  # the object whose reference was bound
    symbol: str  # the mangled name
    target: str  # the object whose definition it got


@dataclass(frozen=True)
class LoaderTrace:
    arrivals: tuple[Arrival, ...]
    last_init: str | None  # the constructor that ran last (when the process died: the culprit)
    bindings: tuple[Binding, ...]

    def bound(self, symbol: str) -> dict[str, str]:
        """caller -> target, for every kept binding of `symbol`."""
        return {b.caller: b.target for b in self.bindings if b.symbol == symbol}


def keep_none(caller: str, symbol: str, target: str) -> int:
    return 0


def split_binding(line: str) -> Binding | None:
    """`binding file A [0] to B [0]: normal symbol `s' [V]` -> Binding(A, s, B). Split by hand:
    a regular expression per line costs seconds on libtorch's hundreds of thousands."""
    caller, sep, rest = line[len("binding file "):].partition(" [0] to ")
    target, sep2, rest = rest.partition(" [0]: ")
    start, end = rest.find("`"), rest.rfind("'")
    if sep and sep2 and 0 <= start < end:
        return Binding(caller, rest[start + 1:end], target)
    found = _BINDING.match(line)  # another link-map namespace than the default one
    return Binding(found["caller"], found["symbol"], found["target"]) if found else None


def parse(lines: Iterable[str], keep: Callable[[str, str, str], int] = keep_none,
          only: tuple[str, ...] | None = None) -> LoaderTrace:
    """The trace in `lines` (LD_DEBUG output, any number of processes' files concatenated).
    `keep(caller, symbol, target)` ranks a binding: false to drop it, true to keep it while
    fewer than MOST_BINDINGS are kept, ALWAYS to keep it anyway. It should be cheap: libtorch
    alone brings hundreds of thousands. `only`: a binding line that holds none of these
    strings is skipped unread (the cheapest test of all)."""
    arrivals: list[Arrival] = []
    pending: dict[str, tuple[bool, str]] = {}  # name as requested -> (dlopened, by)
    tried = ""
    last_init = None
    bindings: list[Binding] = []
    for raw in lines:
        if only is not None and "binding file " in raw and not any(s in raw for s in only):
            continue
        line = raw.partition(":\t")[2].rstrip("\n") if ":\t" in raw else raw.strip()
        if line.startswith("binding file "):
            binding = split_binding(line)
            rank = binding and keep(binding.caller, binding.symbol, binding.target)
            if rank and (rank >= ALWAYS or len(bindings) < MOST_BINDINGS):
                bindings.append(binding)  # type: ignore[arg-type]
        elif (found := _TRYING.search(line)) is not None:
            tried = found["path"]
        elif (found := _ARRIVAL.match(line)) is not None:
            pending[found["name"]] = (found["how"] != "needed", found["by"])
        elif (found := _MAPPED.match(line)) is not None and found["name"] in pending:
            name = found["name"]
            dlopened, by = pending.pop(name)
            arrivals.append(Arrival(name if "/" in name else tried, dlopened, by))
        elif (found := _INIT.match(line)) is not None:
            last_init = found["path"]
    return LoaderTrace(tuple(arrivals), last_init, tuple(bindings))


def read(path: Path, keep: Callable[[str, str, str], int] = keep_none,
         only: tuple[str, ...] | None = None) -> LoaderTrace:
    """The trace in one `LD_DEBUG_OUTPUT` file (the loader names it `<prefix>.<pid>`);
    empty when the file is not there."""
    try:
        with path.open(encoding="utf-8", errors="surrogateescape") as text:
            return parse(text, keep, only)
    except FileNotFoundError:
        return parse(())
