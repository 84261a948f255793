"""Baseline: what changed since an earlier campaign (`matrix`/`fuzz --baseline RESULTS_FOLDER`).

The baseline is the results folder of an earlier finished campaign (the last
release's, say); only its `summary.json` is read, never its paths. Findings
are compared by identity, as `fuzz` tells failures apart (`shrink.Identity`),
here on JSON records: (outcome, signature, op, the set of library ids of the
steps up to and including the one it ended in; every step when it ended
after the last). Library ids are normalised first, so that identity survives
a new version: in a multi-target campaign an id is `<name>-<version>/<path>`,
and the `-<version>` of that first component is dropped.

This campaign's findings are split into `new` (identity not in the baseline)
and `still`; the baseline's findings whose identity this campaign did not
find are `gone` when this campaign could have seen them (it ran that very
load order, up to the step where the finding ended, under the same flags),
else they count as `out_of_scope` (a library or flags mode not in this
campaign, another shard's work, a sequence the search did not draw).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadfuzz.model import UsageError, normal_id

# --fail-on: what makes the exit status 1.
FAIL_ON = ("unexpected", "new")

Identity = tuple[str, str | None, str | None, frozenset[str]]
Prefix = tuple[tuple[str, str, str], ...]


def steps_run(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The steps up to and including the one the trial ended in (every step if it ended after
    the last one)."""
    step = record.get("step")
    sequence = record["sequence"]
    return list(sequence if step is None else sequence[:step + 1])


def identity(record: Mapping[str, Any]) -> Identity:
    """What makes two findings the same finding, whatever version or folder they came from."""
    libraries = frozenset(normal_id(s["lib"]) for s in steps_run(record))
    return (record["outcome"], record.get("signature"), record.get("op"), libraries)


def prefix(record: Mapping[str, Any]) -> Prefix:
    """The load order that led to where the trial ended, with normalised ids."""
    return tuple((s["kind"], normal_id(s["lib"]), s["flags"]) for s in steps_run(record))


@dataclass(frozen=True)
class Baseline:
    """An earlier finished campaign's summary, read and checked."""

    folder: Path  # as given
    summary: Mapping[str, Any]

    @classmethod
    def read(cls, folder: Path, where: str | None = None) -> Baseline:
        """The summary.json of a finished, whole matrix or fuzz campaign; UsageError if not,
        naming it as `where` (by default as the --baseline option)."""
        from loadfuzz.results import finished_summary  # with the report writers: only when used

        where = where or f"--baseline {folder}"
        if not folder.is_dir():
            raise UsageError(f"{where}: no such folder (give the results folder of an earlier "
                             "matrix or fuzz campaign)")
        summary = finished_summary(folder, where)
        if summary.get("shard") is not None:
            raise UsageError(f"{where}: holds shard {summary['shard']} of a campaign, not the "
                             "whole: merge the shards (loadfuzz merge) and give the merged folder")
        findings = summary.get("findings")
        try:
            if not isinstance(findings, list):
                raise TypeError("no list of findings")
            for record in findings:
                identity(record), prefix(record)
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            raise UsageError(f"{where}: its summary.json holds a finding that is not a trial "
                             f"record ({exc})") from None
        return cls(folder, summary)

    @property
    def findings(self) -> list[Mapping[str, Any]]:
        return self.summary["findings"]

    def compare(self, findings: Sequence[Mapping[str, Any]],
                ran: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """The summary's `baseline` object: this campaign's `findings` split into new and still,
        the baseline's findings it did not find that it could have seen (`ran`: every trial it
        ran) as gone, and how many it could not have seen."""
        before = {identity(r) for r in self.findings}
        now = {identity(r) for r in findings}
        tried = {steps[:n] for steps in map(prefix, ran) for n in range(1, len(steps) + 1)}
        missing = [r for r in self.findings if identity(r) not in now]
        return {
            "folder": os.path.abspath(self.folder),  # merge may run in another folder
            "version": self.summary.get("version"),
            "new": [dict(r) for r in findings if identity(r) not in before],
            "gone": [dict(r) for r in missing if prefix(r) in tried],
            "still": [dict(r) for r in findings if identity(r) in before],
            "out_of_scope": sum(prefix(r) not in tried for r in missing),
        }


def check_fail_on(fail_on: str, baseline: Path | None) -> None:
    """`--fail-on new` needs a baseline to tell what is new."""
    if fail_on == "new" and baseline is None:
        raise UsageError("--fail-on new needs --baseline RESULTS_FOLDER (the earlier campaign "
                         "that tells what is new)")
