"""Merge: the results folders of the shards of one campaign, into the results folder of the whole.

`matrix ... --shard K/N` (or `fuzz`) run on N jobs leave N folders, each about
its own slice. `merge` reads their `summary.json` and `trials.jsonl` (nothing
is run), checks that they are exactly the N shards of one campaign, and
writes one folder as the whole campaign would have: every trial, the findings
in the campaign's order, what is expected, unexpected and stale decided by
the expectations over the whole, and every report.

Bad input (a folder that is not a finished campaign's, shards of different
campaigns, a shard missing or given twice, a trial in two shards, an `--out`
that holds results) is a UsageError found before anything is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadfuzz import plan, scratch
from loadfuzz.baseline import Baseline
from loadfuzz.elf.read import BadElf, ElfReader
from loadfuzz.expect import Expectation, sort_findings
from loadfuzz.model import Flags, Key, Role, StepKind, TrialRecord, UsageError, json_key, sequence_key
from loadfuzz.predict import MOST_DISAGREEMENTS, flags_decide, shared_definitions
from loadfuzz.results import LOCK, ResultsFolder, check_step_summary, finished_summary, holds_results, usable
from loadfuzz.search.shrink import Identity, simplicity
from loadfuzz.spelling import spell_sequence

# What makes two shards shards of one campaign (besides N): these keys of their summaries.
CAMPAIGN = ("command", "target", "version", "flags", "libraries", "expectations", "max_len")
CAMPAIGN_WORDS = {"command": "commands", "target": "targets", "version": "versions",
                  "flags": "flags modes", "libraries": "selected libraries",
                  "expectations": "expectations", "max_len": "--max-len values"}
# Shown by name only in a refusal: their values do not fit on one line.
LONG = ("libraries", "expectations")
# What merging reads of every summary.
SUMMARY_KEYS = ("target", "libraries", "flags", "trials", "findings", "command", "version", "shard",
                "started", "finished")


@dataclass(frozen=True)
class ShardFolder:
    """One shard's results folder, read: its summary and its trials.jsonl records (as dicts)."""

    folder: Path
    summary: dict[str, Any]
    trials: list[dict[str, Any]]
    shard: plan.Shard | None  # None: a whole campaign

    def records(self) -> dict[Key, dict[str, Any]]:
        """The last record of each sequence (as `--resume` reads the file)."""
        return {json_key(r): r for r in self.trials}

    def counted(self) -> list[dict[str, Any]]:
        """The records its summary counts: every one of a fuzz's; a matrix's whose every step
        is of its libraries and its flags modes (a `--resume` with other options leaves others
        in trials.jsonl)."""
        if self.summary["command"] != "matrix":
            return self.trials
        libraries, modes = set(self.summary["libraries"]), set(self.summary["flags"])
        return [record for record in self.trials
                if all(step["lib"] in libraries and step["flags"] in modes
                       for step in record["sequence"])]


@dataclass(frozen=True)
class Library:
    """A library as `plan` needs it to rebuild a work list or step choices from its id and
    role alone."""

    id: str
    role: Role
    path: Path = Path()


def libraries_of(shards: Sequence[ShardFolder]) -> list[Library]:
    """The campaign's libraries, as `plan` needs them: an extension module is one that some
    trial imported (`plan` imports an extension under `python`, and only an extension)."""
    imported = {step["lib"] for shard in shards for record in shard.trials
                for step in record["sequence"] if step["kind"] == StepKind.IMPORT.value}
    return [Library(lib, Role.PYTHON_EXTENSION if lib in imported else Role.OTHER)
            for lib in shards[0].summary["libraries"]]


def nowhere(lib: str) -> Path:
    return Path()


def read_folder(folder: Path) -> ShardFolder:
    """A finished matrix or fuzz campaign's results folder; UsageError if it is none."""
    trials_path = folder / "trials.jsonl"
    summary = finished_summary(folder, str(folder))
    if not trials_path.is_file():
        raise UsageError(f"{folder}: not a results folder (no trials.jsonl)")
    if "expectations" not in summary:
        raise UsageError(f"{folder}: its summary does not list its expectations (an older "
                         "loadfuzz wrote it); run that shard again")
    lacking = [key for key in SUMMARY_KEYS if key not in summary]
    if lacking:
        raise UsageError(f"{folder / 'summary.json'}: not a whole summary (no {lacking[0]!r})")
    try:
        lines = trials_path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{trials_path}: cannot read it: {exc}") from None
    trials = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            json_key(record)  # the one part of a record merging relies on
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise UsageError(f"{trials_path}: line {number} is not a trial record ({exc})") from None
        trials.append(record)
    shard = summary.get("shard")
    try:
        return ShardFolder(folder, summary, trials, None if shard is None else plan.Shard.parse(shard))
    except (UsageError, TypeError):
        raise UsageError(f"{folder / 'summary.json'}: bad shard {shard!r}") from None


def check_counts(shards: Sequence[ShardFolder]) -> None:
    """Each shard's trials.jsonl holds the trials its summary counts; UsageError if not."""
    for shard in shards:
        counted = len(shard.counted())
        if shard.summary["trials"] != counted:  # a file cut short at a line's end, or emptied
            raise UsageError(f"{shard.folder / 'trials.jsonl'}: {counted} trial records, where "
                             f"its summary counts {shown(shard.summary['trials'])}: run that "
                             "shard again")


def check_shards(shards: Sequence[ShardFolder]) -> None:
    """They are the N shards of one campaign, each once, no trial in two; UsageError if not."""
    whole = [s for s in shards if s.shard is None]
    if whole and len(whole) < len(shards):
        sharded = next(s for s in shards if s.shard is not None)
        raise UsageError(f"cannot merge a whole campaign ({whole[0].folder}) with shards "
                         f"({sharded.folder} is shard {sharded.shard})")
    if whole:
        raise UsageError(f"{whole[0].folder} holds a whole campaign, not a shard: merge takes "
                         "the folders of `--shard K/N` runs")
    first = shards[0]
    for other in shards[1:]:
        for key in CAMPAIGN:
            if first.summary.get(key) != other.summary.get(key):
                what = CAMPAIGN_WORDS[key]
                values = "" if key in LONG else (
                    f": {shown(first.summary.get(key))} and {shown(other.summary.get(key))}")
                raise UsageError(f"{first.folder} and {other.folder} are shards of different "
                                 f"campaigns (their {what} differ{values})")
        if other.shard.count != first.shard.count:
            raise UsageError(f"{first.folder} and {other.folder} are shards of different "
                             f"campaigns: shard {first.shard} and shard {other.shard}")
    given: dict[int, ShardFolder] = {}
    for shard in shards:
        if shard.shard.index in given:
            raise UsageError(f"overlapping shards: shard {shard.shard} is both "
                             f"{given[shard.shard.index].folder} and {shard.folder}")
        given[shard.shard.index] = shard
    count = first.shard.count
    missing = [f"{k}/{count}" for k in range(1, count + 1) if k not in given]
    if missing:
        have = ", ".join(f"{k}/{count}" for k in sorted(given))
        raise UsageError(f"missing shard{'s' * (len(missing) > 1)} {', '.join(missing)} "
                         f"(given: {have}): merge needs all {count} shards of the campaign")
    if first.summary["command"] == "matrix":  # a fuzz shard's shrinking may run another's trials
        seen: dict[Key, Path] = {}
        for shard in shards:
            for key, record in shard.records().items():
                if key in seen:
                    raise UsageError(f"overlapping shards: {seen[key]} and {shard.folder} both "
                                     f"hold the trial {spell_sequence(record['sequence'])}")
                seen[key] = shard.folder


def shown(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    return "none" if value is None else str(value)


def check_merge_out(out: Path) -> None:
    """The merged folder: none, or empty; UsageError if it holds anything (saying what)."""
    if holds_results(out):
        what = "results" if any((out / name).exists() for name in ("summary.json", "trials.jsonl")) \
            else "other files"
        raise UsageError(f"--out {out} already holds {what}: give another --out")
    usable(out, "--out")
    check_step_summary()


# --- the whole campaign -------------------------------------------------------------------


def matrix_records(shards: Sequence[ShardFolder]) -> list[dict[str, Any]]:
    """Every trial of the whole work list, in its order (plan.pairs over the libraries and flags)."""
    work = plan.pairs(libraries_of(shards), flags_of(shards[0].summary))
    records = {key: record for shard in shards for key, record in shard.records().items()}
    return [records[key] for key in map(sequence_key, work) if key in records]


def flags_of(summary: Mapping[str, Any]) -> list[Flags]:
    return [Flags(mode) for mode in summary["flags"]]


def fuzz_findings(shards: Sequence[ShardFolder]) -> tuple[list[dict], list[dict]]:
    """One minimal finding per identity (the simplest the shards found), simplest first, and
    the `found` entry of each (from the shard that found it)."""
    options = plan.step_options(libraries_of(shards), flags_of(shards[0].summary))
    best: dict[Identity, tuple[TrialRecord, dict, dict]] = {}
    for shard in shards:
        found = {json.dumps(f["sequence"]): f for f in shard.summary.get("found", [])}
        for finding in shard.summary["findings"]:
            record = TrialRecord.from_json(finding, nowhere)
            identity = Identity.of(record)
            kept = best.get(identity)
            if kept is None or simplicity(record.sequence, options) < simplicity(kept[0].sequence,
                                                                                  options):
                best[identity] = (record, finding, found.get(json.dumps(finding["sequence"]), {}))
    ordered = sorted(best.values(), key=lambda kept: simplicity(kept[0].sequence, options))
    return [finding for _, finding, _ in ordered], [found for _, _, found in ordered]


def classified(findings: Sequence[dict], entries: Iterable[Mapping[str, Any]]) -> dict[str, list]:
    """"unexpected", "stale" and "expected" of the summary, by the expectations over the whole,
    and "environment": the problems of the environment, which never count (as in a campaign)."""
    typed = [TrialRecord.from_json(finding, nowhere) for finding in findings]
    as_json = {id(record): finding for record, finding in zip(typed, findings, strict=True)}
    expected, unexpected, stale, environmental = sort_findings(
        typed, map(Expectation.from_json, entries))
    environment = [as_json[id(r)] for r in environmental]
    return {"unexpected": [as_json[id(r)] for r in unexpected],
            "stale": [entry.to_json() for entry in stale],
            "expected": [{"record": as_json[id(r)], "why": entry.why} for r, entry in expected],
            "environment": environment}


def throughput(shards: Sequence[ShardFolder], trials: int) -> float | None:
    """Trials per second of the shards' wall clocks added up (comparable with one whole run,
    however the shards were scheduled); None when a shard's is unknown."""
    seconds = 0.0
    for shard in shards:
        rate, count = shard.summary.get("throughput"), shard.summary.get("trials", 0)
        if count and not rate:
            return None
        seconds += count / rate if count else 0.0
    return round(trials / seconds, 1) if seconds > 0 else None


def added(values: Iterable[Any]) -> Any:
    """Numbers summed, objects merged key by key (the same way), anything else the first one's."""
    values = list(values)
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        total = sum(values)
        return round(total, 3) if isinstance(total, float) else total
    if all(isinstance(v, Mapping) for v in values):
        keys = dict.fromkeys(k for v in values for k in v)
        return {k: added(v[k] for v in values if k in v) for k in keys}
    return values[0]


def interposition(shards: Sequence[ShardFolder], records: Sequence[dict]) -> list[dict]:
    """The pairs whose outcome differs between `global` and `local` over the whole matrix (a
    shard sees only the pairs whose two trials fell to it). The shared symbols come from a
    shard's entry, else from the two library files when they are on this machine."""
    known = {(e["first"], e["second"]): e["shared_symbols"]
             for shard in shards for e in shard.summary.get("interposition", [])}
    pairs = [r for r in records if len(r["sequence"]) == 2]
    repro = {(r["sequence"][0]["lib"], r["sequence"][1]["lib"]): r["repro"] for r in pairs}
    reader = None
    found = []
    for pair, outcomes in flags_decide((first["lib"], first["flags"], second["lib"],
                                        second["flags"], r["outcome"])
                                       for r in pairs for first, second in [r["sequence"]]).items():
        symbols = known.get(pair)
        if symbols is None:
            reader = reader or ElfReader()
            symbols = shared_symbols(reader, repro[pair])
        found.append({"first": pair[0], "second": pair[1], **outcomes, "shared_symbols": symbols})
    return found


def shared_symbols(reader: ElfReader, repro: str) -> list[str]:
    """What the two libraries of a pair's repro command (`... global:PATH global:PATH`) both
    define; nothing when their files are not here."""
    try:
        paths = [Path(word.partition(":")[2]) for word in shlex.split(repro)[-2:]]
        return list(shared_definitions(*map(reader.facts, paths)))
    except (ValueError, TypeError, BadElf):
        return []


def whole_campaign_views(shards: Sequence[ShardFolder], findings: Sequence[dict],
                         records: Sequence[dict]) -> dict[str, Any]:
    """`prediction` (the shards' tallies added) and `baseline` (compared again over the whole
    campaign, with the shards' --baseline folder) when the shards have them."""
    extra: dict[str, Any] = {}
    predictions = [shard.summary["prediction"] for shard in shards if "prediction" in shard.summary]
    if predictions and len(predictions) == len(shards):
        disagree = [d for p in predictions for d in p["disagree"]]
        extra["prediction"] = {"agree": added(p["agree"] for p in predictions),
                               "disagree_count": added(p["disagree_count"] for p in predictions),
                               "disagree": disagree[:MOST_DISAGREEMENTS]}
        if all("by_confidence" in p for p in predictions):
            extra["prediction"]["by_confidence"] = added(p["by_confidence"] for p in predictions)
    folders = {(shard.summary.get("baseline") or {}).get("folder") for shard in shards}
    if len(folders) > 1:
        raise UsageError("the shards were not compared with one and the same --baseline ("
                         + ", ".join(sorted(str(f or "none") for f in folders)) + ")")
    if (folder := folders.pop()) is not None:
        where = f"the shards' --baseline {folder} (merge compares the whole campaign with it)"
        extra["baseline"] = Baseline.read(Path(folder), where).compare(findings, records)
    return extra


def merged_summary(shards: Sequence[ShardFolder], folders: Sequence[Path], out: Path,
                   ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The summary of the whole campaign and every trial record, from its checked shards."""
    first = shards[0].summary
    if first["command"] == "matrix":
        records = matrix_records(shards)
        findings = [r for r in records if r["outcome"] != "clean"]
        extra = {"interposition": interposition(shards, records)}
    else:
        runs: dict[Key, dict[str, Any]] = {}  # each sequence once (shrinking may repeat one)
        for shard in shards:
            for key, record in shard.records().items():
                runs.setdefault(key, record)
        records = list(runs.values())
        findings, found = fuzz_findings(shards)
        seeds = {shard.summary.get("seed") for shard in shards}
        dbs = {shard.summary.get("db") for shard in shards}
        extra = {"seed": seeds.pop() if len(seeds) == 1 else None,
                 "rounds": sum(shard.summary.get("rounds", 0) for shard in shards),
                 "recalled": sum(shard.summary.get("recalled", 0) for shard in shards),
                 "max_len": first.get("max_len"), "db": dbs.pop() if len(dbs) == 1 else None,
                 "found": found,
                 # each shard's search ran on its own machine's cores, at its own time
                 "jobs": sum(shard.summary.get("jobs", 0) for shard in shards),
                 "search_s": max((shard.summary.get("search_s", 0.0) for shard in shards),
                                 default=0.0),
                 "warnings": [f"shard {shard.shard}: {warning}" for shard in shards
                              for warning in shard.summary.get("warnings", [])]}
    verdict = classified(findings, first["expectations"])
    extra |= whole_campaign_views(shards, findings, records)
    summary = {
        "target": first["target"],
        "targets": first.get("targets", []),
        "libraries": first["libraries"],
        "flags": first["flags"],
        "trials": len(records),
        "findings": findings,
        "unexpected": verdict["unexpected"],
        "stale": verdict["stale"],
        "command": first["command"],
        "version": first["version"],
        "out": str(out),
        "shard": None,
        "merged_from": [str(folder) for folder in folders],
        "expected": verdict["expected"],
        "expectations": first["expectations"],
        "preload": list(dict.fromkeys(p for shard in shards for p in shard.summary.get("preload", []))),
        "throughput": throughput(shards, len(records)),
        "disagreements": [d for shard in shards for d in shard.summary.get("disagreements", [])],
        "environment": verdict["environment"],
        "servers": added(shard.summary.get("servers", {}) for shard in shards),
        "started": min(shard.summary["started"] for shard in shards),
        "finished": max(shard.summary["finished"] for shard in shards),
        **extra,
    }
    return summary, records


def merge(folders: Sequence[Path], out: Path, fail_on: str = "unexpected",
          ) -> tuple[dict[str, Any], list[TrialRecord]]:
    """Read and check the shards' folders and `out`, then write the whole campaign into `out`:
    trials.jsonl, summary.json and every report. The summary and every record. `fail_on`
    "new" (--fail-on new): the shards must have been compared with a --baseline."""
    need_baseline = fail_on == "new"
    shards = [read_folder(folder) for folder in folders]
    check_shards(shards)
    check_counts(shards)
    if need_baseline and not all(shard.summary.get("baseline") for shard in shards):
        raise UsageError("--fail-on new: the shards were not compared with a --baseline")
    check_merge_out(out)
    shards.sort(key=lambda shard: shard.shard.index)
    try:
        summary, trials = merged_summary(shards, folders, out)
        summary["fail_on"] = fail_on
        records = [TrialRecord.from_json(record, nowhere) for record in trials]
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise UsageError(f"cannot merge: a shard's summary.json or trials.jsonl holds what "
                         f"loadfuzz never writes ({type(exc).__name__}: {exc})") from None
    # written beside `out`, then renamed into place: a stopped merge leaves nothing behind
    staging_prefix = f".{out.name}.merging-"
    scratch.sweep(out.parent, staging_prefix)  # what a merge killed by SIGKILL left there
    staging = out.parent / f"{staging_prefix}{os.getpid()}-{secrets.token_hex(4)}"
    staging.mkdir(parents=True)  # as --out itself would be made (mkdtemp's would be private: 0700)
    owner = scratch.hold(staging)
    try:
        folder = ResultsFolder(staging, False, nowhere, resumable=False)
        folder.open()
        try:
            for record in records:
                folder.append(record)
        finally:
            folder.close()
        folder.write_reports(summary, records,
                             per="pair" if summary["command"] == "matrix" else "finding")
        (staging / LOCK).unlink()
        place(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(owner)
    return summary, records


def place(staging: Path, out: Path) -> None:
    """Rename the merged folder to `out`, which may be an empty folder (or hold a lock only)."""
    with contextlib.suppress(FileNotFoundError):
        (out / LOCK).unlink()
    try:
        os.rename(staging, out)
    except OSError as exc:  # another merge into `out` finished first
        raise UsageError(f"--out {out} already holds results: give another --out "
                         f"({exc.strerror})") from None
