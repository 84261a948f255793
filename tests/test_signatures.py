"""Every signature of the catalogue is recognised from a process that produced it.

The fixtures are faithful copies of each library's exact words and way of
dying (build/fixtures/signatures); each is run for real, on the cold path,
from the fork server and from a row server that took the first step, and must
get the same outcome, signature and name on each.
"""

import pytest

from loadfuzz.model import Flags, Outcome, StepKind
from loadfuzz.run.harness import Limits
from support import FIXTURES, PATHS, step, trials_on

SIG = FIXTURES / "signatures"


def twice(name):
    return [step(SIG / f"libfx_{name}_a.so"), step(SIG / f"libfx_{name}_b.so")]


CASES = {
    "llvm": (twice("llvm"), Outcome.REREGISTER, "llvm-duplicate-option", "fx-opt", 1),
    "protobuf": (twice("protobuf"), Outcome.REREGISTER, "protobuf-duplicate-file", "fx.proto", 1),
    "gflags": (twice("gflags"), Outcome.REREGISTER, "gflags-duplicate-flag", "fx_flag", 1),
    "pybind11": ([step(SIG / "fxdup.cpython-311-x86_64-linux-gnu.so", Flags.LOCAL,
                       StepKind.IMPORT)],
                 Outcome.REREGISTER, "pybind11-duplicate-type", "FxType", 0),
    "static-tls": (twice("static_tls"), Outcome.LOAD_ERROR, "glibc-static-tls",
                   str(SIG / "libfx_static_tls_b.so"), 1),
    "symbol-lookup": ([step(SIG / "libfx_symbol_lookup.so")], Outcome.LOAD_ERROR,
                      "symbol-lookup-error", "fx_not_there", 0),
    "undefined": ([step(FIXTURES / "hostile" / "libfx_undefined_symbol.so")], Outcome.LOAD_ERROR,
                  "undefined-symbol", "fx_nowhere", 0),
}


@pytest.fixture(scope="module", params=PATHS)
def trials(request):
    with trials_on(request.param, Limits(timeout_s=5)) as runner:
        yield runner


@pytest.mark.parametrize("case", CASES)
def test_the_signature_is_recognised_with_its_outcome_name_and_step(trials, case):
    seq, outcome, signature, name, at = CASES[case]
    record = trials.run(tuple(seq))
    assert (record.outcome, record.signature, record.op, record.step) == (
        outcome, signature, name, at), record.detail


@pytest.mark.parametrize("name", ["llvm", "protobuf", "gflags", "static_tls"])
def test_either_copy_alone_is_clean(trials, name):
    first, second = twice(name)
    assert trials.run((first,)).clean and trials.run((second,)).clean
