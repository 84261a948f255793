"""Every finding carries its cause and the ways out: what collided, which libraries carry a copy
and how each got into the process, where their entry points bound, and fixes from a table.

The evidence is the loader's own report of the finding's cold run (LD_DEBUG), checked here
against the static replay of the ELF files, which must tell the same story.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from loadfuzz import inventory
from loadfuzz.api import run_load_order
from loadfuzz.causes import CONDITIONS, load_causes
from loadfuzz.elf.opnames import carries_string
from loadfuzz.explain import Explainer
from loadfuzz.model import Flags, Outcome, Step, StepKind, TrialRecord
from loadfuzz.run import ldtrace
from loadfuzz.run.harness import Limits
from loadfuzz.run.trials import Trials
from support import (
    AOT_ID,
    ET,
    FIXTURES,
    KQ,
    LEGACY_PLUGIN,
    PLUGIN,
    QUANTIZED,
    ROOT,
    SITE,
    hostile,
    loadfuzz,
    step,
)

RECORDED = ROOT / "tests" / "recorded" / "ld-debug-reregister.txt"
ENTRY = "_ZN10executorch7runtime16register_kernelsENS0_4SpanIKNS0_6KernelEEE"
SIG = FIXTURES / "signatures"


def recorded_trace(keep=ldtrace.keep_none) -> ldtrace.LoaderTrace:
    """The loader's report of `kernels_quantized -> legacy plugin @ global`, recorded on this
    wheel with the paths made portable, and put back where they are on this machine."""
    text = RECORDED.read_text().replace("/site", str(SITE)).replace("/project", str(ROOT))
    return ldtrace.parse(text.splitlines(keepends=True), keep)


@pytest.fixture(scope="module")
def executorch_with_plugin() -> inventory.Inventory:
    return inventory.load_target("executorch", [LEGACY_PLUGIN])


def seed_finding(inv: inventory.Inventory, first: str = KQ, second: str = PLUGIN,
                 flags: Flags = Flags.GLOBAL) -> TrialRecord:
    steps = tuple(Step(StepKind.DLOPEN, lib, flags, inv.get(lib).path) for lib in (first, second))
    return TrialRecord(steps, Outcome.REREGISTER, 1, "executorch-reregister",
                       "quantized_decomposed::add.out", 6, None,
                       "Re-registering quantized_decomposed::add.out", 0.01, 30.0, "loadfuzz run ...")


# --- the loader's report, read ------------------------------------------------------------

def test_the_loader_report_says_how_each_object_came_in_and_what_ran_last():
    trace = recorded_trace()
    arrivals = {Path(a.path).name: a for a in trace.arrivals}
    assert arrivals["libexecutorch_kernels_quantized.so"].dlopened
    executorch = arrivals["libexecutorch.so"]
    assert not executorch.dlopened
    assert executorch.path == str(SITE / "executorch" / "lib" / "libexecutorch.so")
    assert executorch.by.endswith("libexecutorch_kernels_quantized.so")
    assert Path(trace.last_init).name == "libquantized_ops_legacy_plugin.so"


def test_the_loader_report_keeps_only_the_bindings_asked_for():
    assert recorded_trace().bindings == ()
    kept = recorded_trace(lambda caller, symbol, target: symbol == ENTRY)
    callers = {Path(b.caller).name: Path(b.target).name for b in kept.bindings}
    assert callers == {"libexecutorch.so": "libexecutorch.so",
                       "libexecutorch_kernels_quantized.so": "libexecutorch.so",
                       "libquantized_ops_legacy_plugin.so": "libexecutorch.so"}


def test_a_missing_report_reads_as_an_empty_one(tmp_path):
    assert ldtrace.read(tmp_path / "ld-debug.1") == ldtrace.LoaderTrace((), None, ())


# --- the explanation, from recorded evidence --------------------------------------------

def test_a_reregistration_names_both_copies_the_entry_point_they_bound_and_fixes(
        executorch_with_plugin):
    explainer = Explainer(executorch_with_plugin)
    record = explainer.explain(seed_finding(executorch_with_plugin), recorded_trace(explainer.keeps))
    cause = record.cause
    assert cause.kind == "duplicate-registration" and cause.evidence == "observed"
    assert [(c.lib, c.step, c.needed_by) for c in cause.libraries] == [(KQ, 0, None),
                                                                        (PLUGIN, 1, None)]
    [symbol] = cause.symbols
    assert symbol.symbol == "executorch::runtime::register_kernels" and symbol.mangled == ENTRY
    assert set(symbol.bindings) == {(KQ, "lib/libexecutorch.so"), (PLUGIN, "lib/libexecutorch.so")}
    assert "quantized_decomposed::add.out (+20 more)" in cause.text
    assert "lib/libexecutorch.so" in cause.text
    fixes = [f.name for f in cause.fixes]
    assert fixes[0] == "drop-duplicate" and cause.fixes[-1].last_resort
    assert "load-local" not in fixes  # both closures hold libexecutorch.so: flags cannot help


def test_without_a_report_the_elf_files_tell_the_same_story(executorch_with_plugin):
    explainer = Explainer(executorch_with_plugin)
    finding = seed_finding(executorch_with_plugin)
    observed = explainer.explain(finding, recorded_trace(explainer.keeps)).cause
    static = explainer.explain(finding, None).cause
    assert static.evidence == "static"
    assert static.libraries == observed.libraries
    assert static.symbols == observed.symbols
    assert [f.name for f in static.fixes] == [f.name for f in observed.fixes]


def test_a_copy_pulled_in_as_a_dependency_says_whose(executorch_with_plugin):
    explainer = Explainer(executorch_with_plugin)
    cause = explainer.explain(seed_finding(executorch_with_plugin, PLUGIN, AOT_ID), None).cause
    assert [(c.lib, c.step, c.needed_by) for c in cause.libraries] == [(PLUGIN, 0, None),
                                                                        (KQ, 1, AOT_ID)]
    assert cause.libraries[1].how(seed_finding(executorch_with_plugin, PLUGIN, AOT_ID).sequence) \
        == f"a dependency of {AOT_ID}, loaded by step 1 (global)"


def test_a_clean_record_gets_no_cause(executorch_with_plugin):
    clean = replace(seed_finding(executorch_with_plugin), outcome=Outcome.CLEAN, step=None,
                    signature=None, op=None)
    assert Explainer(executorch_with_plugin).explain(clean, None).cause is None


def test_the_cause_and_fixes_survive_the_json_record(executorch_with_plugin):
    explainer = Explainer(executorch_with_plugin)
    record = explainer.explain(seed_finding(executorch_with_plugin), recorded_trace(explainer.keeps))
    data = record.to_json()
    assert data["cause"]["libraries"][1]["how"] == "loaded by step 1 (global)"
    assert data["fixes"][0]["fix"] == "drop-duplicate"
    again = TrialRecord.from_json(json.loads(json.dumps(data)),
                                  lambda lib: executorch_with_plugin.get(lib).path)
    assert again == record


# --- the catalogue ------------------------------------------------------------------------

def test_every_signature_and_every_failing_outcome_has_a_cause():
    from loadfuzz.classify import load_catalogue

    rules = load_causes()
    named = {s for rule in rules for s in rule.signatures}
    assert {s.name for s in load_catalogue()} <= named
    outcomes = {o for rule in rules for o in rule.outcomes}
    assert {o.value for o in Outcome} - {"clean"} <= outcomes
    assert all(rule.fixes for rule in rules)


def test_a_fix_asking_for_an_unknown_condition_is_refused():
    text = """
[[cause]]
kind = "x"
text = "t"
[[cause.fix]]
name = "f"
when = "no-such-condition"
text = "t"
"""
    with pytest.raises(ValueError, match="no-such-condition"):
        load_causes(text)
    assert "flags-decide" in CONDITIONS


# --- real runs: the kind of each failure ---------------------------------------------------

KINDS = {
    "crash": ([hostile("segv")], "constructor-crash"),
    "exit": ([hostile("exit7")], "constructor-exit"),
    "missing symbol": ([hostile("undefined_symbol")], "missing-symbol"),
    "missing library": ([hostile("needs_missing")], "missing-library"),
    "static tls": ([SIG / "libfx_static_tls_a.so", SIG / "libfx_static_tls_b.so"], "static-tls"),
    "pybind11": ([f"py:{SIG / 'fxdup.cpython-311-x86_64-linux-gnu.so'}"], "duplicate-pybind11-type"),
    "llvm": ([SIG / "libfx_llvm_a.so", SIG / "libfx_llvm_b.so"], "duplicate-registration"),
}


@pytest.mark.parametrize("case", KINDS)
def test_each_kind_of_failure_is_explained_from_its_run(case):
    steps, kind = KINDS[case]
    record = run_load_order(None, *steps)
    assert not record.clean
    assert record.cause.kind == kind and record.cause.evidence == "observed"
    assert record.cause.libraries and record.cause.fixes
    assert "?" not in record.cause.text.replace(record.repro, "")


def test_a_library_whose_own_symbols_bound_to_an_earlier_global_copy_is_interposition():
    first, second = (FIXTURES / "interpose" / f"libfx_hook_{n}.so" for n in ("first", "second"))
    record = run_load_order(None, first, second)
    assert record.cause.kind == "interposition"
    assert [s.symbol for s in record.cause.symbols] == ["fx_hook"]
    assert record.cause.symbols[0].bindings == ((str(second), str(first)),)
    assert run_load_order(None, f"local:{first}", f"local:{second}").clean


def test_a_failure_its_signature_names_is_not_put_down_to_a_binding_seen_on_the_way():
    """The QNN backend, loaded global first, lends the Python adaptor a copy of a libstdc++
    template static (a binding of no consequence); the adaptor's import then fails on numpy,
    which this environment lacks: the cause is the missing module, as for the import alone."""
    assert importlib.util.find_spec("numpy") is None, "the premise: no numpy here"
    adaptor = f"py:{ET / 'backends/qualcomm/python/PyQnnManagerAdaptor.cpython-311-x86_64-linux-gnu.so'}"
    for steps in ([adaptor], [f"global:{ET / 'lib/libexecutorch_backend_qnn.so'}", adaptor]):
        record = run_load_order(None, *steps)
        assert (record.signature, record.op) == ("python-missing-module", "numpy")
        assert record.cause.kind == "missing-python-module", (steps, record.cause.text)
        assert [fix.name for fix in record.cause.fixes] == ["install"]


def test_a_module_imported_by_name_is_explained_too():
    record = run_load_order(None, "import:loadfuzz_fixture_dependency_nobody_installed")
    assert record.cause.kind == "missing-python-module"
    assert "loadfuzz_fixture_dependency_nobody_installed" in record.cause.text


def test_a_finding_of_the_fast_path_is_explained_by_its_cold_confirmation(executorch_with_plugin):
    inv = executorch_with_plugin
    seq = (step(QUANTIZED), step(LEGACY_PLUGIN))
    with Trials(Limits(), explainer=Explainer(inv)) as trials:
        record = trials.run(seq)
    assert record.via == "fork-server, confirmed cold"
    assert record.cause.evidence == "observed"
    assert {c.lib for c in record.cause.libraries} == {str(QUANTIZED), str(LEGACY_PLUGIN)}


# --- every output carries it ----------------------------------------------------------------

def test_every_finding_of_a_campaign_is_explained_in_every_output(tmp_path):
    out = tmp_path / "results"
    done = loadfuzz("matrix", "executorch", "--add", LEGACY_PLUGIN, "--out", out)
    assert done.returncode == 1, done.stderr
    findings = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    findings = [r for r in findings if r["outcome"] != "clean"]
    assert findings
    for record in findings:
        cause = record["cause"]
        copies = {c["lib"] for c in cause["libraries"]}
        assert PLUGIN in copies and copies & {KQ, AOT_ID}, cause
        assert record["fixes"] and cause["evidence"] == "observed"
    summary = json.loads((out / "summary.json").read_text())
    assert all(f["cause"]["kind"] == "duplicate-registration" for f in summary["findings"])
    report = (out / "report.md").read_text()
    assert report.count("- Cause (`duplicate-registration`, observed)") == len(summary["findings"])
    assert "- Fixes:" in report
    assert "cause: duplicate-registration (observed)" in (out / "junit.xml").read_text()
    assert "fix: Register quantized_decomposed::add.out" in (out / "matrix.html").read_text()


CUT_SHORT = """
import os, sys
from loadfuzz.elf.opnames import carries_string
path = sys.argv[1]
def cut_short(frame, event, arg):  # when the search starts reading the file
    if event == "c_call" and getattr(arg, "__name__", "") in ("find", "read", "readinto"):
        sys.setprofile(None)
        os.truncate(path, 4096)
sys.setprofile(cut_short)
print(carries_string(path, "cz::needle.out"))
"""


@pytest.mark.parametrize("where", ["start", "middle", "past a chunk", "nowhere"])
def test_a_library_searched_for_an_operator_name_is_read_whole_or_cut_short_but_never_mapped(
        tmp_path, where):
    # A library rewritten in place (a build, a `cp`) while a finding was explained killed
    # loadfuzz with SIGBUS when the search touched pages past the new end of the file.
    needle = b"\0cz::needle.out\0"
    at = {"start": 0, "middle": 3 << 20, "past a chunk": (4 << 20) - 7, "nowhere": None}[where]
    data = bytearray(os.urandom(8 << 20).replace(b"\0", b"\1"))
    if at is not None:
        data[at:at + len(needle)] = needle
    library = tmp_path / "libbig.so"
    library.write_bytes(bytes(data))
    assert carries_string(library, "cz::needle.out") is (at is not None)
    assert carries_string(library, "cz::needle") is False
    done = subprocess.run([sys.executable, "-c", CUT_SHORT, str(library)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout == f"{at == 0}\n"


def test_a_provider_of_the_missing_symbol_that_never_loaded_is_not_said_to_be_loaded(tmp_path):
    # the cause listed the second step's library as "loaded by step 0" in a trial that
    # ended at step 0
    from support import build

    needs = build(tmp_path, "needs", "int fx_provided(void);\n"
                                     "int fx_needs(void) { return fx_provided(); }\n")
    provides = build(tmp_path, "provides", "int fx_provided(void) { return 1; }\n")
    record = run_load_order(None, f"global:{needs}", f"global:{provides}")
    assert (record.outcome.value, record.step, record.op) == ("load-error", 0, "fx_provided")
    assert record.cause.kind == "missing-symbol"
    assert [c.lib for c in record.cause.libraries] == [str(needs)]
    assert "libprovides.so defines it" in record.cause.text


def test_load_local_is_not_offered_when_the_copies_share_their_runtime_by_soname(tmp_path):
    """A second install of the kernels, with its own libexecutorch.so beside it, still registers
    into the first install's: ld.so answers a NEEDED name with a library already loaded under that
    SONAME, RTLD_LOCAL or not. Loading local cannot keep the copies apart, so it is no fix here."""
    for name in ("libexecutorch_kernels_quantized.so", "libexecutorch.so",
                 "libexecutorch_threadpool.so"):
        shutil.copy(ET / "lib" / name, tmp_path / name)
    second = tmp_path / "libexecutorch_kernels_quantized.so"
    record = run_load_order(None, f"local:{QUANTIZED}", f"local:{second}")
    assert record.signature == "executorch-reregister"
    assert record.cause.kind == "duplicate-registration"
    fixes = [fix.name for fix in record.cause.fixes]
    assert "drop-duplicate" in fixes and "load-local" not in fixes


def test_copies_that_reach_the_registry_through_a_weak_reference_are_named_by_what_they_hold():
    """The corpus's plugins call the registry through a weak reference, not ExecuTorch's entry
    point: the copies are the libraries in the process that hold the operator's name."""
    corpus = FIXTURES / "corpus"
    record = run_load_order(None, *(f"global:{corpus / f'libcz_{name}.so'}"
                                    for name in ("registry", "weak_p", "weak_q")))
    assert record.signature == "executorch-reregister" and record.step == 2
    assert [(c.lib, c.step) for c in record.cause.libraries] == [
        (str(corpus / "libcz_weak_p.so"), 1), (str(corpus / "libcz_weak_q.so"), 2)]
    assert "a library loaded earlier" not in record.cause.text


def test_a_hang_at_exit_blames_no_constructor(tmp_path):
    """With --at-exit, a destructor that never returns times the exit out: the last constructor
    that ran (an innocent library's) is not the cause."""
    source = tmp_path / "dtor.c"
    source.write_text("#include <unistd.h>\n"
                      "__attribute__((destructor)) static void d(void) { for (;;) pause(); }\n")
    hangs = tmp_path / "libdtor_hang.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(hangs), str(source)], check=True)
    done = loadfuzz("run", "--json", "--timeout", "1", "--at-exit", hangs, hostile("clean"))
    record = json.loads(done.stdout)
    assert (record["outcome"], record["step"]) == ("timeout", None)
    assert record["cause"]["kind"] == "at-exit" and not record["cause"]["libraries"]
    said = record["cause"]["text"].replace(record["repro"], "") + json.dumps(record["fixes"])
    assert "libfx_clean" not in said  # (it is in the repro command, as a step)
