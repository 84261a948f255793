"""The expectations file: parsing it, telling a bad one apart, and matching findings."""

from __future__ import annotations

import re
from html import escape
from pathlib import Path

import pytest

from loadfuzz.expect import Expectation, load_expectations, match_expectations
from loadfuzz.model import Flags, Outcome, Step, StepKind, TrialRecord, UsageError

SHIPPED = Path(__file__).resolve().parent.parent / "results" / "expectations" / "executorch.toml"
KQ = "lib/libexecutorch_kernels_quantized.so"
AOT = "kernels/quantized/libquantized_ops_aot_lib.so"
PLUGIN = "extra/libquantized_ops_legacy_plugin.so"
RUNTIME = "lib/libexecutorch.so"


def finding(*libs: str, flags: str | tuple[str, ...] = "global",
            outcome: Outcome = Outcome.REREGISTER,
            op: str | None = "quantized_decomposed::add.out") -> TrialRecord:
    modes = (flags,) * len(libs) if isinstance(flags, str) else flags
    return TrialRecord(
        sequence=tuple(Step(StepKind.DLOPEN, lib, Flags(m)) for lib, m in zip(libs, modes,
                                                                               strict=True)),
        outcome=outcome, step=len(libs) - 1,
        signature="executorch-reregister" if outcome is Outcome.REREGISTER else None,
        op=op if outcome is Outcome.REREGISTER else None, signal=6, exit_code=None,
        detail=f"Re-registering {op}", duration_s=0.02, peak_rss_mb=100.0, repro="loadfuzz run")


def entry(first: str = KQ, second: str = "extra/*plugin*", orders: str = "both",
          flags: tuple[Flags, ...] = (), outcome: Outcome = Outcome.REREGISTER,
          op: str | None = None) -> Expectation:
    return Expectation(first, second, orders, flags, outcome, op, "because", "t.toml:entry 1")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "expect.toml"
    path.write_text(text, encoding="utf-8")
    return path


GOOD = """
[[expected]]
first = "lib/libexecutorch_kernels_quantized.so"
second = "extra/*plugin*"
why = "the plugin carries its own copy"
outcome = "reregister"

[[expected]]
first = "lib/a.so"
second = "lib/b.so"
orders = "as-written"
flags = ["local"]
outcome = "crash"
op = "x::*"
why = \"\"\"a reason
  over two lines\"\"\"
"""


def test_a_file_an_editor_began_with_a_byte_order_mark_reads_as_without_one(tmp_path):
    plain = load_expectations(write(tmp_path, GOOD))
    (tmp_path / "expect.toml").write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    assert load_expectations(tmp_path / "expect.toml") == plain  # was "not valid TOML"


def test_a_good_file_gives_one_expectation_per_entry_with_defaults(tmp_path: Path) -> None:
    first, second = load_expectations(write(tmp_path, GOOD))
    assert first == Expectation(KQ, "extra/*plugin*", "both", (), Outcome.REREGISTER, None,
                                "the plugin carries its own copy", "expect.toml:entry 1")
    assert second.orders == "as-written" and second.flags == (Flags.LOCAL,)
    assert second.outcome is Outcome.CRASH and second.op == "x::*"
    assert second.why == "a reason over two lines"
    assert second.to_json() == {
        "first": "lib/a.so", "second": "lib/b.so", "orders": "as-written", "flags": ["local"],
        "outcome": "crash", "op": "x::*", "why": "a reason over two lines",
        "source": "expect.toml:entry 2"}


def test_an_empty_file_expects_nothing(tmp_path: Path) -> None:
    assert load_expectations(write(tmp_path, "# nothing is expected\n")) == ()


ENTRY = '[[expected]]\nfirst = "a"\nsecond = "b"\noutcome = "reregister"\nwhy = "w"\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('first = "unterminated\n', "not valid TOML: .*line 1"),
        (ENTRY + 'frist = "a"\n', "entry 1: unknown key 'frist'"),
        (ENTRY + ENTRY.replace('why = "w"\n', ""), "entry 2: missing required key 'why'"),
        (ENTRY.replace('first = "a"\n', ""), "entry 1: missing required key 'first'"),
        (ENTRY + 'orders = "reverse"\n', "entry 1: orders 'reverse' is not one of: both, "
                                         "as-written"),
        (ENTRY + 'flags = ["global", "lazy"]\n', "entry 1: unknown flags mode 'lazy'"),
        (ENTRY + 'flags = "global"\n', "entry 1: 'flags' must be a list"),
        # one mode per item, spelled exactly (these passed as global and local, then global)
        (ENTRY + 'flags = ["global,local"]\n', "entry 1: unknown flags mode 'global,local' "
                                               "\\(expected global, local, python, one per"),
        (ENTRY + 'flags = [" global "]\n', "entry 1: unknown flags mode ' global '"),
        (ENTRY.replace('"reregister"', '"segfault"'), "entry 1: outcome 'segfault' is not one "
                                                      "of: reregister, abort, crash"),
        (ENTRY.replace('"reregister"', '"clean"'), "entry 1: outcome 'clean' cannot be"),
        (ENTRY.replace('why = "w"', 'why = ""'), "entry 1: 'why' must be a non-empty string"),
        (ENTRY.replace('second = "b"', "second = 3"), "entry 1: 'second' must be a non-empty"),
        ('[expectations]\nfirst = "a"\n', "unknown top-level key 'expectations'"),
        ('expected = "a"\n', "'expected' must be an array of tables"),
    ],
)
def test_a_bad_file_is_one_clear_line_naming_file_and_entry(tmp_path: Path, text: str,
                                                            message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UsageError, match=f"^{re.escape(str(path))}: {message}") as caught:
        load_expectations(path)
    assert "\n" not in str(caught.value)


def test_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=re.escape("nope.toml: no such expectations file")):
        load_expectations(tmp_path / "nope.toml")


def test_both_orders_match_either_load_order_and_as_written_only_its_own() -> None:
    both, as_written = entry(orders="both"), entry(orders="as-written")
    assert both.matches(finding(KQ, PLUGIN)) and both.matches(finding(PLUGIN, KQ))
    assert as_written.matches(finding(KQ, PLUGIN))
    assert not as_written.matches(finding(PLUGIN, KQ))
    assert not both.matches(finding(KQ, RUNTIME))


def test_flags_limit_the_modes_every_step_must_have() -> None:
    local = entry(flags=(Flags.LOCAL,))
    assert local.matches(finding(KQ, PLUGIN, flags="local"))
    assert not local.matches(finding(KQ, PLUGIN, flags="global"))
    assert not local.matches(finding(KQ, PLUGIN, flags=("local", "global")))
    assert entry(flags=()).matches(finding(KQ, PLUGIN, flags=("local", "global")))


def test_op_is_a_glob_and_the_outcome_must_be_equal() -> None:
    quantized = entry(op="quantized_decomposed::*")
    assert quantized.matches(finding(KQ, PLUGIN, op="quantized_decomposed::add.out"))
    assert not quantized.matches(finding(KQ, PLUGIN, op="aten::add.out"))
    assert not quantized.matches(finding(KQ, PLUGIN, outcome=Outcome.ABORT))
    assert entry(op=None).matches(finding(KQ, PLUGIN, op="aten::add.out"))
    assert not entry(outcome=Outcome.CRASH).matches(finding(KQ, PLUGIN))


def test_a_longer_sequence_matches_through_any_ordered_pair_of_its_steps() -> None:
    as_written = entry(orders="as-written")
    assert as_written.matches(finding(KQ, RUNTIME, PLUGIN))
    assert not as_written.matches(finding(PLUGIN, RUNTIME, KQ))
    assert entry(orders="both").matches(finding(PLUGIN, RUNTIME, KQ))
    assert not entry().matches(finding(PLUGIN))  # one step: no pair


def test_classify_splits_expected_unexpected_and_stale() -> None:
    covered = entry(first=KQ)
    also = entry(first="lib/*quantized*", op="quantized_decomposed::*")  # matches the same
    gone = entry(first=AOT, second=RUNTIME)
    clean = finding(KQ, RUNTIME, outcome=Outcome.CLEAN)
    crash = finding(RUNTIME, PLUGIN, outcome=Outcome.CRASH)
    expected, unexpected, stale = match_expectations(
        [finding(KQ, PLUGIN), clean, crash, finding(PLUGIN, KQ, flags="local")],
        [covered, also, gone])
    assert [(r.sequence[0].lib, e) for r, e in expected] == [(KQ, covered), (PLUGIN, covered)]
    assert unexpected == [crash]
    assert stale == [gone]


def test_the_shipped_expectations_cover_the_seed_collision_and_nothing_else() -> None:
    shipped = load_expectations(SHIPPED)
    assert len(shipped) == 2
    for expectation in shipped:
        assert expectation.why.endswith(".") and len(expectation.why.split()) > 12
    collisions = [finding(a, b, flags=m) for m in ("global", "local")
                  for a, b in ((KQ, PLUGIN), (PLUGIN, KQ), (AOT, PLUGIN), (PLUGIN, AOT))]
    others = [finding(RUNTIME, PLUGIN), finding(KQ, AOT), finding(KQ, PLUGIN, op="aten::add"),
              finding(KQ, PLUGIN, outcome=Outcome.CRASH)]
    expected, unexpected, stale = match_expectations(collisions + others, shipped)
    assert [r for r, _ in expected] == collisions
    assert {e.source for _, e in expected} == {"executorch.toml:entry 1",
                                              "executorch.toml:entry 2"}
    assert unexpected == others and stale == []


def test_the_text_output_shows_a_stale_entry_of_one_order_as_an_arrow(capsys) -> None:
    from loadfuzz.cli.printing import print_summary

    stale = [{"first": "lib/a.so", "second": "lib/b.so", "orders": "as-written", "source": "e:3"},
             {"first": "lib/c.so", "second": "lib/d.so", "orders": "both", "source": "e:9"}]
    print_summary({"command": "matrix", "target": "t", "trials": 4, "findings": [],
                   "unexpected": [], "stale": stale, "out": "/r",
                   "libraries": ["lib/a.so", "lib/b.so", "lib/c.so", "lib/d.so"]})
    lines = capsys.readouterr().out.splitlines()
    assert "  stale expectation: lib/a.so -> lib/b.so (e:3)" in lines
    assert "  stale expectation: lib/c.so x lib/d.so (e:9)" in lines


def test_a_stale_entry_that_names_no_library_of_the_campaign_says_so_everywhere(tmp_path) -> None:
    """A typo in a library id looked like a collision that went away: stale, and nothing more."""
    import shutil

    from support import hostile, loadfuzz

    libs = tmp_path / "libs"
    libs.mkdir()
    for name in ("clean", "clean_too"):
        shutil.copy(hostile("clean"), libs / f"libfx_{name}.so")
    expect = tmp_path / "expect.toml"
    expect.write_text(
        '[[expected]]\nfirst = "libfx_clean.so"\nsecond = "libfx_claen_too.so"\n'
        'outcome = "abort"\nwhy = "a typo"\n\n'
        '[[expected]]\nfirst = "libfx_clean.so"\nsecond = "libfx_clean_too.so"\n'
        'outcome = "abort"\nwhy = "fixed since"\n')
    done = loadfuzz("matrix", libs, "--expect", expect, "--out", tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    note = 'its second = "libfx_claen_too.so" names no library of this campaign'
    lines = [line for line in done.stdout.splitlines() if line.startswith("  stale expectation:")]
    assert len(lines) == 2 and note in lines[0] and "names no library" not in lines[1]
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"a typo (`expect.toml:entry 1`) — **{note}**" in report
    assert report.count("names no library") == 1
    html = (tmp_path / "out" / "matrix.html").read_text()
    assert f"a typo (expect.toml:entry 1) — <strong>{escape(note)}</strong>" in html
    assert html.count("names no library") == 1


def test_an_entry_both_of_whose_globs_fit_nothing_names_both_in_one_sentence() -> None:
    from loadfuzz.expect import names_nothing

    entry = {"first": "lib/a*.so", "second": "extra/b.so"}
    assert names_nothing(entry, ["lib/c.so"]) == (
        'its first = "lib/a*.so" and second = "extra/b.so" name no library of this campaign')
    assert names_nothing(entry, ["lib/a1.so", "extra/b.so"]) == ""
