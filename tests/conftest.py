"""Where the real wheel and the fixture libraries are, and small helpers to name steps."""

import sysconfig
from pathlib import Path

import pytest

from loadfuzz.model import Flags, Step, StepKind

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
