"""A trial forks from a server whose preloaded objects (torch's libraries, the C++ runtime) were
relocated before the trial began; it may do so only where its cold run would bind them the same
way. The model (`Rebinding`) against the dynamic loader's own report (LD_DEBUG=bindings) of a
plain process that takes the same steps.

The executorch wheel is the example: libexecutorch_threadpool.so exports its own copies of
cpuinfo and pthreadpool, which libtorch_cpu.so also calls; loaded RTLD_GLOBAL before a library
that pulls in libtorch_cpu.so, it answers those calls in the cold run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from loadfuzz import hostenv, inventory, plan
from loadfuzz.model import Flags
from loadfuzz.run.harness import HarnessStep
from loadfuzz.run.standins import a_copy
from loadfuzz.run.tiers import Tiers
from support import ET, IFUNC_LIBRARY, IFUNC_PLUGIN, build, loadfuzz, what_the_loader_did

AOT = "kernels/quantized/libquantized_ops_aot_lib.so"


@pytest.fixture(scope="module")
def executorch():
    inv = inventory.load_target("executorch")
    return inv, Tiers.of(inv.libraries, link_map=inv.link_map)


def taken_over(loader, inv, first: str, second: str, flags: Flags, scratch) -> set[str]:
    """The names a library outside the wheel (torch's, the C++ runtime) binds, in a plain
    process that loads libpython then `first` then `second`, to a strong definition in a library
    of the wheel (copies of one thing by the one-definition rule aside)."""
    libs = {lib.id: lib.path for lib in inv.libraries}
    mode = "g" if flags is Flags.GLOBAL else "l"
    steps = [HarnessStep("g", hostenv.libpython_path()),
             *(HarnessStep(mode, libs[lib]) for lib in (first, second))]
    bindings, _ = what_the_loader_did(loader, steps, scratch)
    facts = {path.resolve(): facts for path, facts in inv.link_map.files.items()}
    wheel = ET.resolve()
    return {name for who, to, name in bindings
            if not Path(who).resolve().is_relative_to(wheel) and Path(to).resolve().is_relative_to(wheel)
            and (definer := facts.get(Path(to).resolve())) is not None
            and name in definer.strong and not a_copy(definer, name)}


def forks_from_the_heavy_server(inv, tiers: Tiers, first: str, second: str, flags: Flags) -> bool:
    libs = {lib.id: lib for lib in inv.libraries}
    seq = (plan.dlopen(libs[first], flags), plan.dlopen(libs[second], flags))
    return tiers.preload(seq) == tiers.preloads[-1]


@pytest.mark.parametrize("flags", [Flags.GLOBAL, Flags.LOCAL])
def test_the_threadpools_cpuinfo_answers_libtorch_cpu_only_when_loaded_global_before_it(
        loader, executorch, tmp_path, flags):
    inv, tiers = executorch
    first = "lib/libexecutorch_threadpool.so"
    names = taken_over(loader, inv, first, AOT, flags, tmp_path)
    assert ("cpuinfo_initialize" in names) is (flags is Flags.GLOBAL)
    assert forks_from_the_heavy_server(inv, tiers, first, AOT, flags) is (not names)


def test_a_bundled_copy_of_the_cxx_runtime_does_not_keep_a_trial_from_the_heavy_server(
        loader, executorch, tmp_path):
    inv, tiers = executorch
    # libexecutorch.so exports std::__throw_bad_array_new_length, which libtorch_cpu.so imports
    first = "lib/libexecutorch.so"
    path = next(lib.path for lib in inv.libraries if lib.id == first)
    assert "_ZSt28__throw_bad_array_new_lengthv" in inv.link_map.files[path].strong
    assert not taken_over(loader, inv, first, AOT, Flags.GLOBAL, tmp_path)
    assert forks_from_the_heavy_server(inv, tiers, first, AOT, Flags.GLOBAL)


def test_every_library_loaded_global_before_a_torch_plugin_leaves_the_heavy_server_only_if_the_loader_says_so(
        loader, executorch, tmp_path):
    inv, tiers = executorch
    verdicts = {}
    for lib in inv.libraries:
        if lib.id == AOT:
            continue
        names = taken_over(loader, inv, lib.id, AOT, Flags.GLOBAL, tmp_path)
        verdicts[lib.id] = bool(names)
        assert forks_from_the_heavy_server(inv, tiers, lib.id, AOT, Flags.GLOBAL) is (not names), \
            (lib.id, sorted(names)[:5])
    assert any(verdicts.values()) and not all(verdicts.values())


def test_a_trial_that_rebinds_torch_still_forks_from_libpython_and_the_cxx_runtime(executorch):
    inv, tiers = executorch
    libs = {lib.id: lib for lib in inv.libraries}
    # _C's own search list puts the threadpool's cpuinfo before libtorch_cpu.so's
    seq = (plan.dlopen(libs["lib/libexecutorch_etdump.so"], Flags.LOCAL),
           plan.dlopen(libs["extension/pybindings/_C.cpython-311-x86_64-linux-gnu.so"], Flags.LOCAL))
    preloaded = [step.path.name for step in tiers.preload(seq)]
    assert preloaded and "libstdc++.so.6" in preloaded and preloaded[0].startswith("libpython")
    assert not any(name.startswith(("libtorch", "libc10")) for name in preloaded)


# libheavy.so, a dependency outside the target (so the servers preload it, constructor and
# all), and libplug.so, which needs it: cold, libheavy.so is mapped and relocated during
# libplug.so's load, before any constructor of that load runs; in a server it was relocated
# and initialised before the trial. Each pair of sources aborts one way only.
RELOCATED_IN_THE_STEP = {
    # a weak reference left null in the server; cold, libplug.so's weak copy (as an inline
    # function would be) answers it: a copy of one thing is no copy of nothing
    "a weak reference a copy answers": (
        'extern int hook(void) __asm__("_ZN4core4hookEv") __attribute__((weak));\n'
        "__attribute__((constructor)) static void init(void) { if (hook) hook(); }\n",
        '#include <stdlib.h>\nint hook(void) __asm__("_ZN4core4hookEv");\n'
        "__attribute__((weak)) int hook(void) { abort(); }\n"),
    # an IFUNC whose resolver reads what libheavy.so's constructor set: cold, libplug.so's
    # relocation resolves it before that constructor ran
    "an IFUNC resolved before the library's constructor": (IFUNC_LIBRARY, IFUNC_PLUGIN),
}


@pytest.mark.parametrize("case", RELOCATED_IN_THE_STEP)
def test_a_trial_that_relocates_a_preloaded_library_otherwise_does_not_fork_from_its_server(
        loader, tmp_path, case):
    """The trials of libplug.so do not fork from libheavy.so's server (libuser.so's, which
    needs libheavy.so and defines nothing, still do). Every verdict against the tests' plain
    loader."""
    heavy, plug = RELOCATED_IN_THE_STEP[case]
    dep, target = tmp_path / "dep", tmp_path / "target"
    dep.mkdir()
    target.mkdir()
    build(dep, "heavy", heavy)
    uses_heavy = ("-Wl,--no-as-needed", f"-L{dep}", "-lheavy", f"-Wl,-rpath,{dep}")
    build(target, "plug", plug, *uses_heavy)
    build(target, "user", "int user(void) { return 3; }\n", *uses_heavy)
    build(target, "other", "int other(void) { return 2; }\n")
    done = loadfuzz("matrix", target, "--flags", "global,local", "--out", tmp_path / "out")
    assert done.returncode == 1, done.stderr
    for line in (tmp_path / "out" / "trials.jsonl").open():
        record = json.loads(line)
        steps = [f"{step['flags'][0]}:{target / step['lib']}" for step in record["sequence"]]
        cold = subprocess.run([str(loader), *steps], capture_output=True, timeout=60)
        assert (record["outcome"], cold.returncode) in {("abort", -6), ("clean", 0)}, \
            (steps, record["outcome"], record["via"])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert any("libheavy.so" in str(preloaded) for preloaded in summary["preload"])  # for libuser.so
