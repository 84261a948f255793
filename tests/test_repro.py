"""`repro` turns one line of a crash log into the smallest load order that reproduces it."""

import itertools
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from loadfuzz.campaign import Quiet
from loadfuzz.model import Flags, Outcome
from loadfuzz.run.harness import Limits
from loadfuzz.run.trials import Trials
from loadfuzz.search.once import RunOnce
from loadfuzz.search.repro import read_message
from support import FIXTURES, LEGACY_PLUGIN, LOADFUZZ, build, hostile, loadfuzz, step

ET_LINE = ("E 00:00:01.634411 executorch:operator_registry.cpp:102] Re-registering "
           "quantized_decomposed::add.out, from NOT_SUPPORTED")
TORCH_TEXT = ("RuntimeError: Tried to register an operator (quantized_decomposed::add.out(Tensor a, "
              "Tensor(a!) out) -> Tensor(a!)) with the same name and overload name multiple times.")


@pytest.mark.parametrize("text", [ET_LINE, "Re-registering quantized_decomposed::add.out"])
def test_the_executorch_line_is_read_with_or_without_its_log_prefix(text):
    message = read_message(f"some earlier line\n{text}\nAborted (core dumped)\n")
    assert (message.signature, message.op) == ("executorch-reregister",
                                               "quantized_decomposed::add.out")


def test_a_line_copied_from_a_ci_log_is_read_without_its_time_stamp_and_colours():
    log = ("2026-12-05T04:12:00.1234567Z \x1b[36;1mpython -c 'import app'\x1b[0m\n"
           f"2026-12-05T04:12:01.0000001Z \x1b[31m{ET_LINE}\x1b[0m\n")
    message = read_message(log)
    assert (message.text, message.op) == (ET_LINE, "quantized_decomposed::add.out")
    unknown = read_message("2026-12-05T04:12:01Z \x1b[1mfatal: widget table corrupt\x1b[0m\n")
    assert unknown.signature is None and unknown.needle == "fatal: widget table corrupt"


def test_the_pytorch_duplicate_operator_text_is_read():
    message = read_message(TORCH_TEXT)
    assert (message.signature, message.op) == ("torch-duplicate-op",
                                               "quantized_decomposed::add.out")


@pytest.mark.parametrize("quote", ["'", '"', "`"])
def test_a_line_quoted_whole_is_read_as_the_line(quote):
    for line in ("undefined symbol: fx_nowhere", TORCH_TEXT):
        assert read_message(f"{quote}{line}{quote}") == read_message(line)


@pytest.mark.parametrize("line", ["Segmentation fault (core dumped)",
                                  "Fatal Python error: Segmentation fault"])
def test_a_crash_line_that_names_no_message_is_reproduced_by_its_signal(line, tmp_path):
    assert read_message(line).signal == signal.SIGSEGV
    libs = tmp_path / "libs"
    libs.mkdir()
    for name in ("clean", "segv"):
        shutil.copy(hostile(name), libs)
    done = loadfuzz("repro", line, libs, "--out", tmp_path / "out", "--json")
    result = json.loads(done.stdout)
    assert done.returncode == 0 and result["reproduced"], done.stderr
    assert result["record"]["signal"] == signal.SIGSEGV
    said = loadfuzz("repro", line, libs, "--out", tmp_path / "again")
    assert "[killed by SIGSEGV]" in said.stdout.splitlines()[0]  # not "an unknown line"


def test_a_shells_killed_line_is_reproduced_by_a_library_that_hangs(tmp_path):
    assert read_message("bash: line 1:  4242 Killed   python train.py").signal == signal.SIGKILL
    assert read_message("Killed\n").signal == signal.SIGKILL
    assert read_message("warning: Killed the cache daemon").signal is None
    libs = tmp_path / "libs"
    libs.mkdir()
    for name in ("clean", "hang"):
        shutil.copy(hostile(name), libs)
    done = loadfuzz("repro", "Killed", libs, "--timeout", "1", "--out", tmp_path / "out", "--json")
    result = json.loads(done.stdout)
    assert done.returncode == 0 and result["reproduced"], done.stderr
    assert (result["record"]["outcome"], result["record"]["signal"]) == ("timeout", signal.SIGKILL)


def test_an_abort_line_with_nothing_else_is_reproduced_by_sigabrt_but_an_abort_message_wins():
    assert read_message("Aborted (core dumped)\n").signal == signal.SIGABRT
    message = read_message("fatal: widget table corrupt\nAborted (core dumped)\n")
    assert message.signal is None and message.needle == "fatal: widget table corrupt"


def test_an_unknown_abort_line_is_kept_as_text_to_look_for():
    message = read_message("loading...\nF 00:00:00.1 foo.cpp:3] fatal: widget table corrupt\n")
    assert message.signature is None and message.needle == "fatal: widget table corrupt"


def test_the_seed_abort_reproduces_with_two_libraries(tmp_path):
    done = loadfuzz("repro", "Re-registering quantized_decomposed::add.out", "executorch",
                    "--add", LEGACY_PLUGIN, "--out", tmp_path / "out", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["reproduced"] is True
    record = result["record"]
    assert len(record["sequence"]) == 2
    assert "extra/libquantized_ops_legacy_plugin.so" in {s["lib"] for s in record["sequence"]}
    assert (record["signature"], record["op"]) == ("executorch-reregister",
                                                   "quantized_decomposed::add.out")
    assert "extra/libquantized_ops_legacy_plugin.so" in result["candidates"]
    script = tmp_path / "out" / "repro.sh"
    assert script.stat().st_mode & 0o111
    rerun = __import__("subprocess").run(["sh", str(script)], capture_output=True, text=True)
    assert rerun.returncode == 1 and "Re-registering quantized_decomposed::add.out" in rerun.stdout


def test_another_operator_both_copies_carry_reproduces_the_collision_that_stops_first(tmp_path):
    """The registry aborts at the first duplicate it meets (add.out, of 21): a report naming
    another of them is the same collision."""
    op = "quantized_decomposed::dequantize_per_channel.out"
    done = loadfuzz("repro", f"Re-registering {op}", "executorch", "--add", LEGACY_PLUGIN,
                    "--out", tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the registry stopped at quantized_decomposed::add.out" in done.stdout
    assert f"also both carry {op}" in done.stdout
    result = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (result["op"], result["record"]["op"]) == (op, "quantized_decomposed::add.out")
    assert result["tried"] < 50


def test_a_log_file_works_as_well_as_a_message(tmp_path):
    log = tmp_path / "crash.log"
    log.write_text(f"I 00:00:00.1 starting\n{ET_LINE.replace('quantized_decomposed::add.out', 'cz::pair_op.out')}\n")
    done = loadfuzz("repro", "--log", log, FIXTURES / "corpus", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "libcz_pair_a.so" in done.stdout and "libcz_pair_b.so" in done.stdout


def test_a_collision_reachable_only_through_the_global_scope_needs_three_steps(tmp_path):
    done = loadfuzz("repro", "Re-registering cz::triple_op.out", FIXTURES / "corpus",
                    "--out", tmp_path / "out", "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)["record"]
    assert next((s["lib"], s["flags"]) for s in record["sequence"]) == ("libcz_registry.so",
                                                                       "global")
    assert len(record["sequence"]) == 3


def test_a_needle_is_found_wherever_it_falls_across_the_chunks_a_file_is_read_in(tmp_path):
    from loadfuzz.elf.opnames import found_in

    needles = [b"ns::op.out", b"\0ns\0", b"\0op("]
    for at, needle in itertools.product(range(40), needles):
        data = bytearray(b"x" * 48)
        data[at:at + len(needle)] = needle
        (tmp_path / "lib.so").write_bytes(bytes(data[:48]))
        whole = at + len(needle) <= 48
        assert found_in(tmp_path / "lib.so", needles, chunk=8) == ({needle} if whole else set())


CARRIERS_RSS = """
from pathlib import Path
from loadfuzz import inventory
from loadfuzz.search.repro import carriers, read_message
def kib(field):
    status = Path("/proc/self/status").read_text()
    return int(next(l for l in status.splitlines() if l.startswith(field)).split()[1])
inv = inventory.load_target("torch")  # read cold or from the cache: not what is measured
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
before = kib("VmRSS:")
print(len(carriers(inv, read_message("Re-registering nosuch::op.out"))))
print((kib("VmHWM:") - before) // 1024)
"""


def test_looking_for_an_operator_s_carriers_never_holds_a_whole_library_in_memory():
    # libtorch_cpu.so is 430 MB: reading each file whole made a repro on torch that big
    done = subprocess.run([str(LOADFUZZ.with_name("python")), "-c", CARRIERS_RSS],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    count, grown_mb = map(int, done.stdout.split())
    assert count == 0 and grown_mb < 100, grown_mb  # the peak grew 8 MB here, 422 MB before


def test_an_operator_no_library_carries_exits_1_and_says_so(tmp_path):
    done = loadfuzz("repro", "Re-registering nosuch::op.out", "executorch",
                    "--out", tmp_path / "out")
    assert done.returncode == 1
    assert "no library of executorch carries nosuch::op.out" in done.stdout


@pytest.mark.parametrize("order", ["options last", "target last"])
def test_a_message_and_a_log_together_is_bad_usage(tmp_path, order):
    log = tmp_path / "crash.log"
    log.write_text(ET_LINE)
    words = (["x", "executorch", "--log", log] if order == "options last"
             else ["x", "--log", log, "executorch"])  # was "unrecognized arguments: executorch"
    done = loadfuzz("repro", *words, "--out", tmp_path / "out")
    assert done.returncode == 2 and "either a MESSAGE or --log" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_a_mistyped_target_path_beside_a_log_is_said_to_be_missing_not_a_message(tmp_path):
    log = tmp_path / "crash.log"
    log.write_text(ET_LINE)
    done = loadfuzz("repro", "--log", log, tmp_path / "no-such-corpus", FIXTURES / "corpus",
                    "--out", tmp_path / "out")
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"loadfuzz: no such file or directory: {tmp_path / 'no-such-corpus'}\n"
    assert not (tmp_path / "out").exists()


def test_the_order_kept_is_the_first_that_reproduces_on_one_core_or_on_several(tmp_path):
    """Orders run `--jobs` at once; what is kept is what one by one would have kept."""
    results = {}
    for jobs in ("1", "3"):
        out = tmp_path / f"jobs-{jobs}"
        done = loadfuzz("repro", "Re-registering cz::triple_op.out", FIXTURES / "corpus",
                        "--jobs", jobs, "--out", out, "--json")
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        results[jobs] = (result["tried"], [(s["lib"], s["flags"]) for s in result["record"]["sequence"]],
                         result["record"]["outcome"], (out / "repro.sh").read_text())
    assert results["1"] == results["3"]
    assert results["1"][0] > 100  # many orders ran before the one that reproduces


def test_orders_run_at_once_come_back_in_their_order():
    """The first order takes a second (a step that spins until its time limit); the ones
    after it end at once, but come back after it."""
    spin = step(hostile("spin"))
    work = [(spin,), *itertools.islice(itertools.permutations(QUICK, 2), 20)]
    with Trials(Limits(timeout_s=1)) as trials:
        run = RunOnce(trials, [], Quiet())  # type: ignore[arg-type]
        records = list(run.in_order(work, jobs=3))
    assert (records[0].sequence, records[0].outcome) == ((spin,), Outcome.TIMEOUT)
    assert [r.sequence for r in records] == work


def test_a_search_that_stops_at_a_record_starts_no_other_trial():
    """Orders handed out but not started when the caller stops never run; the one running
    then finishes and is kept."""
    work = list(itertools.islice(itertools.permutations(QUICK, 2), 20))
    written = []
    with Trials(Limits(timeout_s=1)) as trials:
        run = RunOnce(trials, written, Quiet())  # type: ignore[arg-type]
        records = run.in_order(work, jobs=1)
        assert next(records).sequence == work[0]
        records.close()
    assert [r.sequence for r in written] in (work[:1], work[:2])


def test_a_stopped_repro_leaves_whole_records_and_a_summary_that_says_it_is_incomplete(tmp_path):
    out = tmp_path / "out"
    stopped = subprocess.Popen([str(LOADFUZZ), "repro", "Re-registering quantized_decomposed::add.out",
                                "executorch", "--out", str(out)],  # 312 orders, none reproduces
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and stopped.poll() is None and not (
            (out / "trials.jsonl").exists()
            and (out / "trials.jsonl").read_bytes().count(b"\n") >= 5):
        time.sleep(0.05)
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(timeout=60) == 128 + signal.SIGTERM
    stderr = stopped.stderr.read()
    assert stderr == (f"stopped by SIGTERM: the finished trials are in {out / 'trials.jsonl'}, "
                      f"a partial summary in {out / 'summary.json'}\n")
    summary = json.loads((out / "summary.json").read_text())
    lines = (out / "trials.jsonl").read_text().splitlines()
    assert summary["incomplete"] is True and summary["reproduced"] is False
    assert summary["tried"] <= len(lines) == len(list(map(json.loads, lines)))  # whole lines


QUICK = [step(hostile(name), flags) for name in ("clean", "segv", "exit7", "exit0")
         for flags in (Flags.GLOBAL, Flags.LOCAL)]


# --- a message is looked for in all that a trial printed ------------------------------------

ABORTS_AFTER_SAYING = """#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void fail(void) {
    fputs(%s, stderr);
    fflush(stderr);
    %s;
}
"""
THROWS_IN_A_STATIC_INITIALIZER = """#include <stdexcept>
static int registered = [] {
    throw std::runtime_error("duplicate handler registered: 'fast_path'");
    return 0;
}();
"""
LLVM = "LLVM ERROR: inconsistent widget pass registration\\nStack dump:\\n0.\\tProgram arguments: app\\n"
PROTOBUF = ("[libprotobuf FATAL google/protobuf/descriptor.cc:1373] CHECK failed: "
            "GeneratedDatabase()->Add(encoded_file_descriptor, size): \\n"
            "*** Check failure stack trace: ***\\n")
SAID = {
    "terminate": ("terminate called after throwing an instance of 'std::runtime_error' "
                  "what(): duplicate handler registered: 'fast_path'", None),
    "llvm": ("LLVM ERROR: inconsistent widget pass registration", (LLVM, "abort()")),
    "protobuf": ("[libprotobuf FATAL google/protobuf/descriptor.cc:1373] CHECK failed: "
                 "GeneratedDatabase()->Add(encoded_file_descriptor, size):", (PROTOBUF, "abort()")),
    "exit": ("fatal: widget table corrupt, giving up",
             ("fatal: widget table corrupt, giving up\\nbye\\n", "exit(3)")),
}


def library_saying(folder, name):
    """A target folder with one library that prints and then aborts (or exits)."""
    folder.mkdir()
    said = SAID[name][1]
    if said is None:
        return build(folder, name, THROWS_IN_A_STATIC_INITIALIZER, cxx=True)
    return build(folder, name, ABORTS_AFTER_SAYING % (f'"{said[0]}"', said[1]))


@pytest.mark.parametrize("name", sorted(SAID))
def test_a_message_line_the_trial_printed_before_its_last_line_is_reproduced(name, tmp_path):
    """The trial's one-line detail holds only its last line (or, for an exit, none): the
    message is looked for in all it printed. gcc's two lines, pasted as one, are found too."""
    library_saying(tmp_path / "libs", name)
    message = SAID[name][0]
    done = loadfuzz("repro", message, tmp_path / "libs", "--out", tmp_path / "out", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["reproduced"] and result["signature"] is None
    assert [s["lib"] for s in result["record"]["sequence"]] == [f"lib{name}.so"]
    assert result["record"]["outcome"] == ("exit" if name == "exit" else "abort")
    assert message not in result["record"]["detail"]  # found where the detail does not say it


TORCH_LIBRARY_LIKE = """#include <stdio.h>
#include <stdlib.h>
/* as TORCH_LIBRARY(fxtorchns, m) { m.def("widen(Tensor x) -> Tensor"); } keeps them: the
 * namespace and the schema are two strings, and no byte of the file spells fxtorchns::widen */
static const char *volatile ns = "fxtorchns", *volatile schema = "widen(Tensor x) -> Tensor";
__attribute__((constructor)) static void registers(void) {
    if (getenv("FX_TORCH_OP_DEFINED")) {
        fprintf(stderr, "terminate called after throwing an instance of 'c10::Error'\\n"
                "  what():  Tried to register an operator (%s::%s) with the same name and "
                "overload name multiple times.\\n", ns, schema);
        abort();
    }
    setenv("FX_TORCH_OP_DEFINED", "1", 1);
}
"""


def test_a_torch_operator_whose_namespace_and_schema_are_two_strings_is_looked_for(tmp_path):
    """The usual custom operator: no library holds `ns::name` in one piece, so repro once
    said at once that no library of the target carries it."""
    libs = tmp_path / "libs"
    libs.mkdir()
    first = build(libs, "fxop_a", TORCH_LIBRARY_LIKE)
    assert b"fxtorchns::widen" not in first.read_bytes()
    (libs / "libfxop_b.so").write_bytes(first.read_bytes())
    done = loadfuzz("repro", "what():  Tried to register an operator (fxtorchns::widen(Tensor x)"
                    " -> Tensor) with the same name and overload name multiple times.", libs,
                    "--out", tmp_path / "out", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert (result["signature"], result["op"]) == ("torch-duplicate-op", "fxtorchns::widen")
    assert [s["lib"] for s in result["record"]["sequence"]] in (
        ["libfxop_a.so", "libfxop_b.so"], ["libfxop_b.so", "libfxop_a.so"])


SAYS_ONE_THING_OR_ANOTHER = """#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void fail(void) {
    fputs(getenv("FX_FIRST_LOADED") ? "fatal: widget clash\\n" : "fatal: no widget\\n", stderr);
    abort();
}
"""


def test_the_order_repro_prints_still_says_the_message_once_shrunk(tmp_path):
    """`first -> second` says the message; `second` alone aborts too, but saying another
    line: the shrunk order keeps what was asked for, not only the outcome."""
    libs = tmp_path / "libs"
    libs.mkdir()
    build(libs, "a_first", '#include <stdlib.h>\n__attribute__((constructor)) static void f(void)'
                           ' { setenv("FX_FIRST_LOADED", "1", 1); }\n')
    build(libs, "b_second", SAYS_ONE_THING_OR_ANOTHER)
    done = loadfuzz("repro", "fatal: widget clash", libs, "--out", tmp_path / "out", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(done.stdout)["record"]
    assert [s["lib"] for s in record["sequence"]] == ["liba_first.so", "libb_second.so"]
    again = subprocess.run(record["repro"], shell=True, capture_output=True, text=True)
    assert "fatal: widget clash" in again.stdout + again.stderr


def test_a_line_the_trial_did_not_print_is_not_reproduced(tmp_path):
    library_saying(tmp_path / "libs", "terminate")
    done = loadfuzz("repro", "terminate called after throwing an instance of 'std::runtime_error' "
                    "what(): duplicate handler registered: 'slow_path'", tmp_path / "libs",
                    "--out", tmp_path / "out", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    assert json.loads(done.stdout)["tried"] == 3  # the one library, under each flags mode


def aborting_after(folder, said):
    folder.mkdir()
    return build(folder, "says", ABORTS_AFTER_SAYING % (f'"{said}"', "abort()"))


def refused(done, says, out):
    """Bad input, as the contract has it: exit 2, one line on stderr saying `says`, nothing on
    stdout, no results folder."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert says in done.stderr
    assert not out.exists()


def repro_with_stdin(text, *args):
    return subprocess.run([str(LOADFUZZ), "repro", *map(str, args)], input=text,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("dash", [["-"], ["--log", "-"]])
def test_a_dash_reads_the_message_from_stdin_and_is_never_a_message_itself(dash, tmp_path):
    """`-` once reproduced any trial whose detail held a dash, exit 0."""
    aborting_after(tmp_path / "libs", "fatal: widget table corrupt\\n-- giving up --\\n")
    done = repro_with_stdin("I 00:00:00.1 loading\nfatal: widget table corrupt\n", *dash,
                            tmp_path / "libs", "--out", tmp_path / "found", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["message"] == "fatal: widget table corrupt"
    done = repro_with_stdin("fatal: gadget table corrupt\n", *dash, tmp_path / "libs",
                            "--out", tmp_path / "not-found", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    assert json.loads(done.stdout)["reproduced"] is False


@pytest.mark.parametrize("message", ["..", "a-b", "[ ] ::", "2026-12-05T04:12:00Z ->", "'-'"])
def test_a_message_with_no_word_of_three_letters_or_digits_is_bad_input(message, tmp_path):
    aborting_after(tmp_path / "libs", "fatal: widget table corrupt\\n-- a-b .. :: -> --\\n")
    done = loadfuzz("repro", message, tmp_path / "libs", "--out", tmp_path / "out")
    refused(done, "no word to look for", tmp_path / "out")


WHAT = "what(): duplicate handler registered: 'fast_path'"


@pytest.mark.parametrize("prefix", ["2026-12-05 04:12:02,124 - app - ERROR - ",
                                    "Dec  5 04:12:02 host app[4242]: ",
                                    "2026-12-05T04:12:02.123456+00:00 host app[4242]: ",
                                    "2026-12-05T04:12:00.1234567Z 2026-12-05 04:12:02,124 - app - "
                                    "CRITICAL - "])
def test_a_line_from_python_logging_or_syslog_is_read_without_the_logger_prefix(prefix, tmp_path):
    assert read_message(f"{prefix}{WHAT}").text == WHAT
    library_saying(tmp_path / "libs", "terminate")
    done = loadfuzz("repro", f"{prefix}{WHAT}", tmp_path / "libs", "--out", tmp_path / "out",
                    "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["reproduced"] is True


def test_a_line_copied_from_pytest_s_failure_is_read_without_its_e_mark(tmp_path):
    # "E   what(): ..." was looked for with its mark, which no trial prints: not reproduced
    assert read_message(f"E   {WHAT}").text == WHAT
    log = f"    def test_load():\n>       load()\nE       {WHAT}\n\ntests/test_x.py:3: Error\n"
    assert read_message(log).text == WHAT
    assert read_message("E 00:00:01.634411 executorch:x.cpp:102] fatal: table").needle == (
        "fatal: table")
    library_saying(tmp_path / "libs", "terminate")
    done = loadfuzz("repro", f"E   {WHAT}", tmp_path / "libs", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_message_longer_than_a_file_name_can_be_is_read_as_a_message(tmp_path):
    # it was looked for as a file first: ENAMETOOLONG, exit 3
    message = f"E   RuntimeError: {WHAT} " + "x" * 300
    library_saying(tmp_path / "libs", "terminate")
    done = loadfuzz("repro", message, tmp_path / "libs", "--out", tmp_path / "out")
    assert done.returncode == 1 and "not reproduced" in done.stdout, done.stdout + done.stderr


def test_in_a_python_log_the_line_logged_as_an_error_is_the_message():
    log = ("2026-12-05 04:12:01,000 - app - INFO - loading the handlers\n"
           f"2026-12-05 04:12:02,124 - app - ERROR - {WHAT}\n"
           "2026-12-05 04:12:02,200 - app - INFO - shutting down\n")
    assert read_message(log).text == WHAT


# --- lines as real logs hold them ----------------------------------------------------------


@pytest.mark.parametrize(("line", "needle"), [
    ("what():  invalid shape [1, 3] aborting", "what():  invalid shape [1, 3] aborting"),
    ("E1205 04:12:00.123456 4242 registry.cc:102] fatal: widget table corrupt",
     "fatal: widget table corrupt"),
    ("[2026-12-05 04:12:00] fatal: widget table corrupt", "fatal: widget table corrupt"),
    ("[ERROR] fatal: widget [3] corrupt", "fatal: widget [3] corrupt"),
])
def test_only_a_log_prefix_is_cut_from_a_line_never_a_bracket_inside_the_message(line, needle):
    # `] ` anywhere once cut the line: "invalid shape [1, 3] aborting" was looked for as
    # "aborting", and a library that printed any "aborting" reproduced it
    assert read_message(line).needle == needle


def test_a_quoted_undefined_symbol_line_names_the_symbol_without_the_quote():
    message = read_message("UserWarning: Failed to load image Python extension: "
                           "'/x/image.so: undefined symbol: _ZN3c1017RegisterOperatorsD1Ev'If "
                           "you don't plan on using image functionality, you can ignore this.")
    assert (message.signature, message.op) == ("undefined-symbol",
                                               "_ZN3c1017RegisterOperatorsD1Ev")


def test_a_symbol_lookup_error_line_is_read_as_such_not_as_an_undefined_symbol():
    message = read_message("python: symbol lookup error: /x/libinner.so: undefined symbol: fx_x")
    assert (message.signature, message.op) == ("symbol-lookup-error", "fx_x")


def test_a_test_runner_s_count_of_errors_is_no_abort_line():
    message = read_message("collected 12 items; 0 errors\nloading plugins\n"
                           "terminate called after throwing an instance of 'std::logic_error'\n")
    assert message.needle.startswith("terminate called")
    assert read_message("RuntimeError: widget table corrupt\n").needle.startswith("RuntimeError")


def test_a_static_tls_line_from_another_machine_names_its_library_by_file_name(tmp_path):
    # the op is a path: it was looked for as bytes in every library, found in none, and the
    # line was "not reproduced" at once, even loadfuzz's own
    line = "/home/someone/venv/lib/libfx_static_tls_b.so: cannot allocate memory in static TLS block"
    done = loadfuzz("repro", line, FIXTURES / "signatures", "--out", tmp_path / "out", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["signature"] == "glibc-static-tls" and result["candidates"][0] == (
        "libfx_static_tls_b.so")
    assert [s["lib"] for s in result["record"]["sequence"]] == ["libfx_static_tls_a.so",
                                                               "libfx_static_tls_b.so"]


def test_a_log_saved_with_a_byte_order_mark_is_read_without_its_first_time_stamp(tmp_path):
    aborting_after(tmp_path / "libs", "fatal: widget table corrupt\\n")
    log = tmp_path / "crash.log"
    log.write_bytes(b"\xef\xbb\xbf2026-12-05T04:12:00.1234567Z fatal: widget table corrupt\r\n")
    done = loadfuzz("repro", "--log", log, tmp_path / "libs", "--out", tmp_path / "out", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["message"] == "fatal: widget table corrupt"


def test_a_message_the_terminal_cannot_show_is_escaped_once_reproduced_never_exit_3(tmp_path):
    aborting_after(tmp_path / "libs", "fatal: widget table corrupt \\u2713\\n")
    done = subprocess.run([str(LOADFUZZ), "repro", "fatal: widget table corrupt \u2713",
                           tmp_path / "libs", "--out", tmp_path / "out"], capture_output=True,
                          env={**__import__("os").environ, "PYTHONIOENCODING": "ascii"},
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert b"corrupt \\u2713" in done.stdout


def test_a_log_file_given_as_the_message_is_bad_input_that_says_to_use_log(tmp_path):
    log = tmp_path / "crash.log"
    log.write_text(ET_LINE)
    done = loadfuzz("repro", log, "executorch", "--out", tmp_path / "out")
    assert done.returncode == 2 and f"give --log {log}" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


# --- lines a log or a person changed on the way -------------------------------------------


def test_a_lowered_line_is_read_as_the_signature_it_lowers_and_its_operator_as_registered(tmp_path):
    """A log that lowered the line once made it an unknown line: 2000 orders, then "not
    reproduced" (the operator's own case lost, no library's bytes held it)."""
    line = "re-registering quantized_decomposed::dequantize_per_tensor.tensor_out"
    message = read_message(f"E 00:00:01.6 executorch:operator_registry.cpp:102] {line}")
    assert (message.signature, message.any_case) == ("executorch-reregister", True)
    done = loadfuzz("repro", line, "executorch", "--add", LEGACY_PLUGIN, "--out",
                    tmp_path / "out", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["op"] == "quantized_decomposed::dequantize_per_tensor.Tensor_out"
    assert "extra/libquantized_ops_legacy_plugin.so" in result["candidates"]
    assert result["record"]["signature"] == "executorch-reregister" and result["tried"] < 50


def test_an_unknown_line_is_found_in_what_the_trial_printed_whatever_its_case(tmp_path):
    aborting_after(tmp_path / "libs", "Fatal: Widget Table Corrupt\\n")
    done = loadfuzz("repro", "FATAL: widget table corrupt", tmp_path / "libs",
                    "--out", tmp_path / "out", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["reproduced"] is True


@pytest.mark.parametrize("command", [
    "/home/me/.venv/bin/loadfuzz run --cold --timeout 10 global:/x/liba.so local:/x/libb.so",
    "exec /home/me/.venv/bin/loadfuzz run --cold --timeout 10 global:/x/liba.so",
    "'/home/me/my env/bin/loadfuzz' run --cold --timeout 10 global:/x/liba.so",
    "/usr/bin/python3.11 -m loadfuzz run --cold --timeout 10 python:/x/liba.so",
])
def test_a_pasted_repro_command_is_bad_input_that_says_to_run_it(command, tmp_path):
    """A record's repro command, pasted as the message, once ran 2000 orders looking for its
    text in what trials printed, then said "not reproduced"."""
    aborting_after(tmp_path / "libs", "fatal: widget table corrupt\\n")
    done = loadfuzz("repro", command, tmp_path / "libs", "--out", tmp_path / "out")
    refused(done, "run that command itself", tmp_path / "out")
    assert read_message(f"loading\n{command}\nfatal: widget table corrupt\n").needle == (
        "fatal: widget table corrupt")  # in a log, among other lines: the abort line counts


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_a_binary_file_given_as_the_log_is_bad_input(how, tmp_path):
    """An executable given as --log was read as a message: its bytes printed to the terminal,
    2000 orders tried, then "not reproduced"."""
    aborting_after(tmp_path / "libs", "fatal: widget table corrupt\\n")
    binary = Path("/bin/ls").read_bytes()[:3000]
    if how == "file":
        (tmp_path / "ls.log").write_bytes(binary)
        done = loadfuzz("repro", "--log", tmp_path / "ls.log", tmp_path / "libs",
                        "--out", tmp_path / "out")
    else:
        done = subprocess.run([str(LOADFUZZ), "repro", "--log", "-", str(tmp_path / "libs"),
                               "--out", str(tmp_path / "out")], input=binary,
                              capture_output=True, timeout=600)
        done.stdout, done.stderr = done.stdout.decode(), done.stderr.decode()
    refused(done, "no text log (it holds NUL bytes)", tmp_path / "out")


def test_a_line_cut_short_finds_its_collision_but_no_operator_it_does_not_name(tmp_path):
    """`add.ou` is in the bytes of `add.out`: the collision is found, but the output once said
    the copies "also both carry" an operator that does not exist."""
    done = loadfuzz("repro", "Re-registering quantized_decomposed::add.ou", "executorch",
                    "--add", LEGACY_PLUGIN, "--out", tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the registry stopped at quantized_decomposed::add.out, the first duplicate it met\n" \
        in done.stdout
    assert "also both carry" not in done.stdout


@pytest.mark.parametrize("blob", ["x" * 400_000, "a/" * 200_000, "\n" * 400_000])
def test_a_log_with_one_huge_line_is_read_in_one_pass_and_shown_cut_short(blob, tmp_path):
    """A log holding a base64 blob or a long run of one character: every catalogue pattern
    reads it in time linear in its length (one that backtracked over each start took hours on
    a 2 MB line), a path-like op before `: cannot open` is still found whole, and the result
    shows the first 300 characters of a long message."""
    probe = ("import sys; from loadfuzz.search.repro import read_message, shown\n"
             "blob = open(sys.argv[1]).read()\n"
             "m = read_message('Segmentation fault\\n' + blob)\n"
             "n = read_message(blob + ' /opt/libz.so: cannot open shared object file')\n"
             "print(m.signal, n.signature, n.op, len(shown(blob)))\n")
    log = tmp_path / "blob.log"
    log.write_text(blob)
    done = subprocess.run([str(LOADFUZZ.parent / "python"), "-c", probe, str(log)],
                          capture_output=True, text=True, timeout=120)  # a hang guard only
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(int(signal.SIGSEGV)), "missing-library", "/opt/libz.so",
                                   "301"]
