"""The work list of a matrix: every ordered pair under each flags mode, and `--shard` slices of it
that are made without making the whole."""

from pathlib import Path

from loadfuzz import plan
from loadfuzz.model import Flags
from loadfuzz.plan import Shard
from support import Lib

LIBS = [Lib(f"lib/libnoop{i:03d}.so", Path(f"/nowhere/libnoop{i:03d}.so")) for i in range(40)]
MODES = [Flags.GLOBAL, Flags.LOCAL]


def test_the_slices_of_a_sharded_work_list_are_every_nth_pair_and_make_up_the_whole():
    whole = plan.pairs(LIBS, MODES)
    assert len(whole) == 2 * 40 * 39 and len(set(whole)) == len(whole)
    for count in (1, 2, 3, 7, 5000):
        slices = [plan.pairs(LIBS, MODES, Shard(k, count)) for k in range(1, count + 1)]
        for k, part in enumerate(slices, start=1):
            assert part == whole[k - 1::count]
        assert sorted(map(whole.index, (seq for part in slices for seq in part))) == list(
            range(len(whole)))


def test_only_the_pairs_of_this_shard_get_steps(monkeypatch):
    made = []
    load = plan.load

    def counting(lib, flags):
        made.append(lib.id)
        return load(lib, flags)

    monkeypatch.setattr(plan, "load", counting)
    part = plan.pairs(LIBS, MODES, Shard(2, 100))
    assert len(part) == 32 and len(made) == 2 * 32
