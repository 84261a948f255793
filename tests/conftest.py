"""Where the real wheel and the fixture libraries are, and small helpers to name steps."""

import sysconfig
from contextlib import contextmanager
from pathlib import Path

import pytest

from loadfuzz.model import Flags, Step, StepKind
from loadfuzz.trial import Trials

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


@pytest.fixture(scope="session", autouse=True)
def fixtures_are_built():
    assert LEGACY_PLUGIN.exists(), "run `make` first: the fixture libraries are not built"


def loadfuzz(*args: str, cwd: Path | None = None, timeout: float = 600):
    """Run the CLI as a user would; returns the CompletedProcess (text)."""
    import subprocess

    return subprocess.run([str(LOADFUZZ), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


@pytest.fixture(scope="session")
def legacy_matrix(tmp_path_factory):
    """The release check of the demo, run once: executorch 1.5.1 plus the legacy plugin.

    Returns (summary, every trial record) as JSON objects.
    """
    import json

    out = tmp_path_factory.mktemp("legacy-matrix")
    done = loadfuzz("matrix", "executorch", "--add", LEGACY_PLUGIN, "--out", out, "--json")
    assert done.returncode == 1, done.stderr
    records = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    return json.loads(done.stdout), records


PATHS = ["cold", "fork-server", "shared-prefix"]  # the ways a trial can be run


class SharedPrefixTrials:
    """`Trials` on the shared-prefix path: a sequence of two or more steps is a row of its own,
    forked from a row server that took its first step, and must say so in its record."""

    def __init__(self, trials):
        self.trials = trials

    def run(self, seq):
        if self.trials.row_key(seq) is None:
            return self.trials.run(seq)
        [record] = self.trials.run_row([seq])
        assert record.via.startswith("shared prefix"), record.via
        return record


@contextmanager
def trials_on(path: str, limits, **options):
    """A runner of trials on one of PATHS."""
    with Trials(limits, cold=path == "cold", **options) as trials:
        yield SharedPrefixTrials(trials) if path == "shared-prefix" else trials
