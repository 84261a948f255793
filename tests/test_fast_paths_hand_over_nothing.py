"""A trial forked from a fork server or a row server gets nothing a cold run would not have.

A clean verdict of a fast path is never run again cold, so each case here is a library whose
order fails in a plain process while a fast path, left unchecked, would hand the trial
something that makes it pass: a descriptor a preload or a row's first step opened (every
trial would share it, where a cold run has its own); libpython's own dependencies (its libm,
put in the global scope with it, resolves a library that forgot `-lm`); a C++ runtime bound
before a library that replaces its operator new was there; a dependency whose own call a library
loaded before it would answer in a cold run. Every verdict of each matrix is checked
against the test's own loader, one fresh process per pair."""

from __future__ import annotations

import json
import resource
import subprocess
from pathlib import Path

from loadfuzz import hostenv
from support import build, loadfuzz

# A runtime whose constructor opens its wake-up channel; a plugin that registers with it is
# checked against the runtime's ABI only while that channel works (an ABI mismatch: abort).
RUNTIME = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
static int wake = -1;
__attribute__((constructor)) static void start(void) { wake = eventfd(0, EFD_CLOEXEC); }
int fdrt_register(const char *abi) {
    uint64_t one = 1;
    if (write(wake, &one, sizeof one) != sizeof one) return -1; /* not running: no check */
    if (strcmp(abi, "v1")) { fprintf(stderr, "fdrt: plugin ABI %s, runtime v1\n", abi); abort(); }
    return 0;
}
"""
# Finds the runtime in the process (a first step loaded it) and registers with it.
LOOKUP = r"""
#include <dlfcn.h>
__attribute__((constructor)) static void plug(void) {
    int (*reg)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "fdrt_register");
    void *runtime = reg ? 0 : dlopen("libfdrt.so", RTLD_NOW | RTLD_NOLOAD);
    if (runtime) reg = (int (*)(const char *))dlsym(runtime, "fdrt_register");
    if (reg) reg("v2");
}
"""
# Needs the runtime (a dependency outside the target, so a fork server preloads it).
LINKED = r"""
extern int fdrt_register(const char *abi);
__attribute__((constructor)) static void plug(void) { fdrt_register("v2"); }
"""


def folders(parent: Path, *names: str) -> list[Path]:
    """New folders of these names in `parent` (a target, and what lies outside it)."""
    made = [parent / name for name in names]
    for folder in made:
        folder.mkdir()
    return made


def plain_libraries(folder: Path, count: int) -> None:
    for i in range(count):
        build(folder, f"plain{i}", f"int plain{i}(void) {{ return {i}; }}\n")


def matrix_agrees_with_the_loader(loader: Path, libs: Path, out: Path,
                                  need_python: tuple[str, ...] = (),
                                  mem_mb: int | None = None) -> dict[tuple, str]:
    """Run the matrix of `libs` (global and local); check every verdict against the loader
    (libpython first, global, for a pair with a library of `need_python`, as a Python process
    has it; `mem_mb`: the matrix's --mem, the loader's RLIMIT_AS); the verdicts by (first,
    second, flags)."""
    ceiling = () if mem_mb is None else ("--mem", str(mem_mb))
    done = loadfuzz("matrix", libs, "--flags", "global,local", *ceiling, "--out", out, "--json")
    assert done.returncode in (0, 1), done.stderr
    verdicts = {}
    for record in map(json.loads, (out / "trials.jsonl").read_text().splitlines()):
        steps = record["sequence"]
        words = [f"{s['flags'][0]}:{libs / s['lib']}" for s in steps]
        if any(s["lib"] in need_python for s in steps):
            words.insert(0, f"g:{hostenv.libpython_path()}")
        plain = subprocess.run([str(loader), *words], capture_output=True, timeout=60,
                               preexec_fn=None if mem_mb is None else lambda: limit_as(mem_mb))
        cold = {0: "clean", -6: "abort", 1: "load-error"}.get(plain.returncode, "?")
        pair = (steps[0]["lib"], steps[1]["lib"], steps[0]["flags"])
        assert record["outcome"] == cold, (pair, record["via"], record["detail"])
        verdicts[pair] = cold
    return verdicts


def limit_as(mem_mb: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))


def test_a_row_whose_first_step_opened_a_descriptor_is_not_shared(loader, tmp_path):
    libs = tmp_path / "libs"
    libs.mkdir()
    build(libs, "fdrt", RUNTIME, "-Wl,-soname,libfdrt.so")
    build(libs, "lookup", LOOKUP)
    plain_libraries(libs, 3)  # the runtime's row is long enough to be shared
    verdicts = matrix_agrees_with_the_loader(loader, libs, tmp_path / "out")
    assert verdicts[("libfdrt.so", "liblookup.so", "global")] == "abort"
    assert verdicts[("libfdrt.so", "liblookup.so", "local")] == "abort"


def test_a_dependency_that_opens_a_descriptor_is_not_preloaded(loader, tmp_path):
    outside, libs = folders(tmp_path, "outside", "libs")
    build(outside, "fdrt", RUNTIME, "-Wl,-soname,libfdrt.so")
    build(libs, "linked", LINKED, f"-L{outside}", "-lfdrt", f"-Wl,-rpath,{outside}")
    plain_libraries(libs, 3)
    verdicts = matrix_agrees_with_the_loader(loader, libs, tmp_path / "out")
    assert verdicts[("liblinked.so", "libplain0.so", "global")] == "abort"
    assert verdicts[("libplain0.so", "liblinked.so", "local")] == "abort"


# Calls cos() but was linked without -lm: it loads only where something put libm in the
# global scope first, as libpython (which needs libm) does when loaded RTLD_GLOBAL.
UNDERLINKED = r"""
#include <math.h>
volatile double angle = 0.5, cosine;
__attribute__((constructor)) static void start(void) { cosine = cos(angle); }
"""


def test_a_library_that_libpythons_libm_would_resolve_does_not_join_a_python_row(
        loader, tmp_path):
    libs = tmp_path / "libs"
    libs.mkdir()
    build(libs, "under", UNDERLINKED, "-fno-builtin")
    for i in range(2):  # their rows have libpython first, RTLD_GLOBAL
        build(libs, f"py{i}", f"extern int Py_IsInitialized(void);\n"
              f"int py{i}(void) {{ return Py_IsInitialized(); }}\n")
    plain_libraries(libs, 2)
    verdicts = matrix_agrees_with_the_loader(loader, libs, tmp_path / "out",
                                             need_python=("libpy0.so", "libpy1.so"))
    assert verdicts[("libplain0.so", "libunder.so", "global")] == "load-error"
    assert verdicts[("libpy0.so", "libunder.so", "global")] == "clean"


# A C library that exports operator new (as a bundled allocator does): in scope before
# libstdc++ is relocated, it is the operator new libstdc++ calls.
OWN_NEW = r"""
#include <stdlib.h>
#include <unistd.h>
void *_Znwm(unsigned long size) {
    static const char said[] = "ownnew: operator new called: heap mismatch\n";
    write(2, said, sizeof said - 1);
    abort();
}
"""
# An ordinary C++ library whose constructor makes libstdc++ allocate.
CXX_USER = r"""
#include <string>
__attribute__((constructor)) static void start() { std::string s; s.reserve(1000); }
"""
# A C++ library with its own operator new, not ready before its constructor ran.
SELF_NEW = r"""
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
static bool ready;
void *operator new(std::size_t size) {
    if (!ready) { std::fputs("selfnew: allocator used too early\n", stderr); std::abort(); }
    return std::malloc(size);
}
__attribute__((constructor(101))) static void start() { std::string s; s.reserve(1000); ready = true; }
"""


def test_a_library_that_replaces_operator_new_is_not_run_beside_a_preloaded_cxx_runtime(
        loader, tmp_path):
    libs = tmp_path / "libs"
    libs.mkdir()
    build(libs, "ownnew", OWN_NEW)
    build(libs, "cxxuser", CXX_USER, cxx=True)  # its libstdc++ makes the light tier preload it
    build(libs, "selfnew", SELF_NEW, cxx=True)
    plain_libraries(libs, 2)
    verdicts = matrix_agrees_with_the_loader(loader, libs, tmp_path / "out")
    assert verdicts[("libownnew.so", "libcxxuser.so", "global")] == "abort"
    assert verdicts[("libselfnew.so", "libplain0.so", "local")] == "abort"
    assert verdicts[("libcxxuser.so", "libplain0.so", "global")] == "clean"


# A dependency that checks, while it loads, that its hook answers as its own does: it calls the
# hook through its PLT, as a shared library calls any function it exports.
HOOKED = r"""
#include <stdio.h>
#include <stdlib.h>
int hook_check(void) { return 0; }
__attribute__((constructor)) static void start(void) {
    if (hook_check() != 0) { fputs("hooked: hook_check answered by another library\n", stderr); abort(); }
}
"""
HOOK = "int hook_check(void) { return 1; }\n"  # another library's hook_check, strong
USES_HOOKED = "extern int hook_check(void);\nint user(void) { return hook_check(); }\n"


def test_a_dependency_whose_call_a_library_loaded_before_it_would_answer_is_not_preloaded(
        loader, tmp_path):
    outside, libs = folders(tmp_path, "outside", "libs")
    build(outside, "hooked", HOOKED, "-Wl,-soname,libhooked.so")
    build(libs, "hook", HOOK)
    build(libs, "user", USES_HOOKED, f"-L{outside}", "-lhooked", f"-Wl,-rpath,{outside}")
    # needs libhook.so, then libhooked.so: its own search list puts the hook first
    build(libs, "bundle", USES_HOOKED, "-Wl,--no-as-needed", "-lhook", f"-L{outside}", "-lhooked",
          f"-Wl,-rpath,{outside}")
    plain_libraries(libs, 2)
    verdicts = matrix_agrees_with_the_loader(loader, libs, tmp_path / "out")
    assert verdicts[("libhook.so", "libuser.so", "global")] == "abort"  # in the global scope first
    assert verdicts[("libhook.so", "libuser.so", "local")] == "clean"
    assert verdicts[("libbundle.so", "libplain0.so", "local")] == "abort"
    assert verdicts[("libplain0.so", "libuser.so", "global")] == "clean"


# A dependency that reads a table it exports (through its GOT, as for any exported object).
TABLE_OWNER = r"""
unsigned CRC_32[2] = {0, 7};
__attribute__((constructor)) static void check_table(void) {
    if (CRC_32[1] != 7) { fputs("hooked: CRC_32 is not mine\n", stderr); abort(); }
}
"""


def test_a_weak_c_hook_or_a_table_named_like_a_version_tag_takes_the_binding_too(loader, tmp_path):
    outside, libs = folders(tmp_path, "outside", "libs")
    build(outside, "hooked", HOOKED + TABLE_OWNER, "-Wl,-soname,libhooked.so")
    build(libs, "weakhook", "__attribute__((weak)) int hook_check(void) { return 1; }\n")
    build(libs, "table", "unsigned CRC_32[2] = {0, 99};\n")  # not a version tag, for all its name
    build(libs, "user", USES_HOOKED, f"-L{outside}", "-lhooked", f"-Wl,-rpath,{outside}")
    plain_libraries(libs, 1)
    verdicts = matrix_agrees_with_the_loader(loader, libs, tmp_path / "out")
    assert verdicts[("libweakhook.so", "libuser.so", "global")] == "abort"
    assert verdicts[("libtable.so", "libuser.so", "global")] == "abort"



def test_a_dependency_preloaded_for_one_library_never_answers_anothers_needed_name(
        loader, tmp_path):
    new, old, libs = folders(tmp_path, "new", "vendored", "libs")
    build(new, "X", "int x_api(void) { return 1; }\nint x_new_api(void) { return 2; }\n",
          "-Wl,-soname,libX.so")
    build(old, "X", "int x_api(void) { return 1; }\n", "-Wl,-soname,libX.so")
    uses = "extern int x_new_api(void);\nint use(void) { return x_new_api(); }\n"
    build(libs, "a", uses, f"-L{new}", "-lX", f"-Wl,-rpath,{new}")
    build(libs, "b", uses, f"-L{new}", "-lX", f"-Wl,-rpath,{old}")  # finds an older libX first
    build(libs, "c", uses, f"-L{new}", "-lX")  # finds none: it loads only after a sibling did
    plain_libraries(libs, 1)
    verdicts = matrix_agrees_with_the_loader(loader, libs, tmp_path / "out")
    assert verdicts[("libplain0.so", "libb.so", "local")] == "load-error"
    assert verdicts[("libplain0.so", "libc.so", "local")] == "load-error"
    assert verdicts[("liba.so", "libc.so", "local")] == "clean"


def test_a_dependency_that_leads_back_to_a_library_under_test_is_not_preloaded(loader, tmp_path):
    outside, libs = folders(tmp_path, "outside", "libs")
    build(libs, "core", '#include <stdio.h>\n#include <stdlib.h>\n__attribute__((constructor)) '
          'static void start(void) { if (getenv("FX_LEGACY")) { fputs("core: legacy backend '
          'selected\\n", stderr); abort(); } }\nint core(void) { return 1; }\n')
    build(outside, "mid", "extern int core(void);\nint mid(void) { return core(); }\n",
          f"-L{libs}", "-lcore", f"-Wl,-rpath,{libs}")
    build(libs, "config", '#include <stdlib.h>\n__attribute__((constructor)) static void set(void)'
          ' { setenv("FX_LEGACY", "1", 1); }\n')
    build(libs, "user", "extern int mid(void);\nint user(void) { return mid(); }\n",
          f"-L{outside}", "-lmid", f"-Wl,-rpath,{outside}")
    verdicts = matrix_agrees_with_the_loader(loader, libs, tmp_path / "out")
    assert verdicts[("libconfig.so", "libuser.so", "local")] == "abort"


# Reserves address space (PROT_NONE: no memory) until the ceiling stops it, and keeps it.
FILL = r"""
#include <sys/mman.h>
__attribute__((constructor)) static void fill(void) {
    while (mmap(0, 16 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) != MAP_FAILED) {}
}
"""
# A dependency with 512 MiB of zeroed data: loading it maps that much address space.
BIG = "char big[512 << 20];\nchar *big_data(void) { return big; }\n"
NEEDS_BIG = "extern char *big_data(void);\nchar *needs_big(void) { return big_data(); }\n"


def test_under_a_memory_ceiling_of_the_users_own_nothing_is_mapped_outside_it(loader, tmp_path):
    # a fork server maps its preload before the trial sets RLIMIT_AS: the dependency's 512 MiB
    # would be there already, where the cold run must map them after `fill` took what was left
    outside, libs = folders(tmp_path, "outside", "libs")
    build(outside, "big", BIG)
    build(libs, "needs_big", NEEDS_BIG, f"-L{outside}", "-lbig", f"-Wl,-rpath,{outside}")
    build(libs, "fill", FILL)
    plain_libraries(libs, 3)  # fill's row is long enough to be shared
    verdicts = matrix_agrees_with_the_loader(loader, libs, tmp_path / "out", mem_mb=1024)
    assert verdicts[("libfill.so", "libneeds_big.so", "global")] == "load-error"
    assert verdicts[("libneeds_big.so", "libfill.so", "local")] == "clean"


# A dependency whose constructor takes half a second (a slow set-up, as libtorch_cpu.so's load).
SLOW = r"""
#include <time.h>
__attribute__((constructor)) static void start(void) {
    struct timespec half = {0, 500000000};
    nanosleep(&half, 0);
}
int slow(void) { return 1; }
"""
NEEDS_SLOW = "extern int slow(void);\nint needs_slow(void) { return slow(); }\n"


def test_a_time_limit_shorter_than_what_a_server_spared_is_kept_as_the_cold_run_keeps_it(tmp_path):
    # preloaded, the dependency's half second is spent before the trial's clock starts, where
    # the cold run spends it in the step that maps it: past a 0.2 s limit
    outside, libs = folders(tmp_path, "outside", "libs")
    build(outside, "slow", SLOW)
    build(libs, "needs_slow", NEEDS_SLOW, f"-L{outside}", "-lslow", f"-Wl,-rpath,{outside}")
    plain_libraries(libs, 3)  # rows long enough to be shared
    outcomes = {}
    for way in ("fast", "cold"):
        out = tmp_path / way
        words = ("--cold",) if way == "cold" else ()
        done = loadfuzz("matrix", libs, "--flags", "global", "--timeout", "0.2", *words, "--out", out)
        assert done.returncode == 1, done.stderr
        records = map(json.loads, (out / "trials.jsonl").read_text().splitlines())
        outcomes[way] = {tuple(s["lib"] for s in r["sequence"]): r["outcome"] for r in records}
    assert outcomes["fast"] == outcomes["cold"]
    assert {pair: outcome for pair, outcome in outcomes["cold"].items() if outcome != "clean"} == {
        pair: "timeout" for pair in outcomes["cold"] if "libneeds_slow.so" in pair}
