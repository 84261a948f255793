"""The static prediction says which ordered pairs collide, and running them agrees.

The comparison is kept as a check that can fail: every ordered pair of
executorch 1.5.1 plus the legacy plugin, under both flags modes, predicted
from the ELF files alone and observed by `matrix`.
"""

import json
import subprocess

import pytest

from loadfuzz import inventory, predict
from loadfuzz.model import Flags, Outcome, Step, StepKind
from support import LEGACY_PLUGIN, PAIRS_WITH_PLUGIN, loadfuzz

PLUGIN = "extra/libquantized_ops_legacy_plugin.so"
QUANTIZED = "lib/libexecutorch_kernels_quantized.so"
AOT = "kernels/quantized/libquantized_ops_aot_lib.so"


def legacy_inventory():
    return inventory.load_target("executorch", [LEGACY_PLUGIN])


def steps(inv, *spelled):
    """`("global", id), ...` -> Steps."""
    return [Step(StepKind.DLOPEN, lib, Flags(mode), inv.get(lib).path) for mode, lib in spelled]


def test_the_bare_wheel_is_predicted_to_load_clean_in_every_pair():
    assert predict.predict(inventory.load_target("executorch")) == ()


def test_the_legacy_plugin_is_predicted_to_collide_with_every_holder_of_the_quantized_kernels():
    found = {(p.sequence[0].lib, p.sequence[1].lib, p.sequence[0].flags.value, p.op)
             for p in predict.predict(legacy_inventory())}
    holders = (QUANTIZED, AOT)  # the aot lib loads the run-time kernels as a dependency
    assert found == {(a, b, mode, "quantized_decomposed::add.out")
                     for holder in holders for a, b in ((holder, PLUGIN), (PLUGIN, holder))
                     for mode in ("global", "local")}


def test_a_prediction_names_both_libraries_and_the_copy_of_the_registry_they_share():
    [first] = [p for p in predict.predict(legacy_inventory(), flags=[Flags.GLOBAL])
               if p.sequence[0].lib == QUANTIZED]
    assert first.signature == "executorch-reregister"
    assert first.step == 1
    assert QUANTIZED in first.why and PLUGIN in first.why and "lib/libexecutorch.so" in first.why


def test_a_library_loaded_twice_is_one_object_and_does_not_collide_with_itself():
    inv = legacy_inventory()
    seq = steps(inv, ("local", QUANTIZED), ("global", QUANTIZED), ("global", AOT))
    assert predict.replay(inv, seq).outcome is Outcome.CLEAN


def test_a_collision_needs_the_second_copy_to_be_loaded_not_only_listed():
    inv = legacy_inventory()
    seq = steps(inv, ("global", PLUGIN), ("global", "lib/libexecutorch_etdump.so"))
    assert predict.replay(inv, seq).clean


def test_prediction_agrees_with_every_observed_pair(legacy_matrix):
    summary, records = legacy_matrix
    inv = legacy_inventory()
    predicted = {(p.sequence[0].lib, p.sequence[1].lib, p.sequence[0].flags.value):
                 (p.outcome.value, p.op) for p in predict.predict(inv)}
    observed = {(r["sequence"][0]["lib"], r["sequence"][1]["lib"], r["sequence"][0]["flags"]):
                (r["outcome"], r["op"]) for r in records}
    assert len(observed) == summary["trials"] == PAIRS_WITH_PLUGIN
    disagree = {pair: (predicted.get(pair, ("clean", None)), seen)
                for pair, seen in observed.items()
                if predicted.get(pair, ("clean", None)) != seen}
    agreed = len(observed) - len(disagree)
    print(f"prediction agrees with {agreed}/{len(observed)} observed pairs")
    assert disagree == {}
    assert set(predicted) <= set(observed)


def test_every_campaign_summary_says_how_the_prediction_fared(legacy_matrix):
    summary, _ = legacy_matrix
    prediction = summary["prediction"]
    assert (prediction["agree"], prediction["disagree_count"], prediction["disagree"]) == (
        summary["trials"], 0, [])
    tallies = prediction["by_confidence"]
    assert sum(t["agree"] for t in tallies.values()) == summary["trials"]
    assert all(t["disagree"] == 0 for t in tallies.values())
    # pairs with the aot lib, which also registers into the PyTorch dispatcher (schemas read
    # from strings), are trusted less than pairs of ExecuTorch kernel tables alone
    assert tallies["medium"]["agree"] > 0 and tallies["high"]["agree"] > tallies["medium"]["agree"]


def test_a_predicted_collision_gives_its_evidence_and_a_confidence():
    inv = legacy_inventory()
    predicted = predict.replay(inv, steps(inv, ("global", QUANTIZED), ("global", PLUGIN)))
    assert predicted.confidence == "high"  # ExecuTorch's kernel tables are the registrations
    first, second, binding = predicted.evidence
    assert first.startswith(f"{QUANTIZED} registers quantized_decomposed::add.out")
    assert second == f"{PLUGIN} registers quantized_decomposed::add.out (+20 more) too"
    assert binding == (f"{PLUGIN} binds executorch::runtime::register_kernels to "
                       "lib/libexecutorch.so (the first definition in the global scope)")
    assert predicted.pair_json()["confidence"] == "high"


def test_a_clean_prediction_says_why_and_python_steps_lower_the_confidence():
    inv = legacy_inventory()
    coreml = "backends/apple/coreml/executorchcoreml.cpython-311-x86_64-linux-gnu.so"
    cmsis = "backends/cortex_m/library/_cmsis_nn/cmsis_nn.cpython-311-x86_64-linux-gnu.so"
    quiet = predict.replay(inv, steps(inv, ("global", coreml), ("local", cmsis)))
    assert (quiet.outcome, quiet.confidence) == (Outcome.CLEAN, "high")
    assert quiet.evidence == ("no library the steps bring in registers operators",)
    runtime = predict.replay(inv, steps(inv, ("global", "lib/libexecutorch_etdump.so"),
                                        ("global", "lib/libexecutorch.so")))
    assert runtime.evidence == ("28 operator names registered into 1 registry copies, "
                                "none of them twice into the same copy",)
    [python] = steps(inv, ("local", QUANTIZED))
    python = Step(StepKind.DLOPEN, python.lib, Flags.PYTHON, python.path)
    assert predict.replay(inv, [python]).confidence == "low"


def test_every_registry_kind_says_where_its_names_are_read_from():
    from loadfuzz.elf.opnames import NAME_READERS
    from loadfuzz.registries import REGISTRIES

    assert {kind.names for kind in REGISTRIES} <= set(predict.READ_FROM) <= set(NAME_READERS)
    assert {kind.confidence for kind in REGISTRIES} <= set(predict.CONFIDENCE)


def test_on_the_torch_wheel_an_operator_of_the_dispatcher_s_own_library_is_a_mention(tmp_path):
    """libtorch_python spells aten schemas that libtorch_cpu defines: not a second definition
    (every `import torch` would abort), so no pair is predicted to collide on them."""
    done = loadfuzz("matrix", "torch", "--out", tmp_path / "out", "--json")
    summary = json.loads(done.stdout)
    assert done.returncode in (0, 1), done.stderr
    prediction = summary["prediction"]
    assert prediction["agree"] + prediction["disagree_count"] == summary["trials"]
    assert prediction["agree"] == summary["trials"], prediction["disagree"][:3]  # README: all
    predicted = json.loads(loadfuzz("scan", "torch", "--json").stdout)["predicted"]
    assert [p for p in predicted if (p["op"] or "").startswith("aten::")] == []
    assert sum(sum(tally.values()) for tally in prediction["by_confidence"].values()) == (
        summary["trials"])


def test_a_predicted_missing_library_agrees_with_the_load_error_observed(tmp_path):
    # a predicted load-error names no op, the observed one does: every such trial counted as
    # a disagreement ("prediction: 0 of 2 trials ended as scan predicted")
    from support import FIXTURES

    folder = tmp_path / "libs"
    folder.mkdir()
    for name in ("libfx_needs_missing.so", "libfx_clean.so"):
        (folder / name).write_bytes((FIXTURES / "hostile" / name).read_bytes())
    done = loadfuzz("matrix", folder, "--flags", "global", "--out", tmp_path / "out", "--json")
    summary = json.loads(done.stdout)
    assert [r["outcome"] for r in summary["findings"]] == ["load-error", "load-error"]
    assert summary["prediction"]["agree"] == 2 and summary["prediction"]["disagree"] == []


def test_a_symbol_only_an_earlier_global_library_defines_is_predicted_as_loading_shows(tmp_path):
    """libconsumer.so uses lf_provided, which only libprovider.so defines and which it does not
    link: it loads after the provider opened `global`, and fails with "undefined symbol" after
    a `local` one or alone. The prediction says so pair by pair, and the matrix agrees."""
    from support import build

    folder = tmp_path / "libs"
    folder.mkdir()
    build(folder, "provider", "int lf_provided(void) { return 7; }\n")
    build(folder, "consumer", "int lf_provided(void);\n"
          "int lf_consume(void) { return lf_provided() + 1; }\n")
    inv = inventory.load_target(str(folder))
    predicted = {(p.sequence[0].lib, p.sequence[1].lib, p.sequence[0].flags.value): p
                 for p in predict.predict(inv)}
    assert set(predicted) == {("libconsumer.so", "libprovider.so", "global"),
                              ("libconsumer.so", "libprovider.so", "local"),
                              ("libprovider.so", "libconsumer.so", "local")}
    after_local = predicted["libprovider.so", "libconsumer.so", "local"]
    assert (after_local.outcome, after_local.step) == (Outcome.LOAD_ERROR, 1)
    assert "lf_provided" in after_local.why
    assert predict.quiet(inv, inv.libraries) == {"libprovider.so"}
    done = loadfuzz("matrix", folder, "--out", tmp_path / "out", "--json")
    summary = json.loads(done.stdout)
    assert sorted((r["sequence"][0]["lib"], r["sequence"][0]["flags"], r["op"])
                  for r in summary["findings"]) == [
        ("libconsumer.so", "global", "lf_provided"), ("libconsumer.so", "local", "lf_provided"),
        ("libprovider.so", "local", "lf_provided")]
    assert summary["prediction"]["agree"] == 4 and summary["prediction"]["disagree"] == []


@pytest.mark.parametrize("target", ["executorch", "corpus", "hostile"])
def test_pairs_of_quiet_libraries_are_predicted_without_a_replay_exactly_as_a_replay_would(
        target):
    # an environment of thousands of libraries has millions of pairs: scan of 3000 never ended
    from loadfuzz.plan import pairs
    from support import FIXTURES

    inv = (inventory.load_target("executorch", [LEGACY_PLUGIN]) if target == "executorch"
           else inventory.load_target(str(FIXTURES / target)))
    every = pairs(inv.libraries, (Flags.GLOBAL, Flags.LOCAL, Flags.PYTHON))
    replayed = [predict.replay(inv, seq) for seq in every]
    assert predict.predict(inv, flags=(Flags.GLOBAL, Flags.LOCAL, Flags.PYTHON)) == tuple(
        p for p in replayed if not p.clean)
    calm = predict.quiet(inv, inv.libraries)
    assert calm  # the shortcut is taken somewhere
    for seq, full in zip(every, replayed, strict=True):
        assert predict.calm_prediction(seq, calm) in (None, full)


def test_predict_replays_only_the_pairs_that_hold_a_library_that_is_not_quiet(monkeypatch):
    from support import FIXTURES

    inv = inventory.load_target(str(FIXTURES / "hostile"))
    calm = predict.quiet(inv, inv.libraries)
    replayed = []
    real = predict.simulate
    monkeypatch.setattr(predict, "simulate", lambda inv, seq, firsts=None: (
        replayed.append(seq), real(inv, seq, firsts))[1])
    predict.predict(inv, flags=(Flags.GLOBAL,))
    n, noisy = len(inv.libraries), len(inv.libraries) - len(calm)
    assert 0 < noisy < n and len(replayed) == n * (n - 1) - (n - noisy) * (n - noisy - 1)


def test_a_library_opened_by_its_path_is_not_found_again_by_its_file_name(tmp_path):
    # ld.so answers a later NEEDED name from a loaded library by its SONAME, or as the same
    # file found on disk; the prediction also matched file names: a copy without a SONAME
    # loaded first was taken for the one a library needs (a confident collision that the
    # trials did not have), and a NEEDED name nobody provides was taken as found
    import subprocess

    def build(output, source, *link):
        output.parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "x.c").write_text(source)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(output), str(tmp_path / "x.c"),
                        *link], check=True, cwd=output.parent)

    libs = tmp_path / "libs"
    build(libs / "x" / "libfoo.so", "int foo(void) { return 1; }\n")  # no SONAME
    build(tmp_path / "elsewhere" / "libfoo.so", "int foo(void) { return 2; }\n")
    build(libs / "libbar.so", "int foo(void); int bar(void) { return foo(); }\n",
          f"-L{tmp_path / 'elsewhere'}", "-lfoo")  # no RUNPATH: libfoo.so is nowhere
    done = loadfuzz("matrix", libs, "--out", tmp_path / "out", "--json")
    summary = json.loads(done.stdout)
    assert {r["outcome"] for r in summary["findings"]} == {"load-error"}, done.stderr
    assert len(summary["findings"]) == 4  # libbar.so fails in every pair, first or second
    assert summary["prediction"]["disagree"] == [], summary["prediction"]["disagree"]


def test_a_dependency_found_through_the_rpath_of_the_library_that_loaded_it_is_predicted_found(
        tmp_path):
    """ld.so searches the DT_RPATH of the object that loaded the one asking, and on up (scipy's
    `_fblas` loads `libgfortran`, whose `libquadmath` only `_fblas`'s DT_RPATH finds): scan
    once predicted a load-error for every order that loaded `_fblas`, which loads clean."""

    from support import build, loadfuzz

    (tmp_path / "wheel" / "vendor").mkdir(parents=True)
    (tmp_path / "wheel" / "top").mkdir()
    vendor, top = tmp_path / "wheel" / "vendor", tmp_path / "wheel" / "top"
    build(vendor, "fxquad", "int fx_quad(void) { return 1; }\n")
    # no path of its own: alone, it cannot find libfxquad.so, which lies beside it
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(vendor / "libfxgfort.so"), "-x", "c", "-",
                    f"-L{vendor}", "-lfxquad"], input="int fx_quad(void);\n"
                   "int fx_gfort(void) { return fx_quad(); }\n", text=True, check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(top / "libfxblas.so"), "-x", "c", "-",
                    f"-L{vendor}", "-lfxgfort", "-Wl,--disable-new-dtags,-rpath,$ORIGIN/../vendor"],
                   input="int fx_gfort(void);\nint fx_blas(void) { return fx_gfort(); }\n",
                   text=True, check=True)
    done = loadfuzz("matrix", tmp_path / "wheel", "--flags", "global,local", "--json",
                    "--out", tmp_path / "out")
    summary = json.loads(done.stdout)
    records = [json.loads(line) for line in (tmp_path / "out" / "trials.jsonl").open()]
    failed = {tuple(s["lib"] for s in r["sequence"]) for r in records if r["outcome"] != "clean"}
    # the real runs: the vendored library fails whenever it loads first (libfxquad.so loaded
    # by its path has no SONAME to be found by), never once libfxblas.so loaded it
    gfort, quad = "vendor/libfxgfort.so", "vendor/libfxquad.so"
    assert failed == {(gfort, "top/libfxblas.so"), (gfort, quad), (quad, gfort)}, done.stderr
    assert summary["prediction"]["disagree_count"] == 0, summary["prediction"]["disagree"]
    # and the fix a finding names: the file is shipped, beside the library that needs it (scipy's
    # once read "Ship libquadmath inside the wheel", which it is)
    fixes = [f["text"] for r in records if r["outcome"] != "clean" for f in r["fixes"]]
    assert fixes and not any("Ship" in text for text in fixes)
    assert all("vendor/libfxquad.so" in text and "RUNPATH of $ORIGIN " in text
               for text in fixes if "RUNPATH" in text)
