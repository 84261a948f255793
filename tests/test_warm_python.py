"""A trial whose first step is Python forks from a server whose interpreter is already started,
and, when that step imports torch before anything of its own, with torch imported too: each such
trial must end as its cold run does, with the same output. A preload that a fork would not copy
whole (a thread, a process) or that fails is refused, and its trials go cold."""

import pytest

from loadfuzz import inventory
from loadfuzz.model import Flags, StepKind
from loadfuzz.run.harness import Harness, HarnessDied, HarnessStep, Limits, run_cold
from loadfuzz.run.tiers import Tiers
from loadfuzz.run.trials import Trials, harness_steps
from loadfuzz.run.warm import IMPORT_TORCH, START
from support import ET, EXTENSION, QUANTIZED, step

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
