"""How a work list is spread over threads: rows stay rows, and no thread waits long while
another ends a long one (a shard of a big matrix holds a few long rows)."""

import shutil
from pathlib import Path

from loadfuzz.model import Flags, Outcome, sequence_key
from loadfuzz.plan import pairs
from loadfuzz.run.harness import HarnessStep, Limits
from loadfuzz.run.schedule import Batch, balance, run_all
from loadfuzz.run.tiers import Route
from loadfuzz.run.trials import Trials
from support import Lib, hostile, step

LIMITS = Limits(timeout_s=5)


def row(first: str, length: int, costly: bool = False) -> Batch:
    route = Route((), (HarnessStep("g", Path(first)),), costly=costly)
    return Batch(tuple((step(Path(first)), step(Path(f"/{first}-then-{n}")))
                       for n in range(length)), route)


def ends(batches: list[Batch], jobs: int) -> list[int]:
    """When each of `jobs` threads taking the batches in turn is done, a trial a time unit."""
    busy = [0] * jobs
    for batch in batches:
        busy[busy.index(min(busy))] += len(batch)
    return busy


def test_a_shard_of_two_long_rows_is_cut_so_that_both_threads_end_together():
    shard = [row("/a", 99), row("/b", 51)]
    assert ends(shard, 2) == [99, 51]
    balanced = balance(shard, 2)
    assert max(ends(balanced, 2)) - min(ends(balanced, 2)) <= 19
    for whole in shard:  # each row is its pieces, in order, each with the row's key
        pieces = [b for b in balanced if b.route == whole.route]
        assert [seq for piece in sorted(pieces, key=lambda b: whole.sequences.index(b[0]))
                for seq in piece] == list(whole)
        assert len(pieces) > 1 and all(len(piece) <= 19 for piece in pieces)


def test_the_pieces_of_a_row_differ_in_length_by_one_at_most():
    balanced = balance([row("/a", 57), row("/b", 7)], 2)  # pieces of at most 8
    pieces = [len(batch) for batch in balanced if batch.route == row("/a", 1).route]
    assert sum(pieces) == 57 and max(pieces) <= 8 and max(pieces) - min(pieces) <= 1


def test_a_costly_row_left_whole_runs_first_and_the_pieces_fill_in_around_it():
    shard = [row("/a", 99), row("/torch", 40, costly=True)]
    balanced = balance(shard, 2)
    assert balanced[0] == shard[1]
    assert max(ends(balanced, 2)) - min(ends(balanced, 2)) <= 18


def test_the_rows_of_a_whole_matrix_and_a_costly_row_are_left_whole():
    matrix = [row(f"/lib{n}", 99) for n in range(100)]
    assert balance(matrix, 2) == matrix
    libtorch_first = [row("/torch", 99, costly=True), row("/b", 3)]
    assert balance(libtorch_first, 2) == libtorch_first


def test_one_thread_cuts_nothing():
    shard = [row("/a", 99), row("/b", 51)]
    assert balance(shard, 1) == shard


def test_pieces_of_a_cut_row_each_take_the_first_step_once_and_end_as_the_whole_row(tmp_path):
    """30 copies of a clean library: a row of 29 pairs and 10 of the next, on 2 threads."""
    libs = []
    for n in range(30):
        copy = tmp_path / f"libclean{n:02d}.so"
        shutil.copyfile(hostile("clean"), copy)
        libs.append(Lib(f"lib{n:02d}", copy))
    work = pairs(libs, [Flags.GLOBAL])[:39]
    records = []
    with Trials(LIMITS) as runner:
        pieces = balance(runner.batches(work), 2)
        run_all(runner, work, 2, records.append)
    assert sorted(len(piece) for piece in pieces) == [5, 5, 7, 7, 7, 8]
    assert sorted(map(sequence_key, (r.sequence for r in records))) == sorted(map(sequence_key, work))
    assert {(r.outcome, r.via) for r in records} == {(Outcome.CLEAN, "shared prefix")}
    assert runner.usage.rows_shared == len(pieces)
