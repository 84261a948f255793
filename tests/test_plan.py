"""The work list of a matrix: every ordered pair under each flags mode, and `--shard` slices of it
that are made without making the whole."""

from pathlib import Path

from loadfuzz import plan
from loadfuzz.model import Flags
from loadfuzz.plan import Shard
from support import Lib

LIBS = [Lib(f"lib/libnoop{i:03d}.so", Path(f"/nowhere/libnoop{i:03d}.so")) for i in range(40)]
MODES = [Flags.GLOBAL, Flags.LOCAL]


def test_the_slices_of_a_sharded_work_list_are_runs_of_even_size_that_make_up_the_whole():
    whole = plan.pairs(LIBS, MODES)
    assert len(whole) == 2 * 40 * 39 and len(set(whole)) == len(whole)
    for count in (1, 2, 3, 7, 5000):
        slices = [plan.pairs(LIBS, MODES, Shard(k, count)) for k in range(1, count + 1)]
        assert [seq for part in slices for seq in part] == whole
        assert {len(part) for part in slices} <= {len(whole) // count, -(-len(whole) // count)}


def test_a_shard_keeps_its_rows_whole_but_for_its_first_and_last():
    for count in (3, 7, 60):
        for k in range(1, count + 1):
            part = plan.pairs(LIBS, MODES, Shard(k, count))
            rows = list(dict.fromkeys(seq[0] for seq in part))
            assert all(sum(seq[0] == row for seq in part) == len(LIBS) - 1 for row in rows[1:-1])
            assert len(rows) <= -(-len(part) // (len(LIBS) - 1)) + 1


def test_a_library_id_given_twice_is_never_paired_with_itself_and_the_shards_still_add_up():
    libs = [*LIBS[:5], Lib(LIBS[0].id, Path("/elsewhere/libnoop000.so"))]
    whole = plan.pairs(libs, MODES)
    assert not any(first.lib == second.lib for first, second in whole)
    assert [seq for k in (1, 2, 3) for seq in plan.pairs(libs, MODES, Shard(k, 3))] == whole


def test_only_the_pairs_of_this_shard_get_steps(monkeypatch):
    made = []
    load = plan.load

    def counting(lib, flags):
        made.append(lib.id)
        return load(lib, flags)

    monkeypatch.setattr(plan, "load", counting)
    part = plan.pairs(LIBS, MODES, Shard(2, 100))
    assert len(part) == 31 and len(made) == 2 * 31
