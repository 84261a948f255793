"""The classifier names a trial from what it left behind: recorded real trials and made-up ones."""

import json
import signal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadfuzz.classify import classify, load_catalogue
from loadfuzz.model import Evidence, Outcome

RECORDED = Path(__file__).parent / "recorded"
CATALOGUE = load_catalogue()


def recorded(name: str) -> Evidence:
    return Evidence.from_json(json.loads((RECORDED / f"{name}.json").read_text()))


def evidence(**fields) -> Evidence:
    base = dict(steps=2, started=2, done=2, exit_code=0, signal=None, timed_out=False, error="",
                output=b"", output_bytes=0, duration_s=0.01, peak_rss_mb=3.0)
    base.update(fields)
    if "output" in fields:
        base["output_bytes"] = len(fields["output"])
    return Evidence(**base)


@pytest.mark.parametrize("name", ["executorch_reregister", "executorch_reregister_reversed"])
def test_executorch_reregistering_is_named_with_its_operator_and_step(name):
    verdict = classify(recorded(name), CATALOGUE)
    assert verdict.outcome is Outcome.REREGISTER
    assert verdict.signature == "executorch-reregister"
    assert verdict.op == "quantized_decomposed::add.out"
    assert verdict.step == 1
    assert verdict.signal == signal.SIGABRT
    assert "Re-registering quantized_decomposed::add.out" in verdict.detail


def test_torch_duplicate_operator_is_named_without_its_schema():
    verdict = classify(recorded("torch_duplicate_op"), CATALOGUE)
    assert verdict.outcome is Outcome.REREGISTER
    assert verdict.signature == "torch-duplicate-op"
    assert verdict.op == "quantized_decomposed::add.out"
    assert verdict.step == 1


def test_extension_after_runtime_library_is_clean():
    verdict = classify(recorded("clean_etdump_then_extension"), CATALOGUE)
    assert (verdict.outcome, verdict.step, verdict.exit_code) == (Outcome.CLEAN, None, 0)


def test_extension_without_libpython_is_a_load_error_naming_the_symbol():
    verdict = classify(recorded("extension_without_libpython"), CATALOGUE)
    assert verdict.outcome is Outcome.LOAD_ERROR
    assert verdict.signature == "undefined-symbol"
    assert verdict.op.startswith("Py")
    assert verdict.step == 0


def test_missing_library_is_a_load_error_with_dlerror_as_detail():
    verdict = classify(recorded("missing_library"), CATALOGUE)
    assert verdict.outcome is Outcome.LOAD_ERROR
    assert "cannot open shared object file" in verdict.detail


def test_older_executorch_wording_with_error_18_is_recognised():
    output = (b"E 00:00:00.000110 executorch:operator_registry.cpp:86] Re-registering "
              b"quantized_decomposed::add.out, from NOT_SUPPORTED\n"
              b"F 00:00:00.000125 executorch:operator_registry.cpp:88] In function "
              b"register_kernels_internal(), assert failed (false): Kernel registration failed "
              b"with error 18, see error log for details.\n")
    verdict = classify(evidence(started=2, done=1, exit_code=None, signal=6, output=output))
    assert (verdict.outcome, verdict.op) == (Outcome.REREGISTER, "quantized_decomposed::add.out")


def test_a_reregistering_warning_in_a_process_that_lived_is_not_a_finding():
    output = b"E executorch] Re-registering quantized_decomposed::add.out, from NOT_SUPPORTED\n"
    verdict = classify(evidence(output=output))
    assert verdict.outcome is Outcome.CLEAN


def test_exit_zero_from_a_constructor_is_exit_not_clean():
    verdict = classify(evidence(started=1, done=0, exit_code=0))
    assert (verdict.outcome, verdict.step, verdict.exit_code) == (Outcome.EXIT, 0, 0)


def test_another_abort_is_abort_with_the_last_line_as_detail():
    verdict = classify(evidence(started=1, done=0, exit_code=None, signal=6,
                                output=b"noise\nfx: giving up\n"))
    assert (verdict.outcome, verdict.signature, verdict.step) == (Outcome.ABORT, None, 0)
    assert verdict.detail.endswith("fx: giving up")


@pytest.mark.parametrize("number", [signal.SIGSEGV, signal.SIGKILL, signal.SIGBUS])
def test_other_signals_are_crashes_naming_the_signal(number):
    verdict = classify(evidence(started=2, done=1, exit_code=None, signal=number))
    assert (verdict.outcome, verdict.signal, verdict.step) == (Outcome.CRASH, number, 1)
    assert signal.Signals(number).name in verdict.detail


def test_a_timeout_wins_over_the_kill_that_ended_it():
    verdict = classify(evidence(started=1, done=0, exit_code=None, signal=9, timed_out=True))
    assert (verdict.outcome, verdict.step) == (Outcome.TIMEOUT, 0)


def test_a_crash_after_the_last_step_has_no_step():
    verdict = classify(evidence(exit_code=None, signal=11))
    assert (verdict.outcome, verdict.step) == (Outcome.CRASH, None)


def test_leftover_processes_are_mentioned_in_the_detail():
    assert "1 leftover process killed" in classify(evidence(leftovers=1)).detail


EXITED_1 = {"exit_code": 1, "signal": None}
ABORTED = {"exit_code": None, "signal": 6}
LOAD_FAILED = {"exit_code": 0, "signal": None}


@pytest.mark.parametrize(
    ("died", "error", "output", "signature", "op", "outcome"),
    [
        (EXITED_1, "", b": CommandLine Error: Option 'fx-opt' registered more than once!\n"
                       b"LLVM ERROR: inconsistency in registered CommandLine options\n",
         "llvm-duplicate-option", "fx-opt", Outcome.REREGISTER),
        (ABORTED, "", b"[libprotobuf ERROR descriptor_database.cc:642] File already exists in "
                      b"database: fx.proto\n", "protobuf-duplicate-file", "fx.proto",
         Outcome.REREGISTER),
        (EXITED_1, "", b"ERROR: flag 'fx_flag' was defined more than once (in files 'a.cc' and "
                       b"'b.cc').\n", "gflags-duplicate-flag", "fx_flag", Outcome.REREGISTER),
        (LOAD_FAILED, 'ImportError: generic_type: type "FxType" is already registered!', b"",
         "pybind11-duplicate-type", "FxType", Outcome.REREGISTER),
        (LOAD_FAILED, "libfx_tls.so: cannot allocate memory in static TLS block", b"",
         "glibc-static-tls", "libfx_tls.so", Outcome.LOAD_ERROR),
        # both copies of gflags or Abseil built from one file: the flag's file is the same
        (EXITED_1, "", b"ERROR: something wrong with flag 'fx_flag' in file 'fx.cc'.  One "
                       b"possibility: file 'fx.cc' is being linked both statically and dynamically",
         "gflags-duplicate-flag", "fx_flag", Outcome.REREGISTER),
        (EXITED_1, "", b"ERROR: Something is wrong with flag 'flagfile' in file "
                       b"'./absl/flags/parse.cc'. One possibility: file './absl/flags/parse.cc' is "
                       b"being linked both statically and dynamically into this executable.",
         "abseil-duplicate-flag", "flagfile", Outcome.REREGISTER),
        # torch.library from Python: a RuntimeError, the step's error
        (LOAD_FAILED, "RuntimeError: Tried to register an operator (fx::foo(Tensor x) -> Tensor) "
                      "with the same name and overload name multiple times. Each overload's schema "
                      "should only be registered with a single call to def().", b"",
         "torch-duplicate-op", "fx::foo", Outcome.REREGISTER),
        (ABORTED, "", b"terminate called after throwing an instance of 'c10::Error'\n  what():  "
                      b"Only a single TORCH_LIBRARY can be used to register the namespace fxns; "
                      b"please put all of your definitions in a single TORCH_LIBRARY block.\n",
         "torch-duplicate-library", "fxns", Outcome.REREGISTER),
        # Python's protobuf, and pybind11 3's native enums
        (LOAD_FAILED, "TypeError: Couldn't build proto file into descriptor pool: duplicate file "
                      "name fx.proto", b"", "protobuf-duplicate-file", "fx.proto",
         Outcome.REREGISTER),
        (LOAD_FAILED, 'ImportError: pybind11::native_enum<...>("FxColour") is already registered!',
         b"", "pybind11-duplicate-type", "FxColour", Outcome.REREGISTER),
        # a non-fatal protobuf error, then an unrelated exit: no collision named
        (EXITED_1, "", b"[libprotobuf ERROR x.cc:1] File already exists in database: fx.proto\n",
         None, None, Outcome.EXIT),
        # a versioned reference: "name, version V"
        (LOAD_FAILED, "/x/libfx_user.so: undefined symbol: fx_b, version VER_1", b"",
         "undefined-symbol", "fx_b", Outcome.LOAD_ERROR),
        # a logger's colours inside the name
        (ABORTED, "", b"\x1b[31mE 00:00:00.000 registry.cpp:42] Re-registering "
                      b"\x1b[1mfx::op.out\x1b[0m, from libfx.so\x1b[0m\n",
         "executorch-reregister", "fx::op.out", Outcome.REREGISTER),
    ],
)
def test_the_wider_catalogue_names_what_was_registered_twice(died, error, output, signature, op,
                                                              outcome):
    verdict = classify(evidence(started=1, done=0, error=error, output=output, **died))
    assert (verdict.outcome, verdict.signature, verdict.op) == (outcome, signature, op)


def test_detail_is_bounded_even_for_huge_lines():
    line = b"Re-registering quantized_decomposed::add.out" + b"x" * 100_000
    verdict = classify(evidence(started=2, done=1, exit_code=None, signal=6, output=line))
    assert verdict.outcome is Outcome.REREGISTER
    assert len(verdict.detail) <= 300


def test_a_step_trace_with_more_steps_ended_than_begun_is_never_clean():
    verdict = classify(evidence(steps=0, started=0, done=1), CATALOGUE)
    assert (verdict.outcome, verdict.step) == (Outcome.EXIT, None)
    assert verdict.detail.endswith("its step trace does not add up: 1 ended, 0 began")


def test_classification_is_a_function_of_the_evidence_alone(tmp_path, monkeypatch):
    """Nothing but the evidence decides: not the order evidence comes in, nor the working
    folder, the environment or the clock of the process that classifies it."""
    names = sorted(path.stem for path in RECORDED.glob("*.json"))
    first = [classify(recorded(name), CATALOGUE) for name in names]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LANG", "C")
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    again = [classify(recorded(name), CATALOGUE) for name in reversed(names)][::-1]
    assert again == first and len({v.outcome for v in first}) == 3  # clean, reregister, load-error


@given(
    steps=st.integers(0, 5),
    started=st.integers(0, 6),
    done=st.integers(0, 6),
    exit_code=st.one_of(st.none(), st.integers(0, 255)),
    signal_number=st.one_of(st.none(), st.integers(1, 64)),
    timed_out=st.booleans(),
    error=st.text(max_size=200),
    output=st.binary(max_size=2000),
    leftovers=st.integers(0, 3),
)
def test_any_evidence_gets_exactly_one_outcome_and_never_raises(
    steps, started, done, exit_code, signal_number, timed_out, error, output, leftovers
):
    verdict = classify(
        Evidence(steps, started, done, exit_code, signal_number, timed_out, error, output,
                 len(output), 0.0, 0.0, leftovers),
        CATALOGUE,
    )
    text = f"{error}\n{output.decode('utf-8', 'replace')}"
    ended_well = (not timed_out and signal_number is None and exit_code == 0
                  and started == done and done >= steps)
    assert (verdict.outcome is Outcome.CLEAN) == ended_well
    if signal_number is not None and not timed_out:  # a signal is never an exit, nor clean
        assert verdict.outcome not in (Outcome.EXIT, Outcome.CLEAN)
    if verdict.signature is None:
        assert verdict.op is None
    else:  # a signature is only ever named from what the trial said
        assert any(sig.name == verdict.signature and sig.pattern.search(text) for sig in CATALOGUE)
        assert verdict.op in text
    assert len(verdict.detail) < 400
    assert (verdict.step is None) == (verdict.outcome is Outcome.CLEAN or started <= done)


@pytest.mark.parametrize("error", [
    # raised while handling the missing module (a fallback): the RuntimeError is the failure
    "RuntimeError: fx: operator table corrupted\n"
    "while handling: ModuleNotFoundError: No module named 'fx_accelerator'",
    # a message that quotes one
    "RuntimeError: fx failed: ModuleNotFoundError: No module named 'fx_accelerator'",
])
def test_a_missing_module_that_is_not_the_failure_or_its_cause_is_no_environment_problem(error):
    verdict = classify(evidence(started=1, done=0, error=error, **LOAD_FAILED))
    assert (verdict.outcome, verdict.signature) == (Outcome.LOAD_ERROR, None)


def test_a_missing_module_that_caused_the_failure_is_an_environment_problem():
    verdict = classify(evidence(started=1, done=0, error="ImportError: initialization failed\n"
                                "ModuleNotFoundError: No module named 'numpy'", **LOAD_FAILED))
    assert (verdict.signature, verdict.op) == ("python-missing-module", "numpy")
