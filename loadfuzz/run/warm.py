"""Warm interpreters: which fork server a trial whose first step is Python can fork from with its
interpreter already started (and, in the heavy tier, torch already imported).

A trial whose first step (after libpython, RTLD_GLOBAL) is a Python step starts the
embedded interpreter as the very first thing it does. A server that did exactly that
before forking (the same program, environment, `sys.path` and `site`) gives each
such trial the process it would have made itself, without paying for it: a `y` step
in the server's preload (see the harness's `--preload-python`). Nothing else is
moved: a trial whose first step is a `dlopen` still starts its interpreter itself,
after that step, as its cold run does.

Importing torch costs seconds. When torch is not under test and a trial's first
Python step imports torch before anything of its own (no extension module of its own
is loaded before `import torch`, and nothing torch's import depends on has changed by
then: a package that sets RTLD_GLOBAL first imports another torch; e.g. ExecuTorch's
`_llm_runner`, whose package imports torch first), the heavy server imports torch too
before forking. Whether a
step does is asked of the step itself, once per campaign: a *probe* runs it in a
server whose interpreter is started, recording every module the import system looks
for (`PROBE`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loadfuzz.run.harness import HarnessStep, Preload

START = ""  # the source of a preload that only starts the interpreter
IMPORT_TORCH = "import torch\n"
MARK = b"LOADFUZZ-TORCH-FIRST "

# Runs a step's source while a finder first in sys.meta_path notes every module looked
# for, and the state of the process when `torch` is first looked for; then says whether
# `torch` came before any extension module that is not the stdlib's, with nothing that
# importing torch depends on changed by then: the dlopen flags, the environment, the import
# system, the shared objects mapped (ctypes.CDLL), and sys.modules but for what was imported.
# The answer depends on nothing after that moment, so the probe ends the step there (`_Stop`):
# it never pays for importing torch itself (a second or two), only for what comes before it.
PROBE = """\
import importlib.machinery as _machinery, os as _os, sys as _sys
class _Stop(BaseException):
    pass
def _state():
    with open('/proc/self/maps') as maps:
        mapped = {{line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) > 5}}
    hooks = [finder for finder in _sys.meta_path if finder is not _Seen]
    return (_sys.getdlopenflags(), dict(_os.environ), list(_sys.path), list(_sys.path_hooks),
            hooks, mapped, set(_sys.modules))
def _plain(name):
    module = _sys.modules.get(name)
    where = getattr(module, '__file__', None) or ''
    return module is not None and (where.startswith(_sys.base_prefix) or not where.endswith(
        tuple(_machinery.EXTENSION_SUFFIXES)))
def _unchanged(before, after):  # (new objects may be the stdlib's own extension modules)
    *same, mapped, modules = after
    return same == list(before[:-2]) and all(
        path.startswith(_sys.base_prefix + '/') for path in mapped - before[-2]) and (
        modules - before[-1] <= set(_Seen.names))
class _Seen:
    names = []
    first = stopped = False
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == 'torch' and not cls.stopped:
            cls.stopped = True
            cls.first = all(_plain(n) for n in cls.names) and _unchanged(_before, _state())
            raise _Stop
        cls.names.append(name)
_before = _state()
_sys.meta_path.insert(0, _Seen)
try:
    exec(compile({source!r}, '<loadfuzz step>', 'exec'), {{'__name__': '__loadfuzz__'}})
except BaseException:
    pass
_sys.meta_path.remove(_Seen)
print('LOADFUZZ-TORCH-FIRST', int(_Seen.first), flush=True)
"""


def probe_says(output: bytes) -> bool:
    """What a probe's output says: True when the step imports torch first."""
    lines = [line for line in output.splitlines() if line.startswith(MARK)]
    return bool(lines) and lines[-1] == MARK + b"1"


@dataclass
class WarmPython:
    """The warm preloads of one runner; remembers each probe's answer (thread-safe)."""

    libpython: Path | None
    torch_under_test: bool  # then no server imports torch
    probing: bool = True  # False: a step no probe has answered for yet is taken as not first
    _torch_first: dict[str, bool] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def preload(self, base: Preload, steps: list[HarnessStep], prelude: int, heavy: bool,
                probe: Callable[[Preload, HarnessStep], bytes]) -> Preload:
        """The preload for a trial of harness steps `steps` (the first `prelude` of them
        prerequisites) whose tier's preload is `base`: `base` itself unless its first step is
        Python; then `base`, libpython and a started interpreter, with torch imported when the
        server is heavy and the step imports torch first (`probe(preload, step)` runs a step
        in a server with that preload and returns its output)."""
        if self.libpython is None or prelude >= len(steps) or steps[prelude].mode != "y":
            return base
        library = HarnessStep("g", self.libpython)
        started = (*base, *(() if library in base else (library,)),
                   HarnessStep("y", self.libpython, START))
        if not heavy or self.torch_under_test or not self._imports_torch_first(
                steps[prelude], lambda step: probe(started, step)):
            return started
        return (*started[:-1], HarnessStep("y", self.libpython, IMPORT_TORCH))

    def answers(self) -> dict[str, bool]:
        """What the probes said so far, by step source (for another runner: `learn`)."""
        with self._lock:
            return dict(self._torch_first)

    def learn(self, answers: dict[str, bool]) -> None:
        """Take the probes' answers of another runner of the same campaign."""
        with self._lock:
            self._torch_first.update(answers)

    def _imports_torch_first(self, step: HarnessStep, run: Callable[[HarnessStep], bytes]) -> bool:
        with self._lock:
            known = self._torch_first.get(step.code)
        if known is None and not self.probing:
            return False  # until another runner's probe says so (`learn`)
        if known is None:
            known = probe_says(run(HarnessStep("y", step.path, PROBE.format(source=step.code))))
            with self._lock:
                self._torch_first[step.code] = known
        return known
