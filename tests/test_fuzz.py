"""`fuzz` explores load orders with Hypothesis, keeps every distinct failure, shrunk, and
replays what it found from its example database first in the next campaign.

The corpus (build/fixtures/corpus, nine libraries) hides exactly two failures:
`libcz_pair_a.so` and `libcz_pair_b.so` register the same ExecuTorch operator
(a pair, any order, any flags), and `libcz_weak_p.so` and `libcz_weak_q.so`
register into `libcz_registry.so` only when it was loaded `global` before
them (a sequence of three).
"""

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import replace

import hypothesis
import psutil
import pytest

from loadfuzz.campaign import Quiet
from loadfuzz.model import Flags, Outcome, Role, Step, StepKind, Stopped, TrialRecord
from loadfuzz.plan import step_options
from loadfuzz.run.harness import Limits
from loadfuzz.run.trials import Trials
from loadfuzz.search.fuzz import Findings, shrink_until
from loadfuzz.search.once import RunOnce
from loadfuzz.search.shrink import simplify
from loadfuzz.search.workers import Outbox
from support import FIXTURES, LOADFUZZ, alive, loadfuzz

CORPUS = FIXTURES / "corpus"
PAIR = [("dlopen", "libcz_pair_a.so", "local"), ("dlopen", "libcz_pair_b.so", "local")]
TRIPLE = [("dlopen", "libcz_registry.so", "global"), ("dlopen", "libcz_weak_p.so", "local"),
          ("dlopen", "libcz_weak_q.so", "local")]


def spelled(record):
    return [(s["kind"], s["lib"], s["flags"]) for s in record["sequence"]]


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory):
    """A 60 s campaign on the corpus, searching on two processes, then a short one on the same
    database."""
    base = tmp_path_factory.mktemp("fuzz")
    first = loadfuzz("fuzz", CORPUS, "--budget", "60s", "--seed", "7", "--db", base / "db",
                     "--out", base / "first", "--json", "--jobs", "2")
    second = loadfuzz("fuzz", CORPUS, "--budget", "3s", "--seed", "8", "--db", base / "db",
                      "--out", base / "second", "--json")
    return base, first, second


def test_a_campaign_finds_both_hidden_failures_each_shrunk_and_nothing_else(campaigns):
    _, first, _ = campaigns
    assert first.returncode == 1, first.stderr  # findings, no --expect
    summary = json.loads(first.stdout)
    assert sorted(spelled(r) for r in summary["findings"]) == [PAIR, TRIPLE]
    assert {r["op"] for r in summary["findings"]} == {"cz::pair_op.out", "cz::triple_op.out"}
    assert all(r["outcome"] == "reregister" for r in summary["findings"])
    assert summary["throughput"] > 0 and summary["trials"] > 100
    assert all(r["via"] == "fork-server, confirmed cold" for r in summary["findings"])


def test_the_search_runs_on_jobs_processes_and_their_trials_reach_the_one_folder_once(campaigns):
    base, first, _ = campaigns
    summary = json.loads(first.stdout)
    assert summary["jobs"] == 2 and summary["rounds"] >= 2 and summary["recalled"] > 0
    lines = (base / "first" / "trials.jsonl").read_text().splitlines()
    firsts = {json.loads(line)["sequence"][0]["lib"] for line in lines}
    assert len(firsts) == 9  # the slices of both workers: every library starts some sequence
    assert summary["trials"] == len(lines)


def test_the_next_campaign_replays_the_known_findings_first(campaigns):
    _, _, second = campaigns
    summary = json.loads(second.stdout)
    assert sorted(spelled(r) for r in summary["findings"]) == [PAIR, TRIPLE]
    assert {found["phase"] for found in summary["found"]} == {"replay"}


def test_a_fuzz_campaign_writes_the_results_folder_with_one_testcase_per_finding(campaigns):
    base, _, _ = campaigns
    out = base / "first"
    assert {p.name for p in out.iterdir()} >= {"summary.json", "trials.jsonl", "report.md",
                                                "matrix.html", "junit.xml", "repro"}
    assert (out / "junit.xml").read_text().count("<testcase ") == 2
    assert sorted(p.name for p in (out / "repro").iterdir()) == ["001.sh", "002.sh"]
    lines = (out / "trials.jsonl").read_text().splitlines()
    assert len(lines) == len({json.dumps(json.loads(line)["sequence"]) for line in lines})


def test_the_summary_prints_the_throughput(tmp_path):
    done = loadfuzz("fuzz", CORPUS, "--select", "libcz_quiet_*", "--budget", "5s",
                    "--db", tmp_path / "db", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "throughput:" in done.stdout and "trials/s" in done.stdout


def test_by_default_a_campaign_runs_on_the_cores_it_may_use_not_on_every_core_there_is(tmp_path):
    # A CI job pinned to one core (taskset, a container's cpuset) of a bigger machine: as
    # many search processes as the machine has cores would share that one.
    one = min(os.sched_getaffinity(0))
    done = subprocess.run([str(LOADFUZZ), "fuzz", CORPUS, "--select", "libcz_quiet_*",
                           "--budget", "1s", "--db", tmp_path / "db", "--out", tmp_path / "out",
                           "--json"], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: os.sched_setaffinity(0, {one}))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["jobs"] == 1 < (os.cpu_count() or 1)


def test_a_fuzz_campaign_writes_nothing_in_the_working_folder(tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    done = loadfuzz("fuzz", CORPUS, "--select", "libcz_pair_*", "--budget", "3s",
                    "--db", tmp_path / "db", "--out", tmp_path / "out", cwd=here)
    assert done.returncode == 1, done.stderr  # the pair collides
    assert list(here.iterdir()) == []  # not even Hypothesis's own .hypothesis/


def test_a_campaign_whose_budget_ends_before_the_search_starts_says_it_searched_nothing(tmp_path):
    """A nightly job whose budget is shorter than its workers' start-up would pass green
    having tested only the predicted pairs: it is told, on stderr and in the summary."""
    done = loadfuzz("fuzz", CORPUS, "--select", "libcz_quiet_*", "--budget", "0.01",
                    "--db", tmp_path / "db", "--out", tmp_path / "out", "--json")
    assert done.returncode == 0, done.stderr
    [warning] = json.loads(done.stdout)["warnings"]
    assert warning.startswith("the search ran no trial") and "--budget" in warning
    assert f"loadfuzz: warning: {warning}\n" in done.stderr
    assert "the search ran no trial" in (tmp_path / "out" / "report.md").read_text()


def test_a_campaign_over_several_targets_replays_its_findings_after_an_upgrade(tmp_path):
    """The nightly job of an environment: its packages are upgraded, or named in another
    order, and what earlier nights found still replays first (ids match without versions)."""
    wheels = []
    for version in ("1.0", "1.1"):
        wheels.append(tmp_path / f"fxpair-{version}-py3-none-any.whl")
        with zipfile.ZipFile(wheels[-1], "w") as archive:
            for name in ("libcz_pair_a.so", "libcz_pair_b.so", "libcz_registry.so"):
                archive.write(CORPUS / name, f"fxpair/{name}")
            archive.writestr(f"fxpair-{version}.dist-info/METADATA",
                             f"Name: fxpair\nVersion: {version}\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "libcz_solo.so").write_bytes((CORPUS / "libcz_solo.so").read_bytes())
    db = tmp_path / "db"
    first = loadfuzz("fuzz", wheels[0], other, "--flags", "local", "--budget", "3s",
                     "--db", db, "--out", tmp_path / "night-1", "--json")
    [finding] = json.loads(first.stdout)["findings"]
    assert finding["op"] == "cz::pair_op.out", first.stderr
    second = loadfuzz("fuzz", other, wheels[1], "--flags", "local", "--budget", "0.01",
                      "--db", db, "--out", tmp_path / "night-2", "--json")
    summary = json.loads(second.stdout)
    assert [f["op"] for f in summary["findings"]] == ["cz::pair_op.out"], second.stderr
    [found] = summary["found"]
    assert found["phase"] == "replay"
    assert [s["lib"] for s in found["sequence"]] == [
        s["lib"].replace("fxpair-1.0/", "fxpair-1.1/") for s in finding["sequence"]]
    # The database now holds the finding under both releases' ids, which name one sequence:
    # the next night runs it once (merge refuses a shard whose lines outnumber its trials).
    third = loadfuzz("fuzz", other, wheels[1], "--flags", "local", "--budget", "0.01",
                     "--db", db, "--out", tmp_path / "night-3", "--json")
    lines = (tmp_path / "night-3" / "trials.jsonl").read_text().splitlines()
    sequences = [json.dumps(json.loads(line)["sequence"], sort_keys=True) for line in lines]
    assert len(sequences) == len(set(sequences)) == json.loads(third.stdout)["trials"]


def test_findings_the_database_cannot_keep_are_said_lost(tmp_path):
    """A --db whose entry for the target is taken (a file where Hypothesis makes a folder)
    loses what is saved there: the campaign says so, since the next night will not replay."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    from loadfuzz import inventory
    from loadfuzz.search.fuzz import database_key

    db = tmp_path / "db"
    key = database_key(inventory.load_target(str(CORPUS)))
    db.mkdir()
    DirectoryBasedExampleDatabase(db)._key_path(key).write_text("in the way\n")
    done = loadfuzz("fuzz", CORPUS, "--select", "libcz_pair_*", "--budget", "2s",
                    "--db", db, "--out", tmp_path / "out", "--json")
    summary = json.loads(done.stdout)
    assert summary["findings"], done.stderr
    assert any(w.startswith(f"--db {db}: could not save") for w in summary["warnings"])
    assert "could not save" in done.stderr


def test_a_known_finding_replays_only_in_a_flags_mode_the_campaign_takes(tmp_path):
    db = tmp_path / "db"
    night = loadfuzz("fuzz", CORPUS, "--select", "libcz_pair_*", "--flags", "local",
                     "--budget", "3s", "--db", db, "--out", tmp_path / "local", "--json")
    assert json.loads(night.stdout)["findings"], night.stderr  # kept, under local
    loadfuzz("fuzz", CORPUS, "--select", "libcz_pair_*", "--flags", "global", "--budget", "3s",
             "--db", db, "--out", tmp_path / "global")
    records = [json.loads(line) for line in (tmp_path / "global" / "trials.jsonl").open()]
    assert records and {s["flags"] for r in records for s in r["sequence"]} == {"global"}


# --- shrinking, on a made-up world where A then B fails -------------------------------


def fake_options():
    return [Step(StepKind.DLOPEN, name, mode) for name in "ABC" for mode in (Flags.LOCAL,
                                                                           Flags.GLOBAL)]


def fake_run(seq):
    names = [s.lib for s in seq]
    fails = "A" in names and "B" in names[names.index("A"):]
    step = names.index("B", names.index("A")) if fails else None
    return TrialRecord(seq, Outcome.REREGISTER if fails else Outcome.CLEAN, step,
                       "executorch-reregister" if fails else None, "x::y.out" if fails else None,
                       6 if fails else None, None, "", 0.0, 0.0, "")


def test_simplify_leads_to_the_fewest_steps_each_loaded_local_when_that_still_fails():
    options = fake_options()
    by = {(o.lib, o.flags): o for o in options}
    seq = (by["C", Flags.GLOBAL], by["A", Flags.GLOBAL], by["C", Flags.LOCAL],
           by["B", Flags.GLOBAL], by["C", Flags.GLOBAL])
    minimal = simplify(fake_run(seq), fake_run, options)
    assert [(s.lib, s.flags) for s in minimal.sequence] == [("A", Flags.LOCAL),
                                                            ("B", Flags.LOCAL)]


def test_a_failure_both_orders_have_ends_as_one_record_whichever_order_was_found_first():
    # a nightly job found the plugin-first order one night and the other order the next:
    # its junit test case changed name though nothing had changed
    options = fake_options()
    by = {(o.lib, o.flags): o for o in options}

    def either_order(seq):  # A and B in one process fail, whichever comes first
        names = [s.lib for s in seq]
        fails = {"A", "B"} <= set(names)
        step = max(names.index("A"), names.index("B")) if fails else None
        return replace(fake_run(seq), outcome=Outcome.REREGISTER if fails else Outcome.CLEAN,
                       step=step, signature="executorch-reregister" if fails else None,
                       op="x::y.out" if fails else None)

    for found in ((by["B", Flags.GLOBAL], by["A", Flags.GLOBAL]),
                  (by["A", Flags.GLOBAL], by["C", Flags.LOCAL], by["B", Flags.LOCAL])):
        minimal = simplify(either_order(found), either_order, options)
        assert [(s.lib, s.flags) for s in minimal.sequence] == [("A", Flags.LOCAL),
                                                                ("B", Flags.LOCAL)]
    # where only one order fails, the swap is tried and not taken
    minimal = simplify(fake_run((by["A", Flags.GLOBAL], by["B", Flags.GLOBAL])), fake_run, options)
    assert [s.lib for s in minimal.sequence] == ["A", "B"]


class Memory:
    """RunOnce's part that simplifying sees, over the made-up world: each sequence run once."""

    def __init__(self):
        self.ran: dict = {}

    def knows(self, seq):
        return tuple(seq) in self.ran

    def __call__(self, seq):
        return self.ran.setdefault(tuple(seq), fake_run(seq))


def test_a_failure_found_as_the_budget_ends_is_still_made_minimal():
    """A failure from the last round (the budget ended a second ago) is simplified like one
    found early: one defect is one finding. Past the grace, only what ran is tried."""
    options = fake_options()
    by = {(o.lib, o.flags): o for o in options}
    late = fake_run((by["C", Flags.GLOBAL], by["A", Flags.GLOBAL], by["B", Flags.GLOBAL]))
    ended = time.monotonic() - 1
    for until, kept in ((shrink_until(ended, 4.0), [("A", Flags.LOCAL), ("B", Flags.LOCAL)]),
                        (ended, [("C", Flags.GLOBAL), ("A", Flags.GLOBAL), ("B", Flags.GLOBAL)])):
        findings = Findings(Memory(), options, until)  # type: ignore[arg-type]
        findings.keep(late, "search")
        [found] = findings.found.values()
        assert [(s.lib, s.flags) for s in found.sequence] == kept


def test_python_extensions_can_also_be_imported_and_local_comes_before_global():
    class Lib:
        def __init__(self, id, role):
            self.id, self.role, self.path = id, role, None

    options = step_options([Lib("a.so", Role.RUNTIME), Lib("m.cpython.so", Role.PYTHON_EXTENSION)],
                           (Flags.GLOBAL, Flags.LOCAL))
    assert [o.spelling().split(":")[0] for o in options] == ["local", "global", "local",
                                                             "global", "py"]


# --- stopping ---------------------------------------------------------------------------


def family(pid):
    """The process and every process below it, as they are now."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def command_line(proc) -> str:
    """A process's command line; "" once it has ended (a trial ends at any moment)."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["ctrl-c", "sigterm", "sigkill"])
def test_a_stopped_fuzz_campaign_keeps_whole_records_and_leaves_no_process_behind(tmp_path, how):
    out = tmp_path / "out"
    campaign = subprocess.Popen([str(LOADFUZZ), "fuzz", str(CORPUS), "--budget", "5m", "--jobs",
                                 "2", "--db", str(tmp_path / "db"), "--out", str(out)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and campaign.poll() is None and not (
                (out / "trials.jsonl").exists()
                and (out / "trials.jsonl").read_bytes().count(b"\n") >= 300):
            time.sleep(0.05)
        everyone = family(campaign.pid)
        workers = [p for p in everyone if "loadfuzz.search.workers" in command_line(p)]
        assert len(workers) == 2 and len(everyone) > 3  # the workers and their fork servers
        campaign.send_signal(how)
        status = campaign.wait(timeout=60)
        stderr = campaign.stderr.read()
        assert status == (-how if how == signal.SIGKILL else 128 + how), stderr
        if how != signal.SIGKILL:
            assert f"stopped by {how.name}" in stderr and "Traceback" not in stderr, stderr
            summary = json.loads((out / "summary.json").read_text())
            assert summary["incomplete"] is True and summary["trials"] >= 300
            # what the search did so far, though no worker ended to report it
            assert summary["jobs"] == 2 and summary["search_s"] > 0 and summary["rounds"] >= 1
            # what it found so far is kept for the next campaign to replay (and confirm)
            assert summary["findings"] and len(summary["found"]) == len(summary["findings"])
            assert [p for p in (tmp_path / "db").rglob("*") if p.is_file()]
        lines = (out / "trials.jsonl").read_bytes().splitlines()
        for line in lines[:-1] if how == signal.SIGKILL else lines:
            json.loads(line)  # whole records (a SIGKILL may tear the last one)
        deadline = time.monotonic() + 20
        while alive(everyone) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive(everyone) == []
    finally:  # a failed check must not leave a 5-minute campaign running
        with contextlib.suppress(psutil.Error):
            for proc in alive(family(campaign.pid)) if campaign.poll() is None else []:
                proc.kill()
        campaign.wait(timeout=30)


def test_a_sigterm_that_lands_where_python_cannot_raise_stops_the_worker_at_its_next_trial_quietly():
    """Hypothesis runs gc callbacks; a SIGTERM arriving in one (or in a `__del__`) raises a
    SystemExit that Python drops. The worker prints nothing of it and stops at its next trial."""
    program = """
import os, signal, sys
from loadfuzz.model import Stopped
from loadfuzz.search.workers import Outbox, stop_on_sigterm
stopping = stop_on_sigterm()
class Dropped:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs here, and its SystemExit is dropped
            pass
Dropped()
print("went on", stopping.is_set(), flush=True)
try:
    Outbox(1, os.getppid(), stopping).append(None)
    print("not reached")
except Stopped:
    sys.exit(0)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "went on True\n", "")


def test_a_worker_stopped_inside_a_hypothesis_example_stops_without_a_failure_to_report():
    """A stopped worker's next trial raises Stopped, inside Hypothesis's test function:
    Hypothesis must let it through at once, not take it for a failure of the example,
    replay it and report an exception group (as it does with SystemExit)."""
    stopping = threading.Event()
    outbox = Outbox(-1, os.getppid(), stopping)
    examples = []

    @hypothesis.settings(max_examples=50, database=None, deadline=None)
    @hypothesis.given(hypothesis.strategies.integers())
    def explore(number):
        examples.append(number)
        if len(examples) == 3:
            stopping.set()  # as the SIGTERM handler does
        if stopping.is_set():
            outbox.append(None)

    with pytest.raises(Stopped):
        explore()
    assert len(examples) == 3  # no replay, no shrinking


def test_a_sequence_that_repeats_an_earlier_trial_up_to_its_failed_step_is_answered_without_running():
    """A trial ends at the step that failed, so the steps after it would never run: the search
    gets the earlier trial's verdict, and nothing runs or is written. A clean trial tells
    nothing about a longer sequence: that one runs."""
    a, b, registry = (Step(StepKind.DLOPEN, name, Flags.LOCAL, CORPUS / name)
                      for name in ("libcz_pair_a.so", "libcz_pair_b.so", "libcz_registry.so"))
    written: list[TrialRecord] = []
    with Trials(Limits()) as trials:
        run = RunOnce(trials, written, Quiet())  # type: ignore[arg-type]
        failed = run((a, b))
        longer = run((a, b, registry))
        clean = run((a,))
        after_clean = run((a, registry))
    assert (failed.outcome, failed.step, failed.op) == (Outcome.REREGISTER, 1, "cz::pair_op.out")
    assert longer.sequence == (a, b, registry)
    assert (longer.outcome, longer.step, longer.op) == (failed.outcome, 1, failed.op)
    assert clean.clean and after_clean.clean
    assert [r.sequence for r in written] == [(a, b), (a,), (a, registry)]
    assert run.recalled == 1 and run.knows((a, b, b)) and not run.knows((a, a))


def test_the_steps_of_a_failed_trial_up_to_its_failed_one_are_answered_under_their_own_repro():
    """Shrinking first cuts the steps after the failed one: that cut is the trial itself,
    answered from memory (no second run, which for a hang costs a whole --timeout), and its
    record's repro command names the cut, not the longer sequence that ran."""
    a, b, registry = (Step(StepKind.DLOPEN, name, Flags.LOCAL, CORPUS / name)
                      for name in ("libcz_pair_a.so", "libcz_pair_b.so", "libcz_registry.so"))
    written: list[TrialRecord] = []
    with Trials(Limits()) as trials:
        run = RunOnce(trials, written, Quiet())  # type: ignore[arg-type]
        longer = run((a, b, registry))
        cut = run((a, b))
    assert (longer.outcome, longer.step) == (Outcome.REREGISTER, 1)
    assert [r.sequence for r in written] == [(a, b, registry)] and run.recalled == 1
    assert cut.sequence == (a, b) and (cut.outcome, cut.step, cut.op) == (
        longer.outcome, longer.step, longer.op)
    assert cut.repro == trials.repro((a, b)) and "libcz_registry" not in cut.repro


def test_records_from_the_workers_share_their_steps_once_kept():
    """Every record of a campaign is kept to its end, and one that came over a pipe has step
    objects (and paths) of its own: three times the memory (the campaign grew 3 KB a trial
    on a fast corpus, past 400 MB in 8 minutes). Kept, equal steps are one object."""
    a, b = (Step(StepKind.DLOPEN, name, Flags.LOCAL, CORPUS / name)
            for name in ("libcz_pair_a.so", "libcz_pair_b.so"))
    written: list[TrialRecord] = []
    with Trials(Limits()) as trials:
        run = RunOnce(trials, written, Quiet())  # type: ignore[arg-type]
        for seq in ((a, b), (b, a), (a, a)):
            ran = TrialRecord(seq, Outcome.CLEAN, None, None, None, None, 0,
                              "every step completed", 0.01, 10.0, trials.repro(seq), "fork-server")
            run.take(pickle.loads(pickle.dumps(ran)))  # as a worker's record arrives
    assert [r.sequence for r in written] == [(a, b), (b, a), (a, a)]
    kept = {id(step) for record in written for step in record.sequence}
    assert len(kept) == 2 and all(step.path in (a.path, b.path)
                                  for record in written for step in record.sequence)


def test_neighbouring_seeds_share_no_round():
    # a nightly job seeds with its run number: with `seed + r`, night N+1's round r was
    # night N's round r+1, and 82% of its sequences the night before's
    from loadfuzz.search.workers import round_seed

    def rounds(seed):
        return {round_seed(seed, worker, number) for worker in range(4) for number in range(500)}

    assert len(rounds(41)) == 2000 and not rounds(41) & rounds(42)
    assert round_seed(41, 1, 7) == round_seed(41, 1, 7)  # still one search per seed


def test_a_finding_whose_database_entry_was_cut_short_is_saved_again(tmp_path):
    # Hypothesis never writes over an entry's file: an empty one (a kill mid-write, a partial
    # cache restore) kept that finding out of the database for good
    db = tmp_path / "db"
    common = ("fuzz", CORPUS, "--select", "libcz_pair_*", "--flags", "local", "--budget", "1s",
              "--db", db)
    assert json.loads(loadfuzz(*common, "--out", tmp_path / "1", "--json").stdout)["findings"]
    entries = [p for p in db.rglob("*") if p.is_file() and p.parent.name != "metakeys"
               and p.read_bytes().startswith(b"[")]
    assert entries
    for entry in entries:
        entry.write_bytes(b"")
    second = json.loads(loadfuzz(*common, "--out", tmp_path / "2", "--json").stdout)
    assert not any("could not save" in w for w in second["warnings"]), second["warnings"]
    assert all(entry.read_bytes().startswith(b"[") for entry in entries)
    third = json.loads(loadfuzz(*common, "--out", tmp_path / "3", "--json").stdout)
    assert not any(w.startswith(f"--db {db}") for w in third["warnings"]), third["warnings"]
    assert {f["phase"] for f in third["found"]} == {"replay"}


STOPPED_AFTER_A_PHASE = """
import sys
from loadfuzz.cli import main
from loadfuzz.search import fuzz
real, calls = fuzz.run_work, []
def stopped_after_the_second(*args, **kwargs):  # the predicted phase's trials, then Ctrl-C
    records = real(*args, **kwargs)
    calls.append(1)
    if len(calls) == 2:
        raise KeyboardInterrupt
    return records
fuzz.run_work = stopped_after_the_second
sys.exit(main(sys.argv[1:]))
"""


def test_a_campaign_stopped_before_a_phase_took_in_its_trials_still_reports_them(tmp_path):
    # the partial summary said "no trial ran" beside a trials.jsonl of failures
    out = tmp_path / "out"
    done = subprocess.run([str(LOADFUZZ.with_name("python")), "-c", STOPPED_AFTER_A_PHASE,
                           "fuzz", str(CORPUS), "--select", "libcz_pair_*", "--budget", "1m",
                           "--db", str(tmp_path / "db"), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 130, done.stderr
    lines = (out / "trials.jsonl").read_text().splitlines()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["incomplete"] and summary["trials"] == len(lines) > 0
    assert summary["findings"] and {f["phase"] for f in summary["found"]} == {"stopped"}
    assert all(f["cause"]["evidence"] == "static" and f["fixes"] for f in summary["findings"])
    assert summary["max_len"] == 4 and summary["db"] == str(tmp_path / "db")
    assert "no trial ran" not in (out / "report.md").read_text()


def test_a_ctrl_c_that_reaches_a_worker_while_it_starts_is_dropped_without_a_traceback(capfd):
    """A terminal's Ctrl-C (or `timeout -s INT`) reaches the whole process group: the campaign's
    process stops the workers itself, and a worker still importing must not print a traceback."""
    from loadfuzz.search.workers import start_worker

    read, write = os.pipe()
    worker = start_worker(write)
    os.close(write)
    worker.send_signal(signal.SIGINT)  # while its interpreter starts and imports
    worker.stdin.close()  # the campaign ends before giving it anything to do
    assert worker.wait(timeout=60) == 0
    os.close(read)
    assert "Traceback" not in capfd.readouterr().err
