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
before forking. Whether a step does is asked of the step itself, once per campaign: a
*probe* runs it in a server whose interpreter is started, recording every module the
import system looks for, up to the moment torch's own code would start to run, and ends
there (`PROBE`). What it compares at that moment is a list (below): a step that changes
something else before torch that torch's import depends on (a stdlib function it
replaces, say) is not seen. Nor is code of the step's own, run before its `import torch`,
that looks at torch itself: from the warm server it finds torch already in `sys.modules`.
Where that makes the trial fail, the failure is confirmed cold and the cold run's record
kept (a package that must be imported before torch); where it makes a trial clean that
fails cold (one that insists on torch being imported already), the fast record stands.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loadfuzz import hostenv
from loadfuzz.elf.cache import ElfCache
from loadfuzz.elf.loader import SearchPath, link_all
from loadfuzz.elf.read import BadElf, ElfReader
from loadfuzz.run.harness import HarnessStep, Preload

START = ""  # the source of a preload that only starts the interpreter
IMPORT_TORCH = "import torch\n"
MARK = b"LOADFUZZ-TORCH-FIRST "

# Runs a step's source while a finder first in sys.meta_path notes every module looked for
# and hands out torch's spec with a loader of its own: at the moment torch's own code would
# start to run, it says whether torch came before any extension module that is not the
# stdlib's, with nothing that importing torch depends on changed since the interpreter
# started: the dlopen flags, the environment (os.environ and the C library's), the import
# system (sys.path, its hooks and finders, `__import__`), sys.modules but for what was
# imported, and what else the step may set that an import can see (the recursion limit,
# warning filters, how warnings are shown or recorded, signal handlers, resource limits,
# the working folder, the standard streams, a tracer, the locale, faulthandler), and nothing
# opened with ctypes. It prints the objects mapped since (the stdlib's extension modules and
# their libraries) for `probe_says`.
# Then it ends the process: the answer depends on nothing after that moment, and importing
# torch itself costs a second or two. Only the step's own process answers (torch imported
# in a child it forks is not torch imported first). A step that only looks torch up
# (importlib.util.find_spec) never runs torch's code, and is answered at its end: not first.
PROBE = """\
import builtins as _builtins, faulthandler as _faulthandler, importlib.machinery as _machinery
import locale as _locale, os as _os, resource as _resource, signal as _signal, sys as _sys
import ctypes as _ctypes, json as _json, sysconfig as _sysconfig, warnings as _warnings
_STDLIB = _os.path.realpath(_sysconfig.get_config_var('DESTSHARED')) + '/'
_LIMITS = [getattr(_resource, n) for n in dir(_resource) if n.startswith('RLIMIT_')]
_PID = _os.getpid()  # the step's own process: a child it forks answers nothing
_ENVIRON = _ctypes.POINTER(_ctypes.c_char_p).in_dll(_ctypes.CDLL(None), 'environ')
_OPENED = []  # what the step opened with ctypes (CDLL and its kin, or _ctypes.dlopen)
def _recorded_dlopen(*args, _dlopen=_ctypes._dlopen):
    _OPENED.append(args)
    return _dlopen(*args)
_ctypes._dlopen = _sys.modules['_ctypes'].dlopen = _recorded_dlopen
def _c_environment():  # (os.putenv changes it, not os.environ)
    found = []
    while _ENVIRON[len(found)] is not None:
        found.append(_ENVIRON[len(found)])
    return found
def _state():
    with open('/proc/self/maps') as maps:
        mapped = {{line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) > 5}}
    hooks = [finder for finder in _sys.meta_path if finder is not _Seen]
    try:
        here = _os.getcwd()
    except OSError:
        here = None
    return (_sys.getdlopenflags(), dict(_os.environ), _c_environment(),
            list(_sys.path), list(_sys.path_hooks), hooks, _builtins.__import__,
            _sys.getrecursionlimit(), list(_warnings.filters), _warnings.showwarning,
            getattr(_warnings, '_showwarnmsg_impl', None),
            [_signal.getsignal(s) for s in _signal.valid_signals()],
            [_resource.getrlimit(n) for n in _LIMITS], here,
            (_sys.stdin, _sys.stdout, _sys.stderr), _sys.gettrace(), _sys.getprofile(),
            _locale.setlocale(_locale.LC_ALL), _faulthandler.is_enabled(),
            _sys.dont_write_bytecode, list(_OPENED), mapped, set(_sys.modules))
# a module that is no extension module but the stdlib's own (a name looked up and never
# imported, org.python.core, loaded nothing that stays: the objects mapped say what did)
def _plain(name):
    where = getattr(_sys.modules.get(name), '__file__', None) or ''
    return (_os.path.realpath(where).startswith(_STDLIB)
            or not where.endswith(tuple(_machinery.EXTENSION_SUFFIXES)))
# a new entry of sys.modules that the step's imports account for: a name looked up, one the
# package it is in made (typing.io), or another name of a module there before (__mp_main__)
def _imported(name, before):
    module = _sys.modules[name]
    return (name in _Seen.names or name.rpartition('.')[0] in _Seen.names
            or any(module is _sys.modules.get(old) for old in before))
def _unchanged(before, after):  # (objects mapped since: see `probe_says`)
    *same, _, modules = after
    return same == list(before[:-2]) and all(_imported(n, before[-1]) for n in modules - before[-1])
def _answer(first, mapped=()):
    if _os.getpid() == _PID:
        new = sorted(set(mapped) - _before[-2])
        stdlib = [path for path in new if path.startswith(_STDLIB)]
        others = [path for path in new if not path.startswith(_STDLIB)]
        print('LOADFUZZ-TORCH-FIRST', int(first), _json.dumps([stdlib, others]), flush=True)
class _Runs:
    def __init__(self, loader):
        self.loader = loader
    def create_module(self, spec):
        return self.loader.create_module(spec)
    def exec_module(self, module):
        now = _state()
        _answer(all(_plain(n) for n in _Seen.names if n != 'torch')
                and _unchanged(_before, now), now[-2])
        _os._exit(0)
class _Seen:
    names = []
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        cls.names.append(name)
        if name != 'torch':
            return None
        for finder in _sys.meta_path[_sys.meta_path.index(cls) + 1:]:
            spec = getattr(finder, 'find_spec', lambda *_: None)(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Runs(spec.loader)
                return spec
        return None
_before = _state()
_sys.meta_path.insert(0, _Seen)
try:
    exec(compile({source!r}, '<loadfuzz step>', 'exec'), {{'__name__': '__loadfuzz__'}})
except BaseException:
    pass
_answer(False)
"""


def probe_says(output: bytes, reader: ElfReader | None = None) -> bool:
    """What a probe's output says: True when the step imports torch first, every object it
    mapped before torch being one of the stdlib's extension modules or a library they need
    (`explained`; `reader`: by default one through the ELF cache)."""
    lines = [line for line in output.splitlines() if line.startswith(MARK)]
    if not lines or not lines[-1][len(MARK):].startswith(b"1 "):
        return False
    try:
        stdlib, others = json.loads(lines[-1][len(MARK) + 2:])
    except (TypeError, ValueError):  # (a line of the step's own that starts as the probe's do)
        return False
    lib = hostenv.torch_lib_dir()
    bundled = frozenset(path.name for path in lib.iterdir()) if lib is not None else frozenset()
    return explained(stdlib, others, reader or ElfReader(ElfCache.default()), bundled)


def explained(stdlib: list[str], others: list[str], reader: ElfReader,
              bundled: frozenset[str]) -> bool:
    """Whether the objects a step mapped before torch leave torch's import as it is in a
    server: each of `others` one that the loader finds for the stdlib's extension modules
    `stdlib` (their search lists, as a trial's loader resolves them: OpenSSL's libssl.so.3
    under `_ssl`, where Python was built against the system's), loaded RTLD_LOCAL as their
    dependency, so that it takes no part in torch's lookups; and none of them named as, or
    needing, a library torch brings (`bundled`: the first loaded would answer for both, so
    torch's copy and the system's would trade places). Anything else (a data file) is a
    change. (A library the step opened itself, with ctypes, never comes here: the probe
    answers no.)"""
    try:
        roots = [reader.facts(Path(path)) for path in stdlib]
        link_map = link_all(roots, reader, SearchPath.for_trials())
        found = {obj.identity: obj for root in roots for obj in link_map.search_list(root)[0]}
        mapped = [reader.facts(Path(path)) for path in others]
    except BadElf:
        return False
    names = {name for obj in found.values() for name in (obj.soname, obj.path.name, *obj.needed)}
    return all(obj.identity in found for obj in mapped) and names.isdisjoint(bundled)


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
