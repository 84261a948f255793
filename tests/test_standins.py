"""Stand-ins: a library under test loaded ahead of a step only where the dynamic loader itself
(LD_DEBUG=bindings,files) shows that the process ends up as the step alone leaves it.

The torch wheel is the example: libtorch_cpu.so (~200 ms to load) stands in front of
libtorch.so, libshm.so and itself, and, after a first step that does not reach it, in front of
a second that does, and in front of a plugin that repeats libtorch_cpu.so's template instances
and type_info objects (copies of one thing, by C++'s one-definition rule); never where a
definition of the plugin's own would take a binding."""

from __future__ import annotations

import json
import subprocess

import pytest

from loadfuzz import hostenv, inventory, plan
from loadfuzz.model import Flags, Step, StepKind
from loadfuzz.run.harness import Harness, HarnessDied, HarnessStep, Limits
from loadfuzz.run.standins import StandIns
from loadfuzz.run.tiers import Tiers
from loadfuzz.run.trials import Trials, harness_steps
from support import (
    IFUNC_LIBRARY,
    IFUNC_PLUGIN,
    bindings_that_moved,
    build,
    hostile,
    loadfuzz,
    only_copies_moved,
    processes_holding,
    what_the_loader_did,
)


@pytest.fixture(scope="module")
def torch_tiers():
    inv = inventory.load_target("torch")
    return inv, Tiers.of(inv.libraries, link_map=inv.link_map)


@pytest.fixture(scope="module")
def executorch_tiers():
    inv = inventory.load_target("executorch")
    return inv, Tiers.of(inv.libraries, link_map=inv.link_map)


def routes_with_stand_ins(inv, tiers: Tiers, flags: Flags):
    """Each way the matrix under `flags` puts a stand-in in front of a step (one trial per
    server and row server, the first): the process with the stand-ins, the one without."""
    found = {}
    for seq in plan.pairs(inv.libraries, [flags]):
        steps, prelude = harness_steps(seq, tiers)  # libpython, when needed, is a `g` step
        route = tiers.route(seq, steps, prelude)
        if (route.preload != route.tier or route.hidden) and route not in found:
            warm = [*route.preload, *route.prefix, *route.hidden, *steps[len(route.prefix):]]
            found[route] = (warm, [*route.tier, *steps])
    return list(found.values())


@pytest.mark.parametrize("flags", [Flags.GLOBAL, Flags.LOCAL])
@pytest.mark.parametrize("target", ["torch", "executorch"])
def test_every_stand_in_of_a_wheel_matrix_leaves_the_bindings_and_constructors_of_the_cold_run(
        loader, request, tmp_path, target, flags):
    inv, tiers = request.getfixturevalue(f"{target}_tiers")
    routes = routes_with_stand_ins(inv, tiers, flags)
    assert len(routes) > 10
    for warm, cold in routes:
        (warm_bindings, warm_inits), (cold_bindings, cold_inits) = (
            what_the_loader_did(loader, steps, tmp_path) for steps in (warm, cold))
        assert warm_inits == cold_inits, [s.path.name for s in warm]
        assert only_copies_moved(bindings_that_moved(warm_bindings, cold_bindings)) == [], \
            [s.path.name for s in warm]


def test_libtorch_cpu_stands_in_front_of_a_plugin_whose_copies_of_its_templates_take_its_bindings_cold(
        loader, torch_tiers, tmp_path):
    """libaoti_custom_ops.so repeats template instances and type_info objects of
    libtorch_cpu.so: cold, libtorch_cpu.so binds those references to the plugin's copies (the
    plugin comes first in its search list); loaded ahead, to its own. By C++'s
    one-definition rule they are one thing, as the tiers take them (`rebinding`), so
    libtorch_cpu.so may stand in: the loader shows that nothing else moved."""
    inv, tiers = torch_tiers
    plugin = next(lib for lib in inv.libraries if lib.path.name == "libaoti_custom_ops.so")
    cpu = next(lib for lib in inv.libraries if lib.path.name == "libtorch_cpu.so")
    [seq] = [s for s in plan.pairs(inv.libraries, [Flags.GLOBAL])
             if s[0].path == plugin.path and s[1].path == cpu.path]
    steps, prelude = harness_steps(seq, tiers)
    route = tiers.route(seq, steps, prelude)
    assert HarnessStep("l", cpu.path) in route.preload
    ahead, alone = (what_the_loader_did(loader, [*route.tier, *pre, steps[0]], tmp_path)
                    for pre in ([HarnessStep("l", cpu.path)], []))
    assert ahead[1] == alone[1]
    moved = bindings_that_moved(ahead[0], alone[0])
    assert any(who.endswith("libtorch_cpu.so") and name.startswith("_ZTI")
               and to == (str(cpu.path), str(plugin.path)) for (who, name), to in moved.items())
    assert only_copies_moved(moved) == []


def test_libtorch_cpu_not_under_test_stands_in_after_a_first_step_whose_copies_it_binds_either_way(
        executorch_tiers):
    """libexecutorch_threadpool.so, loaded RTLD_GLOBAL first, answers libtorch_cpu.so's
    cpuinfo and pthreadpool references in the cold run, so its trials cannot fork from the
    heavy server. After it, libtorch_cpu.so (a dependency, not under test) stands in front of
    the torch plugins, where it binds to the same copies; not in front of `_C`, whose own
    search list brings libexecutorch_kernels_optimized.so's BLAS ahead of it. (ld.so's own
    account of every such route: the test above.)"""
    inv, tiers = executorch_tiers
    by_name = {lib.path.name.split(".")[0]: lib for lib in inv.libraries}
    first = by_name["libexecutorch_threadpool"]
    hidden = {}
    for seq in plan.pairs(inv.libraries, [Flags.GLOBAL]):
        if seq[0].path == first.path:
            steps, prelude = harness_steps(seq, tiers)
            route = tiers.route(seq, steps, prelude)
            assert not any(step.path.name == "libtorch_cpu.so" for step in route.preload)
            hidden[seq[1].path.name.split(".")[0]] = [step.path.name for step in route.hidden]
    assert {name for name, steps in hidden.items() if steps == ["libtorch_cpu.so"]} == {
        "libcustom_ops_aot_lib", "libquantized_ops_aot_lib", "_training_lib"}
    assert hidden["_C"] != ["libtorch_cpu.so"]


# libcore.so calls core::work() through its PLT (a C++ name, spelt out for a C compiler); each
# plugin needs libcore.so and defines core::work() too: as a template instance would (weak), or
# as code of its own (strong).
CORE = r"""
#include <stdio.h>
void core_work(void) __asm__("_ZN4core4workEv");
void core_work(void) {}
__attribute__((constructor)) static void core_init(void) { core_work(); }
"""
PLUGIN = r"""
void core_work(void) __asm__("_ZN4core4workEv");
%s void core_work(void) { }
int plugin(void) { return 0; }
"""


@pytest.mark.parametrize(("definition", "stands_in"), [("__attribute__((weak))", True), ("", False)])
def test_a_library_stands_in_front_of_a_plugin_with_a_copy_of_its_function_but_not_its_own_code(
        loader, tmp_path, definition, stands_in):
    core = build(tmp_path, "core", CORE)
    plugin = build(tmp_path, "plugin", PLUGIN % definition, "-Wl,--no-as-needed", "-lcore")
    inv = inventory.load_target(str(tmp_path))
    model = StandIns(inv.link_map, [core, plugin])
    facts = inv.link_map.files
    ahead = what_the_loader_did(loader, [HarnessStep("l", core), HarnessStep("g", plugin)],
                                tmp_path)
    alone = what_the_loader_did(loader, [HarnessStep("g", plugin)], tmp_path)
    moved = bindings_that_moved(ahead[0], alone[0])
    assert moved == {(str(core), "_ZN4core4workEv"): (str(core), str(plugin))}
    assert (only_copies_moved(moved) == []) is stands_in
    assert model.stands_in(model.start(()), facts[core], facts[plugin], True) is stands_in


# A library and a plugin that needs it, which abort cold only: the plugin's definition of a
# function the library's constructor calls answers it (the plugin comes first in its own
# search list), or the plugin's relocation resolves the library's IFUNC before the library's
# constructor ran. The ways a model can miss it.
ANSWERED_BY_THE_PLUGIN = {
    "a function named like a version tag": (False, r"""
#include <stdio.h>
int CHECK_1(void) { return 0; }
__attribute__((constructor)) static void init(void) { if (CHECK_1()) puts("?"); }
""", r"""
#include <stdlib.h>
int CHECK_1(void) { abort(); }
"""),
    "the plugin's own __cxa_throw (a hook, not a copy of the runtime)": (True, r"""
__attribute__((constructor)) static void init() { try { throw 42; } catch (int) {} }
""", r"""
#include <cstdlib>
extern "C" void __cxa_throw(void *, void *, void (*)(void *)) { std::abort(); }
"""),
    "a copy that answers a weak reference nothing answers when the library is ahead": (False, r"""
extern int hook(void) __asm__("_ZN4core4hookEv") __attribute__((weak));
__attribute__((constructor)) static void init(void) { if (hook) hook(); }
""", r"""
#include <stdlib.h>
int hook(void) __asm__("_ZN4core4hookEv");
__attribute__((weak)) int hook(void) { abort(); }
"""),
    "an IFUNC whose resolver reads what the library's constructor set": (
        False, IFUNC_LIBRARY, IFUNC_PLUGIN),
    "the plugin's own definition of a function the library has an inline copy of": (True, r"""
#include <cstdio>
inline int answer() { return 0; }
__attribute__((constructor)) static void init() { std::printf("%d\n", answer()); }
""", r"""
#include <cstdlib>
int answer() { std::abort(); }
"""),
}


@pytest.mark.parametrize("case", ANSWERED_BY_THE_PLUGIN)
def test_a_library_never_stands_in_front_of_a_plugin_whose_own_definition_answers_it_cold(
        loader, tmp_path, case):
    cxx, library_source, plugin_source = ANSWERED_BY_THE_PLUGIN[case]
    library = build(tmp_path, "heavy", library_source, cxx=cxx)
    plugin = build(tmp_path, "plug", plugin_source, "-Wl,--no-as-needed", "-lheavy", cxx=cxx)
    cold = subprocess.run([str(loader), f"g:{plugin}"], capture_output=True, timeout=60)
    ahead = subprocess.run([str(loader), f"l:{library}", f"g:{plugin}"], capture_output=True,
                           timeout=60)
    assert (cold.returncode, ahead.returncode) == (-6, 0)  # loaded ahead, it would hide the abort
    inv = inventory.load_target(str(tmp_path))
    model, facts = StandIns(inv.link_map, [library, plugin]), inv.link_map.files
    assert not model.stands_in(model.start(()), facts[library], facts[plugin], True)


def test_what_a_preload_printed_opens_every_trial_output_as_head_and_tail():
    flood = hostile("flood")  # 100 MB on stderr, then "fx_flood: done"
    with Harness([HarnessStep("l", flood)]) as server:
        assert server.preload_output.endswith(b"fx_flood: done\n")
        assert b"bytes not kept" in server.preload_output
        evidence = server.run([HarnessStep("g", hostile("clean"))], Limits())
    assert evidence.output.startswith(server.preload_output[:100])
    assert evidence.output.endswith(b"fx_flood: done\n")


@pytest.mark.parametrize(("fixture", "why"), [("thread_lock", "runs more than one thread"),
                                              ("fork200", "has a child process")])
def test_a_server_whose_preload_a_fork_would_not_copy_whole_does_not_start(fixture, why):
    with pytest.raises(HarnessDied, match=why):
        Harness([HarnessStep("l", hostile(fixture))])
    assert processes_holding(hostile(fixture)) == []  # nor leaves what the preload started


def test_a_torch_plugin_row_is_one_row_with_libpython_first_and_the_loader_agrees_nothing_moves(
        loader, torch_tiers, tmp_path):
    """The pairs that need libpython (a plugin then torch/_C or libtorch_python) and those that
    do not (the plugin then anything else) begin with the same step: they share one row
    server, libpython first, because no object those trials map defines or references a
    name libpython defines. The loader's own account of each joined trial, cold and with
    libpython first, is the same but for libpython's own relocations and constructor (and
    for bindings between copies of one thing, where a stand-in leads the row)."""
    inv, tiers = torch_tiers
    work = plan.pairs(inv.libraries, [Flags.GLOBAL])
    with Trials(Limits(), tiers) as trials:
        batches = trials.batches(work)
        plugin_rows = [b for b in batches if b[0][0].path.name == "libaoti_custom_ops.so"]
        assert [len(row) for row in plugin_rows] == [len(inv.libraries) - 1]
        joined = [seq for seq in work if trials.joins(seq)]
        assert {seq[0].path.name for seq in joined} >= {"libaoti_custom_ops.so",
                                                         "libtorchbind_test.so"}
        assert not any(tiers.needs_python(seq) for seq in joined)
        python = hostenv.libpython_path()
        checked = {}
        for seq in joined:
            checked.setdefault(seq[0].path, seq)
        for seq in checked.values():
            route = trials.route_of(seq)
            steps, prelude = harness_steps(seq, tiers, True)
            assert prelude == 1 and steps[0] == HarnessStep("g", python)
            warm_bindings, warm_inits = what_the_loader_did(loader, [*route.preload, *steps],
                                                            tmp_path)
            cold_bindings, cold_inits = what_the_loader_did(
                loader, [*tiers.preload(seq), *harness_steps(seq, tiers)[0]], tmp_path)
            assert not any(to.endswith(python.name) for who, to, _ in warm_bindings
                           if not who.endswith(python.name)), seq
            apart_from_python = {b for b in warm_bindings if not b[0].endswith(python.name)}
            assert only_copies_moved(bindings_that_moved(apart_from_python, cold_bindings)) == []
            assert [i for i in warm_inits if not i.endswith(python.name)] == cold_inits


def test_a_library_that_defines_a_name_libpython_defines_never_gets_libpython_first(tmp_path):
    folder = tmp_path / "libs"
    folder.mkdir()
    for name, source in (("shadow", "int Py_IsInitialized(void) { return 1; }\n"),
                         ("plain", "int plain_answer(void) { return 42; }\n")):
        (tmp_path / f"{name}.c").write_text(source)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(folder / f"lib{name}.so"),
                        str(tmp_path / f"{name}.c")], check=True)
    inv = inventory.load_target(str(folder))
    tiers = Tiers.of(inv.libraries, link_map=inv.link_map)
    alone = {lib.path.name: (Step(StepKind.DLOPEN, lib.id, Flags.GLOBAL, lib.path),)
             for lib in inv.libraries}
    assert {name: tiers.python_inert(seq) for name, seq in alone.items()} == {
        "libplain.so": True, "libshadow.so": False}
    assert not tiers.python_inert(alone["libplain.so"] + alone["libshadow.so"])


# Aborts unless libpython is in the process; asks by a weak reference, so it loads either way.
INSISTS = r"""
#include <stdio.h>
#include <stdlib.h>
extern int Py_IsInitialized(void) __attribute__((weak));
__attribute__((constructor)) static void insists(void) {
    if (!Py_IsInitialized) { fputs("insists: no libpython here\n", stderr); abort(); }
}
"""


def test_a_library_that_looks_for_libpython_by_a_weak_reference_gets_it_only_as_cold(
        loader, tmp_path):
    """libinsists.so needs no libpython to load, so its cold pairs with plain libraries run
    without it, and abort. Its pairs with libraries that need libpython share its row
    (libpython first): the pairs with plain libraries must not join that row, where they
    would run clean. Every verdict of the matrix is checked against the test's own loader."""
    libs = tmp_path / "libs"
    libs.mkdir()
    build(libs, "insists", INSISTS)
    for i in range(4):
        build(libs, f"needs{i}", "extern int Py_IsInitialized(void);\n"
              f"int n{i}(void) {{ return Py_IsInitialized(); }}\n")
        build(libs, f"plain{i}", f"int p{i}(void) {{ return {i}; }}\n")

    loadfuzz("matrix", libs, "--flags", "global", "--out", tmp_path / "out")
    records = [json.loads(line) for line in (tmp_path / "out" / "trials.jsonl").open()]
    assert len(records) == 9 * 8
    python = HarnessStep("g", hostenv.libpython_path())
    verdicts = {}
    for record in records:
        pair = [step["lib"] for step in record["sequence"]]
        steps = [HarnessStep("g", libs / name) for name in pair]
        if any(name.startswith("libneeds") for name in pair):
            steps.insert(0, python)
        done = subprocess.run([str(loader), *(f"{s.mode}:{s.path}" for s in steps)],
                              capture_output=True, timeout=60)
        cold = "abort" if done.returncode == -6 else "clean" if done.returncode == 0 else "?"
        assert record["outcome"] == cold, (pair, record["detail"])
        verdicts[tuple(pair)] = cold
    assert verdicts[("libinsists.so", "libplain0.so")] == "abort"
    assert verdicts[("libinsists.so", "libneeds0.so")] == "clean"
    inv = inventory.load_target(str(libs))
    tiers = Tiers.of(inv.libraries, link_map=inv.link_map)
    insists = (Step(StepKind.DLOPEN, "libinsists.so", Flags.GLOBAL, libs / "libinsists.so"),)
    assert not tiers.needs_python(insists) and not tiers.python_inert(insists)


def test_a_weak_reference_that_a_later_library_defines_keeps_its_library_out_of_the_way(
        loader, tmp_path):
    """libhooked.so refers weakly to `hook`, which libhook.so defines; libuser.so needs both
    (libhook.so first). Cold, dlopen(libuser.so) binds hooked's reference to libhook.so's
    `hook`; loaded ahead alone, libhooked.so would leave it null. So libhooked.so never
    stands in front of libuser.so, though its objects and constructors would allow it."""
    hook = build(tmp_path, "hook", "int hook(void) { return 7; }\n")
    hooked = build(tmp_path, "hooked", "extern int hook(void) __attribute__((weak));\n"
                   "int hooked(void) { return hook ? hook() : -1; }\n")
    user = build(tmp_path, "user", "int user(void) { return 0; }\n",
                 "-Wl,--no-as-needed", "-lhook", "-lhooked")
    inv = inventory.load_target(str(tmp_path))
    model = StandIns(inv.link_map, [hook, hooked, user])
    facts = inv.link_map.files
    ahead = what_the_loader_did(loader, [HarnessStep("l", hooked), HarnessStep("g", user)],
                                tmp_path)
    alone = what_the_loader_did(loader, [HarnessStep("g", user)], tmp_path)
    assert ahead[1] == alone[1]  # the same constructors, in the same order
    assert {name for who, to, name in alone[0] - ahead[0] if who.endswith("libhooked.so")} == {"hook"}
    assert not model.stands_in(model.start(()), facts[hooked], facts[user], True)
