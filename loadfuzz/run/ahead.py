"""Ahead: the fork servers a campaign will need, started before its inventory is read.

Which servers a campaign takes is known only once its inventory is read and
its work is routed (`Tiers`, `Trials.batches`), and a heavy one (libpython
and the libtorch closure) then takes a few hundred milliseconds to start. So
each campaign command remembers the preloads its trials took, in the derived
cache (`derived.DerivedCache`), under the words that decide them: the command,
the targets, `--add`, `--select`, `--exclude`, `--env`, `--flags`,
`--shard` and `--mem` (under a ceiling of the user's own nothing is
preloaded, see `Trials.route_of`). The next run of the same command starts
those servers first (the slowest first), on a guess, while it reads the
inventory.

A guess decides nothing: a trial still asks the pool for the preload its
route names, and a server started on a guess serves only trials that ask for
exactly its preload. A wrong guess costs the CPU of a server nobody takes
(closed with the pool); a guess that cannot start is forgotten
(`ServerPool.prestart(guess=True)`). The guess is kept only while every
preloaded file is unchanged (the derived cache's witnesses). Neither kept
nor used for `--resume` (what is left is not a whole run's work) or `--cold`
(no servers).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from loadfuzz.derived import Consulted, DerivedCache
from loadfuzz.run.harness import HarnessStep
from loadfuzz.run.pool import Preload, ServerPool

if TYPE_CHECKING:
    from loadfuzz.settings import CampaignSettings


def words(command: str, settings: CampaignSettings) -> tuple:
    """What decides which servers a campaign takes, besides the files (as plain values)."""
    target = settings.target
    return (command, target.targets, tuple(map(str, target.add)), target.select, target.exclude,
            target.env, tuple(flags.value for flags in settings.flags),
            (settings.shard.index, settings.shard.count), settings.run.limits.mem_mb)


def guessing(settings: CampaignSettings) -> bool:
    """Whether servers are guessed for (and remembered from) a campaign so asked for."""
    return not (settings.resume or settings.run.cold)


def guess(command: str, settings: CampaignSettings, cache: DerivedCache | None = None,
          ) -> list[Preload]:
    """The preloads the last run of this command took, the slowest to start first, while
    every preloaded file is unchanged; none when not `guessing`."""
    if not guessing(settings):
        return []
    cache = cache or DerivedCache.default()
    return preloads_from_plain(cache.get(cache.key("servers", words(command, settings))))


def start(command: str, settings: CampaignSettings, cache: DerivedCache | None = None,
          ) -> ServerPool:
    """A pool in which the servers of `guess` are starting."""
    pool = ServerPool()
    for preload in guess(command, settings, cache):
        pool.prestart(preload, guess=True)
    return pool


def remember(command: str, settings: CampaignSettings, pool: ServerPool,
             cache: DerivedCache | None = None) -> None:
    """Keep the preloads this campaign's trials took, the slowest to start first (nothing
    when not `guessing`)."""
    if not guessing(settings):
        return
    cache = cache or DerivedCache.default()
    taken = sorted(pool.taken.items(), key=lambda item: -item[1])
    consulted = Consulted()
    for preload, _ in taken:
        for step in preload:
            if step.mode != "y":
                consulted.note(step.path)
    plain = tuple(tuple((step.mode, str(step.path), step.code) for step in preload)
                  for preload, _ in taken)
    cache.keep(cache.key("servers", words(command, settings)), consulted, time.time_ns(), plain)


def preloads_from_plain(plain: object) -> list[Preload]:
    """The preloads `remember` kept; none for anything else (None: nothing kept)."""
    try:
        return [tuple(HarnessStep(mode, Path(path), code) for mode, path, code in preload)
                for preload in plain]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        return []
