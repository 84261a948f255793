"""What the tests share: where the real wheel and the fixture libraries are, how to name steps,
how to run the CLI as a user would, and a synthetic campaign for the report writers.

Imported by the test modules (`from support import ...`); pytest fixtures live in conftest.py.
"""

from __future__ import annotations

import html.parser
import importlib.util
import os
import re
import shlex
import subprocess
import sysconfig
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from loadfuzz import hostenv
from loadfuzz.elf.cache import ElfCache
from loadfuzz.elf.read import ElfReader
from loadfuzz.expect import Expectation, load_expectations, match_expectations
from loadfuzz.model import Flags, Outcome, Role, Step, StepKind, TrialRecord
from loadfuzz.run.harness import HarnessStep
from loadfuzz.run.standins import a_copy
from loadfuzz.run.trials import Trials

C_LIBRARY = re.compile(r"/(libc|libdl|libpthread|librt|libm)\.so|/ld-linux")
ROOT = Path(__file__).resolve().parent.parent
SITE = Path(sysconfig.get_paths()["purelib"])
ET = SITE / "executorch"
FIXTURES = ROOT / "build" / "fixtures"
LEGACY_PLUGIN = FIXTURES / "legacy" / "libquantized_ops_legacy_plugin.so"
QUANTIZED = ET / "lib" / "libexecutorch_kernels_quantized.so"
AOT = ET / "kernels" / "quantized" / "libquantized_ops_aot_lib.so"
EXTENSION = ET / "extension" / "pybindings" / "_C.cpython-311-x86_64-linux-gnu.so"
LOADFUZZ = ROOT / ".venv" / "bin" / "loadfuzz"


def step(path: Path, flags: Flags = Flags.GLOBAL, kind: StepKind = StepKind.DLOPEN) -> Step:
    path = Path(path).absolute()
    return Step(kind, str(path), flags, path)


def hostile(name: str) -> Path:
    return FIXTURES / "hostile" / f"libfx_{name}.so"


@dataclass(frozen=True)
class Lib:
    """A library as the planner needs it: an id and a path (an inventory Library has more)."""

    id: str
    path: Path
    role: Role = Role.OTHER


def processes_holding(path: Path) -> list[int]:
    """The processes that have `path` mapped (a library still loaded somewhere)."""
    holders = []
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            if str(path) in maps.read_text():
                holders.append(int(maps.parent.name))
        except OSError:
            continue
    return holders


def alive(processes):
    """The processes still running (a zombie has ended; only its entry waits to be reaped)."""
    running = []
    for proc in processes:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                running.append(proc)
        except psutil.NoSuchProcess:
            continue
    return running


def children_now() -> set[int]:
    """The pids of every process below this one, now."""
    return {proc.pid for proc in psutil.Process().children(recursive=True)}


def alive_children(before: set[int]):
    """The processes below this one still running that were not there `before`."""
    return alive(proc for proc in psutil.Process().children(recursive=True)
                 if proc.pid not in before)


def loadfuzz(*args: str, cwd: Path | None = None, timeout: float = 600,
             env: dict[str, str] | None = None):
    """Run the CLI as a user would; returns the CompletedProcess (text)."""
    return subprocess.run([str(LOADFUZZ), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=env)


# --- the three paths a trial can take ---------------------------------------------------

PATHS = ["cold", "fork-server", "shared-prefix"]


class SharedPrefixTrials:
    """`Trials` on the shared-prefix path: a sequence of two or more steps is a row of its own,
    forked from a row server that took its first step, and must say so in its record. The row
    runs it twice: the second trial is sent while the first runs (see `Harness.run_each`), and
    whatever the first did, the second must end the same way."""

    def __init__(self, trials: Trials):
        self.trials = trials

    def run(self, seq):
        if self.trials.row_key(seq) is None:
            return self.trials.run(seq)
        record, again = self.trials.run_row([seq, seq])
        assert record.via.startswith("shared prefix"), record.via
        assert (again.outcome, again.step, again.signal, again.exit_code, again.signature) == (
            record.outcome, record.step, record.signal, record.exit_code, record.signature)
        return record


@contextmanager
def trials_on(path: str, limits, **options):
    """A runner of trials on one of PATHS."""
    with Trials(limits, cold=path == "cold", **options) as trials:
        yield SharedPrefixTrials(trials) if path == "shared-prefix" else trials


# --- a synthetic campaign for the report writers -----------------------------------------

EXPECTATIONS = ROOT / "results" / "expectations" / "executorch.toml"
PLUGIN = "extra/libquantized_ops_legacy_plugin.so"
# A library id as awkward as a path can make one: spaces, a newline, markup, non-ASCII.
AWKWARD = "extra/my plugin\n<légacy> & \"quoted\" 'x' `tick`.so"
KQ = "lib/libexecutorch_kernels_quantized.so"
AOT_ID = "kernels/quantized/libquantized_ops_aot_lib.so"


def executorch_ids() -> list[str]:
    """The library ids of the installed wheel: its .so paths relative to the package folder."""
    spec = importlib.util.find_spec("executorch")
    assert spec is not None and spec.submodule_search_locations, "executorch is not installed"
    root = Path(next(iter(spec.submodule_search_locations)))
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.so"))


# The wheel's libraries plus the legacy plugin: how many, and how many ordered pairs under
# both flags modes (derived from the installed wheel, never written down).
WITH_PLUGIN = len(executorch_ids()) + 1
PAIRS_WITH_PLUGIN = WITH_PLUGIN * (WITH_PLUGIN - 1) * 2


def record(first: str, second: str, flags: str, outcome: Outcome = Outcome.CLEAN,
           **verdict: object) -> TrialRecord:
    mode = Flags(flags)
    steps = (Step(StepKind.DLOPEN, first, mode), Step(StepKind.DLOPEN, second, mode))
    fields = {"step": None, "signature": None, "op": None, "signal": None, "exit_code": None,
              "detail": "", **verdict}
    repro = shlex.join([".venv/bin/loadfuzz", "run", "--target", "executorch", "--add",
                        f"/tmp/fixtures/{second.rsplit('/', 1)[-1]}",
                        f"{flags}:{first}", f"{flags}:{second}"])
    return TrialRecord(sequence=steps, outcome=outcome, duration_s=0.05, peak_rss_mb=90.5,
                       repro=repro, **fields)


def reregister(first: str, second: str, flags: str) -> TrialRecord:
    return record(first, second, flags, Outcome.REREGISTER, step=1,
                  signature="executorch-reregister", op="quantized_decomposed::add.out",
                  signal=6, detail="Re-registering quantized_decomposed::add.out")


def campaign(extra: str = PLUGIN, not_run: int = 2) -> tuple[dict, list[dict]]:
    """(summary, trials) of a finished `matrix` over the wheel plus `extra`, both flags modes.

    The plugin collides with the run-time quantized kernels and with the aot
    library (expected); five other pairs end in each of the other outcomes
    (unexpected); the last `not_run` pairs of the local panel never ran; one
    expectation, for a collision that went away, is stale.
    """
    ids = [*executorch_ids(), extra]
    python_ext = "extension/pybindings/_C.cpython-311-x86_64-linux-gnu.so"
    training = "extension/training/pybindings/_training_lib.cpython-311-x86_64-linux-gnu.so"
    special = {
        (KQ, extra, "global"): reregister(KQ, extra, "global"),
        (extra, KQ, "global"): reregister(extra, KQ, "global"),
        (KQ, extra, "local"): reregister(KQ, extra, "local"),
        (extra, KQ, "local"): reregister(extra, KQ, "local"),
        (AOT_ID, extra, "global"): reregister(AOT_ID, extra, "global"),
        (extra, AOT_ID, "local"): reregister(extra, AOT_ID, "local"),
        (python_ext, training, "global"): record(
            python_ext, training, "global", Outcome.CRASH, step=1, signal=11,
            detail="killed by SIGSEGV during step 1"),
        ("lib/libexecutorch_backend_qnn.so", "lib/libexecutorch.so", "local"): record(
            "lib/libexecutorch_backend_qnn.so", "lib/libexecutorch.so", "local",
            Outcome.LOAD_ERROR, step=0,
            detail="libQnnHtp.so: cannot open shared object file: No such file or directory"),
        ("lib/libexecutorch_etdump.so", training, "global"): record(
            "lib/libexecutorch_etdump.so", training, "global", Outcome.ABORT, step=1, signal=6,
            detail="terminate called after throwing an instance of 'std::bad_alloc'"),
        ("lib/libexecutorch_threadpool.so", extra, "local"): record(
            "lib/libexecutorch_threadpool.so", extra, "local", Outcome.EXIT, step=1,
            exit_code=3, detail="the process exited with status 3 during step 1"),
        (training, "lib/libexecutorch_backend_xnnpack.so", "global"): record(
            training, "lib/libexecutorch_backend_xnnpack.so", "global", Outcome.TIMEOUT, step=1,
            detail="step 1 did not finish within 30 s"),
    }
    named = {lib for first, second, _ in special for lib in (first, second)}
    assert named <= set(ids), f"the wheel lacks {sorted(named - set(ids))}"
    pairs = [(a, b, m) for m in ("global", "local") for a in ids for b in ids if a != b]
    skipped = [p for p in pairs if p not in special][len(pairs) - len(special) - not_run:]
    trials = [special.get(p) or record(*p) for p in pairs if p not in skipped]
    findings = [t for t in trials if not t.clean]
    gone = Expectation(first="lib/libexecutorch_backend_xnnpack.so",
                       second="lib/libexecutorch_threadpool.so", orders="both", flags=(),
                       outcome=Outcome.ABORT, op=None, source="executorch.toml:entry 3",
                       why="The thread pool used to abort when loaded after the XNNPACK delegate.")
    expected, unexpected, stale = match_expectations(
        findings, [*load_expectations(EXPECTATIONS), gone])
    summary = {
        "target": "executorch",
        "libraries": ids,
        "flags": ["global", "local"],
        "trials": len(trials),
        "findings": [t.to_json() for t in findings],
        "unexpected": [t.to_json() for t in unexpected],
        "stale": [e.to_json() for e in stale],
        "command": "matrix",
        "version": "1.5.1",
        "expected": [{"record": t.to_json(), "why": e.why} for t, e in expected],
        "preload": [],
        "throughput": 11.4,
        "started": "2025-01-01T10:00:00Z",
        "finished": "2025-01-01T10:01:00Z",
    }
    return summary, [t.to_json() for t in trials]


def large_campaign(libraries: int = 120, ran: int = 600) -> tuple[dict, list[dict]]:
    """(summary, trials) of one shard of a `matrix --flags global` over `libraries` no-op
    libraries: its first `ran` pairs, clean but one unexpected collision (the second pair)."""
    ids = [f"lib/libnoop{i:03d}.so" for i in range(libraries)]
    pairs = [(a, b) for a in ids for b in ids if a != b][:ran]
    trials = [record(a, b, "global") for a, b in pairs]
    trials[1] = reregister(*pairs[1], "global")
    summary = {"target": "noop", "libraries": ids, "flags": ["global"], "trials": len(trials),
               "findings": [trials[1].to_json()], "unexpected": [trials[1].to_json()],
               "stale": [], "command": "matrix", "version": None, "shard": "1/27",
               "expected": [], "preload": [], "throughput": 500.0}
    return summary, [t.to_json() for t in trials]


class Cells(html.parser.HTMLParser):
    """The heatmap cells of a matrix.html: the attributes of every <td data-outcome>."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[dict[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if tag == "td" and "data-outcome" in values:
            self.cells.append(values)


def cells_of(page: str) -> list[dict[str, str]]:
    parser = Cells()
    parser.feed(page)
    return parser.cells


def pair_key(first: str, second: str, flags: str) -> tuple:
    return tuple(("dlopen", lib, flags) for lib in (first, second))


# --- an independent loader: what a plain process that dlopens the same files does ----------

LOADER = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {  /* loader g:PATH l:PATH ...: dlopen each, RTLD_NOW */
    for (int i = 1; i < argc; i++)
        if (!dlopen(argv[i] + 2, RTLD_NOW | (argv[i][0] == 'g' ? RTLD_GLOBAL : RTLD_LOCAL))) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
    return 0;
}
"""


def build_loader(folder: Path) -> Path:
    """The test's own loader (`loader g:PATH l:PATH ...`), built in `folder`."""
    (folder / "loader.c").write_text(LOADER)
    subprocess.run(["gcc", "-o", str(folder / "loader"), str(folder / "loader.c"), "-ldl"],
                   check=True)
    return folder / "loader"


def what_the_loader_did(loader: Path, steps: list[HarnessStep], scratch: Path) -> tuple[set, list]:
    """Every symbol binding ld.so made (who, to whom, which name) and the constructors it ran
    (the C library's aside), for a process that takes these steps."""
    log = scratch / "ld"
    env = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(hostenv.torch_lib_dir()),
           "LD_DEBUG": "bindings,files", "LD_DEBUG_OUTPUT": str(log)}
    done = subprocess.run([str(loader), *(f"{s.mode}:{s.path}" for s in steps)], env=env,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [text] = [p.read_text() for p in scratch.glob("ld.*")]
    for p in scratch.glob("ld.*"):
        p.unlink()
    bindings = set(re.findall(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: \S+ symbol `([^']+)'", text))
    inits = [path for path in re.findall(r"calling init: (\S+)", text) if not C_LIBRARY.search(path)]
    return bindings, inits


# A library with an IFUNC whose resolver reads what the library's constructor set, and a
# plugin that needs the library and calls the function from its own constructor: the plugin
# aborts where its relocation resolved the IFUNC before the library's constructor ran (cold).
IFUNC_LIBRARY = r"""
static int ready;
__attribute__((constructor)) static void init(void) { ready = 1; }
static int early(void) { return 0; }
static int late(void) { return 1; }
static int (*pick(void))(void) { return ready ? late : early; }
int f(void) __attribute__((ifunc("pick")));
"""
IFUNC_PLUGIN = r"""
#include <stdlib.h>
int f(void);
__attribute__((constructor)) static void init(void) { if (!f()) abort(); }
"""


def bindings_that_moved(warm: set, cold: set) -> dict[tuple[str, str], tuple[str | None, str | None]]:
    """Per (object, name) bound otherwise in two of `what_the_loader_did`'s binding sets: the
    definer in each (None: not bound there)."""
    def by_name(bindings: set) -> dict[tuple[str, str], str]:
        return {(who, name): to for who, to, name in bindings}
    warm_to, cold_to = by_name(warm), by_name(cold)
    return {key: (warm_to.get(key), cold_to.get(key)) for key in warm_to.keys() | cold_to.keys()
            if warm_to.get(key) != cold_to.get(key)}


def only_copies_moved(moved: dict[tuple[str, str], tuple[str | None, str | None]]) -> list:
    """The moves of `bindings_that_moved` that are not between two copies of one thing (where
    one of the two definitions is a copy by `standins.a_copy`: C++'s one-definition rule)."""
    reader = ElfReader(ElfCache.default())
    return [(who, name, to) for (who, name), to in moved.items()
            if None in to or not any(a_copy(reader.facts(Path(path)), name) for path in to)]


def build(folder: Path, name: str, source: str, *link: str, cxx: bool = False) -> Path:
    """lib<name>.so in `folder`, from C source (C++ with `cxx`); `link`: more arguments
    (libraries)."""
    source_file = folder / f"{name}.{'cc' if cxx else 'c'}"
    source_file.write_text(source)
    lib = folder / f"lib{name}.so"
    subprocess.run(["g++" if cxx else "gcc", "-shared", "-fPIC", "-o", str(lib), str(source_file),
                    f"-L{folder}", "-Wl,-rpath,$ORIGIN", *link], check=True)
    return lib
