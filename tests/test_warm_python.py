"""A trial whose first step is Python forks from a server whose interpreter is already started,
and, when that step imports torch before anything of its own, with torch imported too: each such
trial must end as its cold run does, with the same output. A preload that a fork would not copy
whole (a thread, a process) or that fails is refused, and its trials go cold."""

import json
import signal
import subprocess
import sys
import sysconfig

import pytest

from loadfuzz import inventory
from loadfuzz.model import Flags, StepKind
from loadfuzz.run.harness import Harness, HarnessDied, HarnessStep, Limits, run_cold
from loadfuzz.run.tiers import Tiers
from loadfuzz.run.trials import Trials, harness_steps
from loadfuzz.run.warm import IMPORT_TORCH, PROBE, START, probe_says
from support import ET, EXTENSION, QUANTIZED, SITE, step

LLM_RUNNER = ET / "extension" / "llm" / "runner" / "_llm_runner.cpython-311-x86_64-linux-gnu.so"
TRAINING = ET / "extension" / "training" / "pybindings" / "_training_lib.cpython-311-x86_64-linux-gnu.so"
LIMITS = Limits(timeout_s=60)


def py(path):
    return step(path, Flags.LOCAL, StepKind.IMPORT)


@pytest.fixture(scope="module")
def trials():
    libraries = inventory.load_libraries([LLM_RUNNER, TRAINING, EXTENSION, QUANTIZED]).libraries
    with Trials(LIMITS, Tiers.of(libraries)) as runner:
        yield runner


def python_preload(trials, seq):
    """The source of the `y` step of the sequence's server's preload (None: it has none)."""
    found = [s.code for s in trials.route_of(seq).preload if s.mode == "y"]
    return found[0] if found else None


def test_only_a_first_step_that_imports_torch_before_its_own_extension_finds_torch_imported(
        trials):
    assert python_preload(trials, (py(LLM_RUNNER),)) == IMPORT_TORCH  # its package imports torch
    assert python_preload(trials, (py(TRAINING),)) == START  # its extension loads before torch
    assert python_preload(trials, (py(EXTENSION), step(QUANTIZED))) == START
    assert python_preload(trials, (step(QUANTIZED), py(LLM_RUNNER))) is None  # a dlopen comes first


@pytest.mark.parametrize("seq", [(py(LLM_RUNNER),), (py(TRAINING),), (py(LLM_RUNNER), py(TRAINING)),
                                 (py(EXTENSION), step(QUANTIZED, Flags.LOCAL))],
                         ids=["llm-runner", "training", "llm-runner-then-training", "C-then-dlopen"])
def test_a_python_first_trial_from_a_warm_server_ends_and_prints_as_its_cold_run(trials, seq):
    steps, prelude = harness_steps(seq, trials.tiers)
    with Harness(trials.route_of(seq).preload) as server:
        warm = server.run(steps, LIMITS, prelude)
    cold = run_cold(steps, LIMITS, prelude)
    assert (warm.started, warm.done, warm.error, warm.exit_code, warm.signal) == (
        cold.started, cold.done, cold.error, cold.exit_code, cold.signal)
    assert warm.output == cold.output


def test_a_python_preload_that_leaves_a_thread_running_is_refused(trials):
    libpython = trials.warm.libpython
    source = "import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\n"
    with pytest.raises(HarnessDied, match="the Python preload started a thread"):
        Harness([HarnessStep("g", libpython), HarnessStep("y", libpython, source)])


def test_a_python_preload_that_raises_is_refused_with_its_exception(trials):
    libpython = trials.warm.libpython
    with pytest.raises(HarnessDied, match="ModuleNotFoundError: No module named 'no_such_module'"):
        Harness([HarnessStep("g", libpython), HarnessStep("y", libpython, "import no_such_module")])


def test_a_warm_interpreter_sees_the_trial_s_own_home_and_tmpdir_as_a_cold_one_does(trials):
    # the server's interpreter read HOME and TMPDIR at its start: its trials all saw the
    # server's folder, which the first of them could fill for the next
    libpython = trials.warm.libpython
    show = ("import os, tempfile\n"
            "print(os.environ['HOME'] == os.environ['TMPDIR'] == os.getcwd() "
            "== tempfile.gettempdir() == os.path.expanduser('~'))\n")
    started = [HarnessStep("g", libpython),
               HarnessStep("y", libpython, "import tempfile\ntempfile.gettempdir()\n")]
    steps = [HarnessStep("g", libpython), HarnessStep("y", libpython, show)]
    with Harness(started) as server:
        warm = [server.run(steps, LIMITS, 1) for _ in range(2)]
    cold = run_cold(steps, LIMITS, 1)
    assert [run.output.strip() for run in (*warm, cold)] == [b"True"] * 3


def test_a_warm_interpreter_s_standard_streams_are_made_on_a_pipe_as_a_cold_one_s_are(trials):
    # Python notes what sys.stdout is on when it makes it: the server's stdout was a file,
    # so a warm trial's stdout said it was seekable where a cold one's is the capture pipe
    libpython = trials.warm.libpython
    show = ("import sys\nprint([s.seekable() for s in (sys.stdout, sys.stderr)],"
            " sys.stdout.buffer.raw._blksize, sys.stdout.line_buffering)\n")
    steps = [HarnessStep("g", libpython), HarnessStep("y", libpython, show)]
    with Harness([steps[0], HarnessStep("y", libpython, "print('STARTED')\n")]) as server:
        warm = server.run(steps, LIMITS, 1)
    cold = run_cold(steps, LIMITS, 1)
    assert cold.output.strip().startswith(b"[False, False]")
    assert warm.output == b"STARTED\n" + cold.output


@pytest.mark.parametrize(("init", "first"), [
    ("import json\nimport torch\nprint('AFTER-TORCH')\n", True),
    ("try:\n    import torch\nexcept BaseException:\n    pass\nprint('AFTER-TORCH')\n", True),
    ("import threading\nthreading.Thread(target=__import__, args=('torch',)).start()\n"
     "threading.Event().wait()\n", True),
    ("import os\nos.environ['EAGER'] = '1'\nimport torch\n", False),
    ("import os\nos.putenv('EAGER', '1')\nimport torch\n", False),
    ("import sys\nsys.setrecursionlimit(40)\nimport torch\n", False),
    ("import warnings\nwarnings.simplefilter('error')\nimport torch\n", False),
    ("import importlib.util\nHAS_TORCH = importlib.util.find_spec('torch') is not None\n", False),
    ("import warnings\nwith warnings.catch_warnings(record=True):\n    import torch\n", False),
    ("import os, time\nif os.fork() == 0:\n    time.sleep(0.5)\n    import torch\n    os._exit(0)\n",
     False),
    ("import hashlib, ssl, zlib\nimport torch\n", True),
    ("import ctypes, os\nctypes.CDLL(os.path.join(os.path.dirname(__file__), 'libown.so'))\n"
     "import torch\n", False),
    ("import ctypes\nctypes.CDLL('libz.so.1', ctypes.RTLD_GLOBAL)\nimport zlib\nimport torch\n", False),
    ("import _ctypes\n_ctypes.dlopen('libz.so.1', 256)\nimport zlib\nimport torch\n", False),
    ("import typing, dataclasses, multiprocessing, subprocess\nimport torch\n", True),
    ("import sys\nsys.modules['numpy'] = None\nimport torch\n", False)],
    ids=["imports-torch-first", "catches-what-stops-it", "in-a-thread", "sets-a-variable-first",
         "sets-a-c-variable-first", "sets-the-recursion-limit-first", "sets-a-warning-filter-first",
         "only-looks-torch-up", "records-torch-s-warnings", "forks-a-child-that-imports-torch",
         "imports-stdlib-extensions-first", "opens-a-library-of-its-own-first",
         "opens-a-stdlib-extension-s-library-rtld-global-first", "the-same-through-_ctypes",
         "imports-what-most-packages-do-first", "hides-a-module-from-torch-first"])
def test_a_probe_answers_as_torch_s_own_code_would_start_and_never_runs_it(tmp_path, init, first):
    # the module that asks for torch is half-imported then, and gone from sys.modules after:
    # the answer is taken at that moment, and the process ends there
    (tmp_path / "eager").mkdir()
    (tmp_path / "eager" / "__init__.py").write_text(init)
    (tmp_path / "own.c").write_text("int own(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "eager" / "libown.so"),
                    str(tmp_path / "own.c")], check=True)
    done = subprocess.run([sys.executable, "-c", PROBE.format(source="import eager\n")],
                          cwd=tmp_path, capture_output=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-500:]
    assert probe_says(done.stdout) is first
    assert b"AFTER-TORCH" not in done.stdout


def test_a_line_of_the_step_s_own_that_looks_like_a_probe_s_answer_is_no_answer():
    assert probe_says(b"LOADFUZZ-TORCH-FIRST 1 [[], []]\n")  # the probe's own form
    for line in (b"LOADFUZZ-TORCH-FIRST 1 not json", b"LOADFUZZ-TORCH-FIRST 1 5", b"LOADFUZZ-TORCH-FIRST 1"):
        assert not probe_says(line + b"\n")

EXTENSION_C = """\
#include <Python.h>
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, NULL, NULL, NULL, NULL, NULL};
PyMODINIT_FUNC PyInit__C(void);
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&def); }
"""
# libtorch_python exports ParameterClass too: once torch is in the global scope, this library's
# reference binds to torch's copy, and its constructor aborts
INTERPOSED_C = """\
#include <stdlib.h>
void *ParameterClass = (void *)0x1234;
__attribute__((constructor)) static void check(void) { if (ParameterClass != (void *)0x1234) abort(); }
"""


def package_in_a_venv(tmp_path, init, libraries):
    """A venv that sees the test's site-packages, with a package `pkgx` of this `__init__` and
    these (file name, C source, link options) built into it: its interpreter and the package."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "main.pth").write_text(f"import site; site.addsitedir({str(SITE)!r})\n")
    package = site / "pkgx"
    package.mkdir()
    (package / "__init__.py").write_text(init)
    for name, source, *link in libraries:
        (tmp_path / "x.c").write_text(source)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(package / name), str(tmp_path / "x.c"),
                        *link], check=True)
    return str(venv / "bin" / "python"), package


def extension(name):
    """An extension module of this name that needs libc10 (its trials fork from the heavy tier)."""
    torch_lib = SITE / "torch" / "lib"
    source = EXTENSION_C.replace('"_C"', f'"{name}"').replace("PyInit__C", f"PyInit_{name}")
    return (f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}", source,
            f"-I{sysconfig.get_paths()['include']}", f"-L{torch_lib}", "-Wl,--no-as-needed",
            "-lc10", f"-Wl,-rpath,{torch_lib}")


def matrix(python, package, tmp_path, *words):
    """`loadfuzz matrix PACKAGE --flags python WORDS` run by the venv's interpreter: what it
    printed and its records."""
    folder = tmp_path / "results" / "-".join(("x", *words))
    done = subprocess.run([python, "-m", "loadfuzz", "matrix", str(package), "--flags", "python",
                           *words, "--out", str(folder)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    return done, [json.loads(line) for line in (folder / "trials.jsonl").open()]


def test_a_package_that_imports_torch_rtld_global_ends_as_cpython_not_as_a_plain_import(tmp_path):
    """A package that sets RTLD_GLOBAL before its own `import torch` (some do, to share torch's
    symbols) runs code of its own before torch: its trials must not fork from a server that
    imported torch the plain way, where torch's symbols stay local. CPython is the judge."""
    python, package = package_in_a_venv(
        tmp_path, "import os, sys\n_flags = sys.getdlopenflags()\n"
        "sys.setdlopenflags(os.RTLD_NOW | os.RTLD_GLOBAL)\nimport torch\nsys.setdlopenflags(_flags)\n",
        [extension("_C"), ("libplain.so", INTERPOSED_C)])
    real = subprocess.run([python, "-c", "import pkgx._C, ctypes; "
                           f"ctypes.CDLL({str(package / 'libplain.so')!r})"],
                          cwd=tmp_path, capture_output=True, timeout=120)
    assert real.returncode == -signal.SIGABRT, real.stderr[-500:]
    done, records = matrix(python, package, tmp_path)
    assert done.returncode == 1, done.stderr
    [first_c] = [r for r in records if r["sequence"][0]["lib"].startswith("_C")]
    assert first_c["outcome"] == "abort", first_c


def test_a_package_whose_torch_import_fails_in_its_own_state_ends_as_cpython_not_clean(tmp_path):
    """A package that lowers the recursion limit before `import torch`: torch's import fails
    there, as CPython shows, where in a server that imported torch first it would not."""
    python, package = package_in_a_venv(
        tmp_path, "import sys\nsys.setrecursionlimit(40)\nimport torch\n",
        [extension("_a"), extension("_b")])
    real = subprocess.run([python, "-c", "import pkgx._a"], cwd=tmp_path, capture_output=True,
                          timeout=120)
    assert real.returncode == 1 and b"RecursionError" in real.stderr, real.stderr[-500:]
    (done, warm), (_, cold) = matrix(python, package, tmp_path), matrix(python, package, tmp_path, "--cold")
    assert done.returncode == 1, done.stderr
    assert [(r["outcome"], r["step"]) for r in warm] == [(r["outcome"], r["step"]) for r in cold] == [
        ("load-error", 0)] * 2
