"""A trial's verdict does not depend on the path it takes: cold, fork server or shared prefix.

Every ordered pair of every fixture library that is not hostile (the hostile
ones are run on each path in test_run.py), plus the corpus's three-step
collision, is run three ways: each in a fresh process; each forked from a
fork server; and as campaigns run them, a matrix row forked from a row server
that took its first step. All three must give every sequence the same
verdict, and the fast paths must never have disagreed with their own cold
confirmation.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest

from loadfuzz import inventory, plan
from loadfuzz.model import Flags, sequence_key
from loadfuzz.run.harness import Limits
from loadfuzz.run.schedule import run_all
from loadfuzz.run.tiers import Tiers
from loadfuzz.run.trials import Trials
from support import FIXTURES

LIMITS = Limits(timeout_s=5)
FOLDERS = ["corpus", "interpose", "signatures", "legacy", "sdk"]


@pytest.fixture(scope="module")
def libraries():
    paths = sorted(path for folder in FOLDERS for path in (FIXTURES / folder).glob("*.so"))
    return inventory.load_libraries(paths).libraries


@pytest.fixture(scope="module")
def work(libraries):
    by_name = {lib.path.name: lib for lib in libraries}
    registry, weak_p, weak_q = (by_name[f"libcz_{name}.so"] for name in ("registry", "weak_p", "weak_q"))
    triples = [
        (plan.dlopen(registry, Flags.GLOBAL), plan.dlopen(p, Flags.LOCAL), plan.dlopen(q, Flags.LOCAL))
        for p, q in [(weak_p, weak_q), (weak_q, weak_p)]
    ]
    return plan.pairs(libraries, [Flags.GLOBAL]) + triples


def verdicts(records):
    return {sequence_key(r.sequence): (r.outcome, r.step, r.signature, r.op) for r in records}


def test_every_fixture_pair_has_one_verdict_cold_from_the_fork_server_and_from_row_servers(
        libraries, work):
    tiers = Tiers.of(libraries)
    runs = {}
    with Trials(LIMITS, tiers, cold=True) as cold:
        run_all(cold, work, 2, runs.setdefault("cold", []).append)
    with Trials(LIMITS, tiers) as forked, ThreadPoolExecutor(2) as pool:
        runs["fork-server"] = list(pool.map(forked.run, work))
        assert forked.disagreements == [] and forked.usage.rows_shared == 0
    with Trials(LIMITS, tiers) as shared:
        run_all(shared, work, 2, runs.setdefault("shared prefix", []).append)
        assert shared.disagreements == []
        rows = [batch for batch in shared.batches(work) if len(batch) > 1]
    # every row forked from a row server but two, whose first step fails on its own
    unshareable = {"libfx_lazy_inner.so", "libfx_symbol_lookup.so"}
    assert shared.usage.rows_not_shared == {"a step of the prefix failed": 1,
                                            "a step of the prefix ended its process": 1}
    assert shared.usage.rows_shared == len(rows) - 2
    in_rows = {sequence_key(seq) for row in rows for seq in row if row[0][0].path.name not in unshareable}
    assert {sequence_key(r.sequence) for r in runs["shared prefix"]
            if r.via.startswith("shared prefix")} == in_rows
    assert verdicts(runs["fork-server"]) == verdicts(runs["cold"])
    assert verdicts(runs["shared prefix"]) == verdicts(runs["cold"])
    findings = {key for key, (outcome, *_) in verdicts(runs["cold"]).items() if outcome.value != "clean"}
    assert len(findings) >= 10  # the run saw collisions, not only clean loads
