"""`repro` turns one line of a crash log into the smallest load order that reproduces it."""

import json

import pytest

from loadfuzz.search.repro import read_message
from support import FIXTURES, LEGACY_PLUGIN, loadfuzz

ET_LINE = ("E 00:00:01.634411 executorch:operator_registry.cpp:102] Re-registering "
           "quantized_decomposed::add.out, from NOT_SUPPORTED")
TORCH_TEXT = ("RuntimeError: Tried to register an operator (quantized_decomposed::add.out(Tensor a, "
              "Tensor(a!) out) -> Tensor(a!)) with the same name and overload name multiple times.")


@pytest.mark.parametrize("text", [ET_LINE, "Re-registering quantized_decomposed::add.out"])
def test_the_executorch_line_is_read_with_or_without_its_log_prefix(text):
    message = read_message(f"some earlier line\n{text}\nAborted (core dumped)\n")
    assert (message.signature, message.op) == ("executorch-reregister",
                                               "quantized_decomposed::add.out")


def test_the_pytorch_duplicate_operator_text_is_read():
    message = read_message(TORCH_TEXT)
    assert (message.signature, message.op) == ("torch-duplicate-op",
                                               "quantized_decomposed::add.out")


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


def test_an_operator_no_library_carries_exits_1_and_says_so(tmp_path):
    done = loadfuzz("repro", "Re-registering nosuch::op.out", "executorch",
                    "--out", tmp_path / "out")
    assert done.returncode == 1
    assert "no library of executorch carries nosuch::op.out" in done.stdout


def test_a_message_and_a_log_together_is_bad_usage(tmp_path):
    log = tmp_path / "crash.log"
    log.write_text(ET_LINE)
    done = loadfuzz("repro", "x", "executorch", "--log", log, "--out", tmp_path / "out")
    assert done.returncode == 2 and "either a MESSAGE or --log" in done.stderr
    assert not (tmp_path / "out").exists()
