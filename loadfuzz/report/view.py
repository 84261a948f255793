"""The campaign as the report writers see it: the summary and the trial records, looked up once.

Every writer takes the campaign's JSON data: the summary (the `--json`
object, with the optional keys the driver adds: "command", "version",
"expected", "preload", "servers", "throughput", "disagreements", "started",
"finished", "shard") and the trial records as dicts (as in trials.jsonl), so
a folder can be re-rendered later from its own summary.json and trials.jsonl.

Which finding is expected comes from the summary, never from re-matching: a
finding listed in "unexpected" is unexpected, any other finding is expected
(with the "why" of the entry in "expected" when the summary has one).

Library ids can hold spaces, newlines, `<`, `&`, non-ASCII and even bytes
that are not UTF-8 (lone surrogates): `visible` shows what cannot be shown
as escapes; each writer escapes for its own format.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loadfuzz.model import Key, Outcome, json_key, new_and_unexpected, step_label
from loadfuzz.spelling import spell_sequence

# The outcomes, in the order of the legend and of the outcome table.
OUTCOME_ORDER = tuple(outcome.value for outcome in Outcome)
# Characters shown as escapes wherever text must stay on one visible line.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


@dataclass(frozen=True)
class CampaignView:
    """The summary plus every trial, with each finding's number and status looked up once."""

    summary: Mapping[str, Any]
    records: dict[Key, Mapping[str, Any]]  # a record per trial; a finding's wins
    findings: list[Mapping[str, Any]]  # the summary's findings, numbered from 1 in this order
    number: dict[Key, int]
    unexpected: frozenset[Key]
    environment: frozenset[Key]  # problems of the environment (a missing Python module)
    why: dict[Key, str]
    new: frozenset[Key] = frozenset()  # with --fail-on new: the unexpected findings it counts

    @classmethod
    def of(cls, summary: Mapping[str, Any], trials: Iterable[Mapping[str, Any]]) -> CampaignView:
        findings = list(summary.get("findings", []))
        records = {json_key(r): r for r in trials}
        # a finding's record (confirmed cold) stands for its trial; a finding that is no trial
        # of the campaign (shrinking answered it from memory, see `search.once`) adds none
        records.update((key, r) for r in findings if (key := json_key(r)) in records)
        return cls(
            summary=summary,
            records=records,
            findings=findings,
            number={json_key(r): n for n, r in reversed(list(enumerate(findings, start=1)))},
            unexpected=frozenset(json_key(r) for r in summary.get("unexpected", [])),
            environment=frozenset(json_key(r) for r in summary.get("environment", [])),
            why={json_key(e["record"]): e.get("why", "") for e in summary.get("expected", [])},
            new=frozenset(map(json_key, new_and_unexpected(summary)))  # as the exit status
            if summary.get("fail_on") == "new" else frozenset(),
        )

    @property
    def only_new_fail(self) -> bool:
        """Whether the campaign ran with `--fail-on new`: only unexpected findings new since
        the baseline fail it (the exit status, junit.xml and the verdict agree on that)."""
        return self.summary.get("fail_on") == "new"

    def fails(self, record: Mapping[str, Any]) -> bool:
        """Whether this finding fails the campaign (makes its exit status 1)."""
        return self.status(record) == "unexpected" and (
            not self.only_new_fail or json_key(record) in self.new)

    def status(self, record: Mapping[str, Any]) -> str:
        """One of clean, expected, unexpected, environment. A finding the summary lists nowhere
        counts as unexpected: nothing vouched for it."""
        key = json_key(record)
        if record["outcome"] == "clean":
            return "clean"
        if key in self.unexpected:
            return "unexpected"
        if key in self.environment:
            return "environment"
        return "expected" if key in self.number or key in self.why else "unexpected"

    def title(self) -> str:
        summary = self.summary
        name = f"{summary.get('target', '?')} {summary.get('version') or ''}".strip()
        shard = f" (shard {summary['shard']})" if summary.get("shard") else ""
        return f"loadfuzz {summary.get('command', 'matrix')}: {name}{shard}"

    def stale_intro(self) -> str:
        """What the stale list says it is: a shard's entries are stale in its slice only."""
        if self.summary.get("shard"):
            return ("These entries of the expectations file matched no finding in this shard's "
                    "slice of the work; another shard may use them (a merge of the shards decides "
                    "over the whole campaign):")
        return "These entries of the expectations file matched no finding:"

    def verdict(self) -> str:
        statuses = Counter(map(self.status, self.findings))
        unexpected, environment = statuses["unexpected"], statuses["environment"]
        stale = len(self.summary.get("stale", []))
        parts = [f"{count(len(self.findings), 'finding')}, {statuses['expected']} of them expected"
                 if self.findings else self.no_findings()]
        if environment:  # neither expected nor unexpected (see `status`)
            parts.append(f"{count(environment, 'environment problem')} (never unexpected)")
        if stale:
            parts.append(count(stale, "stale expectation"))
        head = count(unexpected, "unexpected finding") if unexpected else "Nothing unexpected"
        if self.only_new_fail:
            failing = sum(map(self.fails, self.findings))
            parts.append(f"{unexpected} unexpected, {failing or 'none'} of them new since the "
                         f"baseline (--fail-on new)")
            head = count(failing, "new unexpected finding") if failing else (
                "Nothing new and unexpected")
        if self.summary.get("incomplete"):  # read first: "Nothing unexpected" is not a pass
            head = f"Incomplete, {head[0].lower()}{head[1:]} so far"
        return f"{head}: " + ", ".join(parts)

    def no_findings(self) -> str:
        """What a campaign without findings says of its trials."""
        if self.summary.get("incomplete"):  # stopped, or could not finish
            return "every trial that ran was clean" if self.records else "no trial ran"
        return "every trial was clean"

    def outcome_counts(self) -> Counter[str]:
        return Counter(r["outcome"] for r in self.records.values())

    def libraries(self) -> list[str]:
        """The summary's libraries, then any library a pair trial names that it lacks."""
        named = (s["lib"] for r in self.pair_records() for s in r["sequence"])
        return list(dict.fromkeys([*self.summary.get("libraries", []), *named]))

    def rows(self, mode: str | None = None) -> list[str]:
        """The libraries whose rows a matrix shows (in flags `mode`, or any): every one; for a
        shard (`--shard`), those that are the first library of a pair it ran (in that mode: its
        other rows are other shards')."""
        libraries = self.libraries()
        if not self.summary.get("shard"):
            return libraries
        firsts = {r["sequence"][0]["lib"] for r in self.pair_records()
                  if mode is None or flags_mode(r) == mode}
        return [lib for lib in libraries if lib in firsts]

    def flags_modes(self) -> list[str]:
        """The summary's flags modes, then any mode a pair trial of a matrix was run under that
        it lacks (a fuzz campaign's two-step trials mix modes: `global/local` is none)."""
        ran = map(flags_mode, self.pair_records() if self.summary.get("command") != "fuzz" else ())
        return list(dict.fromkeys([*self.summary.get("flags", []), *ran]))

    def pair_records(self) -> list[Mapping[str, Any]]:
        return [r for r in self.records.values() if len(r["sequence"]) == 2]

    def pairs(self) -> dict[tuple[str, str, str], Mapping[str, Any]]:
        """(first, second, flags mode) -> the record of that two-step trial."""
        return {
            (r["sequence"][0]["lib"], r["sequence"][1]["lib"], flags_mode(r)): r
            for r in self.pair_records()
        }


ENVIRONMENT_WHY = "a problem of the environment under test (a Python module it lacks), not a collision"


def count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def flags_mode(record: Mapping[str, Any]) -> str:
    """The flags mode a trial ran under: its steps' mode, or "global/local" if they differ."""
    return "/".join(dict.fromkeys(s["flags"] for s in record["sequence"]))


def visible(text: str) -> str:
    """`text` on one line: control characters and undecodable bytes shown as escapes."""
    return _INVISIBLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def sequence_label(record: Mapping[str, Any]) -> str:
    """The trial's steps as people read them (see `spelling.spell_sequence`)."""
    return spell_sequence(record["sequence"])


def ended_in(record: Mapping[str, Any]) -> str | None:
    step = record.get("step")
    if step is None or not 0 <= step < len(record["sequence"]):
        return None
    return f"step {step} ({step_label(record['sequence'][step])})"


def script_name(number: int, total: int) -> str:
    """repro/NNN.sh name of finding `number` (1-based) of `total`: 001.sh, ..., 1000.sh."""
    return f"{number:0{max(3, len(str(total)))}d}.sh"


def repro_path(campaign: CampaignView, record: Mapping[str, Any]) -> str | None:
    number = campaign.number.get(json_key(record))
    return None if number is None else f"repro/{script_name(number, len(campaign.findings))}"
