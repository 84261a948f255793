"""Servers started on a guess: a campaign run again starts the servers its last run took
before it reads its inventory, and a guess never changes what a campaign finds or reports."""

import json
import os
import tempfile
import threading
import time

from loadfuzz.derived import DerivedCache
from loadfuzz.model import Flags
from loadfuzz.run import ahead
from loadfuzz.run.harness import HarnessStep
from loadfuzz.run.pool import ServerPool
from loadfuzz.settings import CampaignSettings, RunSettings, TargetSpec
from support import FIXTURES, SITE, alive_children, children_now, hostile, loadfuzz

CORPUS = FIXTURES / "corpus"
SETTINGS = CampaignSettings(TargetSpec((str(CORPUS),)), flags=(Flags.GLOBAL,))


def fresh_cache(tmp_path) -> DerivedCache:
    return DerivedCache(tmp_path / "derived", settle_ns=0)


def took(preloads) -> ServerPool:
    """A pool whose trials took a server of each preload, closed as a finished campaign's is."""
    pool = ServerPool()
    for preload in preloads:
        pool.give_back(preload, pool.take(preload))
    pool.close()
    return pool


def started_ahead_threads_end():
    for thread in threading.enumerate():
        if thread.name == "loadfuzz-prestart":
            thread.join(timeout=30)


def test_the_next_run_of_a_command_starts_the_servers_the_last_one_took(tmp_path):
    cache = fresh_cache(tmp_path)
    preload = (HarnessStep("l", hostile("clean")),)
    ahead.remember("matrix", SETTINGS, took([preload]), cache)
    assert ahead.guess("matrix", SETTINGS, cache) == [preload]
    pool = ahead.start("matrix", SETTINGS, cache)
    try:
        server = pool.take(preload)
        assert server is not None and server.alive
        assert pool.usage.servers == 1  # the trial took the server started on the guess
    finally:
        pool.close()


def test_a_guess_belongs_to_the_command_and_the_words_that_route_its_trials(tmp_path):
    cache = fresh_cache(tmp_path)
    ahead.remember("matrix", SETTINGS, took([(HarnessStep("l", hostile("clean")),)]), cache)
    both_flags = CampaignSettings(SETTINGS.target, flags=(Flags.GLOBAL, Flags.LOCAL))
    resumed = CampaignSettings(SETTINGS.target, flags=SETTINGS.flags, out=tmp_path, resume=True)
    cold = CampaignSettings(SETTINGS.target, RunSettings(cold=True), flags=SETTINGS.flags)
    assert ahead.guess("fuzz", SETTINGS, cache) == []
    assert ahead.guess("matrix", both_flags, cache) == []
    assert ahead.guess("matrix", resumed, cache) == []  # what is left is not the last run's
    assert ahead.guess("matrix", cold, cache) == []
    whole = ahead.guess("matrix", SETTINGS, cache)
    for partial in (resumed, cold):  # neither keeps what it took over the whole run's guess
        ahead.remember("matrix", partial, took([(HarnessStep("g", hostile("clean")),)]), cache)
    assert ahead.guess("matrix", SETTINGS, cache) == whole != []


def test_the_slowest_server_to_start_is_guessed_first(tmp_path):
    cache = fresh_cache(tmp_path)
    light = (HarnessStep("l", hostile("clean")),)
    heavy = (HarnessStep("g", SITE / "torch" / "lib" / "libtorch_cpu.so"),)  # ~0.2 s to load
    ahead.remember("matrix", SETTINGS, took([light, heavy]), cache)
    assert ahead.guess("matrix", SETTINGS, cache) == [heavy, light]


def test_a_guess_is_forgotten_when_a_preloaded_file_changes(tmp_path):
    cache = fresh_cache(tmp_path)
    library = tmp_path / "libcopy.so"
    library.write_bytes(hostile("clean").read_bytes())
    ahead.remember("matrix", SETTINGS, took([(HarnessStep("l", library),)]), cache)
    assert ahead.guess("matrix", SETTINGS, cache) != []
    os.utime(library, ns=(time.time_ns(), time.time_ns()))
    assert ahead.guess("matrix", SETTINGS, cache) == []


def test_a_guess_that_cannot_start_is_forgotten_and_the_trial_decides(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    broken = (HarnessStep("l", tmp_path / "libnowhere.so"),)
    pool = ServerPool()
    pool.prestart(broken, guess=True)
    started_ahead_threads_end()
    assert pool.usage.servers_failed == {}  # a guess that failed says nothing
    assert pool.take(broken) is None  # the trial's own start failed: it goes cold
    assert list(pool.usage.servers_failed) == ["libnowhere.so"]
    assert pool.take(broken) is None and pool.usage.servers == 0  # remembered as broken now
    pool.close()


def test_a_wrong_guess_is_closed_with_the_pool_and_never_named_as_a_preload(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    children_before = children_now()
    used, unused = (HarnessStep("l", hostile("clean")),), (HarnessStep("g", hostile("clean")),)
    pool = ServerPool()
    pool.prestart(unused, guess=True)
    pool.give_back(used, pool.take(used))
    pool.close()
    started_ahead_threads_end()
    assert pool.preloaded == used and list(pool.taken) == [used]
    assert list(scratch.iterdir()) == []
    assert alive_children(children_before) == []


def run_matrix(tmp_path, out, *extra):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return loadfuzz("matrix", CORPUS, "--flags", "global", "--out", tmp_path / out, "--json",
                    *extra, env=env)


def test_a_matrix_run_on_its_guess_finds_and_reports_what_the_first_run_did(tmp_path):
    first, again = run_matrix(tmp_path, "first"), run_matrix(tmp_path, "again")
    assert first.returncode == again.returncode == 1, again.stderr
    one, two = json.loads(first.stdout), json.loads(again.stdout)
    assert one["preload"] == two["preload"] and one["preload"]
    verdicts = {name: {json.dumps(r["sequence"]): (r["outcome"], r["signature"])
                       for r in map(json.loads, (tmp_path / name / "trials.jsonl").open())}
                for name in ("first", "again")}
    assert verdicts["first"] == verdicts["again"] and len(verdicts["first"]) == one["trials"]
    assert list((tmp_path / "tmp").iterdir()) == []


def test_bad_input_after_the_guessed_servers_started_leaves_nothing_behind(tmp_path):
    assert run_matrix(tmp_path, "first").returncode == 1
    children_before = children_now()
    bad = tmp_path / "expectations.toml"
    bad.write_text("[[expected]\n")  # read while the guessed servers start
    done = run_matrix(tmp_path, "again", "--expect", bad)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "again").exists()
    assert list((tmp_path / "tmp").iterdir()) == []
    assert alive_children(children_before) == []
