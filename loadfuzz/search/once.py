"""Once: a search's trials, each distinct sequence run once per campaign (fuzz's rounds, repro's
orders and shrinking ask for the same sequence often), its record appended to the folder."""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from loadfuzz.campaign import Watcher
from loadfuzz.model import Key, Step, TrialRecord, sequence_key
from loadfuzz.model import Sequence as Steps
from loadfuzz.results import ResultsFolder
from loadfuzz.run.trials import Trials


class RunOnce:
    """Runs each distinct sequence once per campaign and appends its record to the folder:
    a search (fuzz's rounds, repro's orders, shrinking) asks for the same sequence often.

    A trial ends at the step that failed: the harness never takes the steps after it. So a
    sequence that repeats, step for step, the steps of an earlier trial up to the one it
    ended at, would end there too; it is answered from memory (that trial's verdict, under
    its own sequence) and does not run. Only trials that ran are appended to the folder
    and counted; `recalled` counts the answers from memory. Safe to call from several
    threads (`in_order`)."""

    def __init__(self, trials: Trials, folder: ResultsFolder, watcher: Watcher):
        self.trials, self.folder, self.watcher = trials, folder, watcher
        self.runs: dict[Key, TrialRecord] = {}
        self.ended: dict[Key, TrialRecord] = {}  # the steps up to a failed one -> that trial
        self.recalled = 0
        self._steps: dict[Step, Step] = {}  # one object per distinct step of the records kept
        self._lock = threading.Lock()

    def knows(self, seq: Steps) -> bool:
        """Whether this sequence's record comes from memory (see `recall`)."""
        return self.recall(seq) is not None

    def recall(self, seq: Steps) -> TrialRecord | None:
        """The record of a sequence that ran already, or of one whose steps up to a failed
        one an earlier trial took, ending there (its record, under this sequence)."""
        key = sequence_key(seq)
        if key in self.runs:
            return self.runs[key]
        for end in range(1, len(key) + 1):  # up to the whole: a failed trial's own cut
            ended = self.ended.get(key[:end])
            if ended is not None:
                return replace(ended, sequence=tuple(seq), repro=self.trials.repro(seq))
        return None

    def learn(self, record: TrialRecord) -> None:
        """Remember a record that is in the folder already (`run_work` put it there)."""
        key = record.key()
        self.runs[key] = record
        if not record.clean and record.step is not None and record.step < len(key):
            self.ended.setdefault(key[:record.step + 1], record)

    def _keep(self, record: TrialRecord) -> None:
        self.learn(record)
        self.folder.append(record)
        self.watcher.finished(record)

    def take(self, record: TrialRecord) -> None:
        """A record run elsewhere (a search worker): kept, and appended to the folder, unless
        its sequence ran here already. Its steps, new objects from the pipe (each with its
        own path), are swapped for equal ones kept already: a campaign holds every record,
        and shared steps make one a third of the size (1.2 KB, not 3.1)."""
        if record.key() not in self.runs:
            sequence = tuple(self._steps.setdefault(step, step) for step in record.sequence)
            self._keep(replace(record, sequence=sequence))

    def __call__(self, seq: Steps) -> TrialRecord:
        with self._lock:
            known = self.recall(seq)
            self.recalled += known is not None
        if known is not None:
            return known
        record = self.trials.run(seq)
        with self._lock:
            self._keep(record)
        return record

    def in_order(self, work: Iterable[Steps], jobs: int) -> Iterator[TrialRecord]:
        """The records of `work` in its order, as `self` gives them, `jobs` trials running at
        once (ahead of the one the caller waits for). A caller that stops at the record it
        wants stops the rest: trials not started never start, and those running (at most
        `jobs` - 1) finish and are kept. Any other exception closes the runner first."""
        todo = iter(work)
        window: collections.deque[Future[TrialRecord]] = collections.deque()
        with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
            try:
                while True:  # a few ahead of the running ones, so that no core waits
                    window.extend(pool.submit(self, seq)
                                  for seq in itertools.islice(todo, 4 * jobs - len(window)))
                    if not window:
                        return
                    yield window.popleft().result()
            except GeneratorExit:
                for future in window:
                    future.cancel()
                raise
            except BaseException:
                for future in window:
                    future.cancel()
                self.trials.close()
                raise
