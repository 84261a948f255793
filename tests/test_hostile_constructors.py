"""Constructors that attack the process tree, the kernel's limits and the signals.

They go further than test_run.py's: a thousand threads, two hundred children
(with and without an exit), new user and mount namespaces, a new process
group, the address-space ceiling, every signal blocked. Each is loaded as step
1 between two clean libraries on each path: cold (a fresh process), forked
from a fork server, and forked from a row server that took the first step
(shared prefix). Each must get its one right outcome on every path. Nothing it
started may outlive the trial, and the runner must still serve the next trial.
No test asserts a duration.
"""

import signal
import subprocess

import psutil
import pytest

from loadfuzz.model import Flags, Outcome
from loadfuzz.run.harness import Harness, HarnessDied, HarnessStep, Limits, run_cold
from support import PATHS, build_loader, hostile, processes_holding, step, trials_on

LIMITS = Limits(timeout_s=2, mem_mb=4096)
# mmap_ceiling maps and touches memory up to RLIMIT_AS. A small ceiling keeps it
# quick and well away from what the machine has.
CEILING_MB = 512
CLEAN = hostile("clean")

# fixture -> (outcome, step, signal, exit code), loaded as step 1 between two clean
# libraries; and how many leftover processes the harness must kill after it.
EXPECTED = {
    # threads end with their process: the load completes, nothing is left over
    "threads1000": ((Outcome.CLEAN, None, None, 0), 0),
    # the load completes; its 200 children are re-parented to the (subreaper) server and killed
    "fork200": ((Outcome.CLEAN, None, None, 0), 200),
    "fork200_exit": ((Outcome.EXIT, 1, None, 3), 200),
    # a process in a user namespace of its own is still the server's child: nothing changes
    "unshare": ((Outcome.CLEAN, None, None, 0), 0),
    # the harness never kills by process group, so a group of its own hides nothing
    "setpgid": ((Outcome.CLEAN, None, None, 0), 1),
    # mmap fails at the ceiling, the constructor says so and returns: not a failure
    "mmap_ceiling": ((Outcome.CLEAN, None, None, 0), 0),
    # only SIGKILL ends it, at the time limit (a timeout's detail counts no leftovers)
    "block_signals": ((Outcome.TIMEOUT, 1, signal.SIGKILL, None), None),
}
NAMES = sorted(EXPECTED)


def limits_for(name: str) -> Limits:
    return Limits(timeout_s=2, mem_mb=CEILING_MB) if name == "mmap_ceiling" else LIMITS


def via(path: str, outcome: Outcome) -> str:
    """The record's `via` when the fast path and the cold confirmation agree."""
    fast = {"cold": "cold", "fork-server": "fork-server", "shared-prefix": "shared prefix"}[path]
    return fast if outcome is Outcome.CLEAN or path == "cold" else f"{fast}, confirmed cold"


def runner_of(trials):
    """The `Trials` behind a runner from `trials_on` (the shared-prefix one wraps it)."""
    return getattr(trials, "trials", trials)


def strays() -> list[psutil.Process]:
    """Processes below this one other than the runner's fork servers: they are leftovers.

    A row server ends by itself after END (its server then reaps it), so it is
    waited for, not counted. Nothing else is alive below a server between trials.
    """
    me = psutil.Process()
    below = []
    for proc in me.children(recursive=True):
        try:
            if proc.ppid() == me.pid and proc.name().startswith("harness"):
                continue  # a fork server of the runner (the build may suffix its name)
            below.append(proc)
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(below, timeout=10)
    return alive


def leftovers_said(detail: str) -> int:
    """How many leftover processes the record says were killed (0 when it does not say)."""
    words = detail.rsplit("(", 1)[-1].split()
    return int(words[0]) if "leftover" in detail and words[0].isdigit() else 0


def assert_nothing_left(name: str) -> None:
    assert strays() == []
    assert processes_holding(hostile(name)) == []


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", NAMES)
def test_each_hostile_constructor_gets_its_outcome_at_its_step_and_leaves_nothing(path, name):
    (outcome, at, number, code), killed = EXPECTED[name]
    with trials_on(path, limits_for(name)) as trials:
        record = trials.run((step(CLEAN), step(hostile(name)), step(CLEAN, Flags.LOCAL)))
        assert (record.outcome, record.step, record.signal, record.exit_code) == (
            outcome, at, number, code), record.detail
        assert record.via == via(path, outcome)  # the fast path and the cold run agreed
        assert runner_of(trials).disagreements == []
        if killed is not None:
            assert leftovers_said(record.detail) == killed, record.detail
        assert_nothing_left(name)
    assert psutil.Process().children(recursive=True) == []
    assert processes_holding(hostile(name)) == []


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", NAMES)
def test_the_same_runner_runs_a_clean_trial_after_each_hostile_one(path, name):
    with trials_on(path, limits_for(name)) as trials:
        trials.run((step(CLEAN), step(hostile(name)), step(CLEAN, Flags.LOCAL)))
        after = trials.run((step(CLEAN), step(CLEAN, Flags.LOCAL)))
        assert (after.outcome, after.step, after.signal, after.exit_code, after.detail) == (
            Outcome.CLEAN, None, None, 0, "every step completed")
        assert after.via == via(path, Outcome.CLEAN)
        usage = runner_of(trials).usage
        # one fork server served both trials: it survived the hostile one
        assert (usage.servers, usage.rows_shared) == {
            "cold": (0, 0), "fork-server": (1, 0), "shared-prefix": (1, 2)}[path]
        assert_nothing_left(name)


def test_each_fixture_does_what_it_says():
    said = {}
    for name in NAMES:
        evidence = run_cold([HarnessStep("g", hostile(name))], limits_for(name))
        said[name] = evidence.output.decode()
        if name == "mmap_ceiling":
            got_mb = int(said[name].split()[1])
            assert CEILING_MB - 128 <= got_mb < CEILING_MB
            assert evidence.peak_rss_mb >= got_mb  # touched, not only mapped
    assert said["threads1000"] == "fx_threads1000: 1000 threads started\n"
    assert said["fork200"] == "fx_fork200: 200 children forked\n"
    assert said["fork200_exit"] == "fx_fork200_exit: 200 children forked\n"
    # unprivileged user namespaces may be off where this runs; the fixture says which
    assert said["unshare"].startswith(("fx_unshare: in a new user and mount namespace",
                                       "fx_unshare: unshare failed: errno"))
    assert said["setpgid"].startswith("fx_setpgid: group ")
    assert said["mmap_ceiling"].endswith("MiB mapped and touched, then mmap failed\n")
    assert said["block_signals"].startswith("fx_block_signals: every signal blocked")


# A hostile *first* step is what a row server takes for its whole row. It may be shared
# only when a fork copies what the step left whole; the reason for not sharing is then
# given. Either way every trial of the row gets the verdict a cold run gives.
UNSHARED = {
    "threads1000": "the prefix started a thread",
    "fork200": "the prefix started a process",
    "fork200_exit": "a step of the prefix ended its process",
    "unshare": None,  # the namespaces are the process's own: a fork copies them
    "setpgid": "the prefix started a process",
    "mmap_ceiling": None,  # a fork copies the mappings and the limit
    "block_signals": "a step of the prefix timed out",
}


def verdict(record):
    return record.outcome, record.step, record.signal, record.exit_code, record.signature


@pytest.mark.parametrize("name", NAMES)
def test_a_hostile_first_step_is_shared_only_when_a_fork_copies_it_whole(name):
    (outcome, _, number, code), _ = EXPECTED[name]
    row = [(step(hostile(name)), step(CLEAN)), (step(hostile(name)), step(hostile("segv")))]
    with trials_on("fork-server", limits_for(name)) as runner:
        records = list(runner.run_row(row))
        cold = [runner.run_cold(seq) for seq in row]
        assert runner.disagreements == []
        why = UNSHARED[name]
        assert (runner.usage.rows_shared, runner.usage.rows_not_shared) == (
            (1, {}) if why is None else (0, {why: 1}))
        fast = "shared prefix" if why is None else "fork-server"
        assert [r.via for r in records] == [
            fast if outcome is Outcome.CLEAN else f"{fast}, confirmed cold",
            f"{fast}, confirmed cold"]
        assert [verdict(r) for r in records] == [verdict(r) for r in cold]
        ends_it = outcome is not Outcome.CLEAN  # the second step is never reached
        assert [verdict(r) for r in records] == [
            (outcome, 0 if ends_it else None, number, code, None),
            (outcome, 0, number, code, None) if ends_it else
            (Outcome.CRASH, 1, signal.SIGSEGV, None, None)]
        assert_nothing_left(name)
    assert psutil.Process().children(recursive=True) == []


def test_a_first_step_that_registers_a_fork_handler_is_never_shared(tmp_path):
    """A handler a library registers with pthread_atfork runs in every process forked after
    it loads, and a cold run never forks: were the row shared, each trial would run it (here
    it hides what makes the next library abort, and a clean trial is not run again cold).
    The row server refuses, and every trial gets its cold verdict."""
    atfork, victim = hostile("atfork"), hostile("atfork_victim")
    row = [(step(atfork), step(CLEAN)), (step(atfork), step(victim))]
    with trials_on("fork-server", LIMITS) as runner:
        records = list(runner.run_row(row))
        cold = [runner.run_cold(seq) for seq in row]
        assert (runner.usage.rows_shared, runner.usage.rows_not_shared) == (0, {
            "the prefix registered a fork handler (pthread_atfork), which every trial would run": 1})
        assert [verdict(r) for r in records] == [verdict(r) for r in cold]
    assert cold[1].outcome is Outcome.ABORT and cold[1].step == 1  # what the cold run does
    plain = subprocess.run([build_loader(tmp_path), f"g:{atfork}", f"g:{victim}"],
                           capture_output=True, text=True)  # and a plain process of its own
    assert plain.returncode == -signal.SIGABRT and "libfx_atfork.so is loaded" in plain.stderr


def test_a_server_whose_preload_registers_a_fork_handler_does_not_start():
    """The same for a library a fork server would preload: its trials go another way."""
    with pytest.raises(HarnessDied, match="registered a fork handler"), \
            Harness([HarnessStep("l", hostile("atfork"))]):
        pass
    with Harness([HarnessStep("l", hostile("atfork_victim"))]):  # a load that registers none
        pass


# --- what a trial leaves for the next, and what a process it forks can forge ---------------

REMEMBERS_IN_HOME = """#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
/* trusts a marker in $HOME once its first load found no conflicting runtime */
__attribute__((constructor)) static void probe(void) {
    char marker[4096];
    snprintf(marker, sizeof marker, "%s/.remembered-ok", getenv("HOME"));
    if (access(marker, F_OK) == 0) return;
    if (dlsym(RTLD_DEFAULT, "conflicting_runtime_marker")) { fputs("conflict\\n", stderr); abort(); }
    FILE *f = fopen(marker, "w");
    if (f) fclose(f);
}
"""
DAEMONIZES = """#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void detach(void) {
    fputs("daemonizing\\n", stderr);
    fflush(stderr);
    daemon(1, 1);  /* the trial process _exit(0)s; its child goes on loading */
}
"""


@pytest.mark.parametrize("path", PATHS)
def test_what_one_trial_leaves_in_home_never_reaches_the_next(path, tmp_path):
    # HOME and TMPDIR were the server's folder for its whole life: a marker an earlier trial
    # left there turned a later trial's abort (its cold run's, a plain process's) into clean
    from support import build

    remembers = build(tmp_path, "remembers", REMEMBERS_IN_HOME, "-ldl")
    conflict = build(tmp_path, "conflict", "int conflicting_runtime_marker(void) { return 1; }\n")
    with trials_on(path, LIMITS) as trials:
        alone = trials.run((step(remembers),))  # leaves its marker in its HOME
        assert alone.outcome is Outcome.CLEAN, alone.detail
        record = trials.run((step(conflict), step(remembers)))
        assert (record.outcome, record.step) == (Outcome.ABORT, 1), record.detail
        assert runner_of(trials).disagreements == []


@pytest.mark.parametrize("path", PATHS)
def test_a_library_that_daemonizes_exits_its_step_whatever_its_child_goes_on_to_do(
        path, tmp_path):
    # the child daemon() leaves goes on taking the steps with the trial's shared trace: the
    # outcome was clean, or an exit blamed on a later step, at random
    from support import build

    daemonizes = build(tmp_path, "daemonizes", DAEMONIZES)
    with trials_on(path, LIMITS) as trials:
        for _ in range(5):
            record = trials.run((step(CLEAN), step(daemonizes), step(CLEAN, Flags.LOCAL)))
            assert (record.outcome, record.step, record.exit_code) == (Outcome.EXIT, 1, 0), (
                record.detail)
