"""One function per command: turn the parsed arguments into settings, run the stage, print.

Each returns the exit status: 0 nothing unexpected, 1 something unexpected
(repro: not reproduced). Every input is checked (`campaign.prepare`) before
anything is written.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadfuzz.cli import printing
from loadfuzz.cli.parser import too_long
from loadfuzz.cli.printing import Progress
from loadfuzz.model import Outcome, UsageError
from loadfuzz.report.view import visible

# What a command needs is imported inside it: `scan` must not pay for Hypothesis, the
# campaign, the reports, the harness pool or pyelftools (the start-up of every command is
# what a warm `scan` costs).
if TYPE_CHECKING:
    from loadfuzz.campaign import Prepared
    from loadfuzz.derived import Consulted, DerivedCache
    from loadfuzz.run.harness import Limits
    from loadfuzz.settings import CampaignSettings


def limits_of(args: argparse.Namespace) -> Limits:
    from loadfuzz.run.harness import Limits

    mem = {} if args.mem is None else {"mem_mb": args.mem}  # None: the default ceiling
    return Limits(timeout_s=args.timeout, at_exit=args.at_exit, **mem)


def campaign_settings(args: argparse.Namespace, targets: list[str] | None = None,
                      ) -> CampaignSettings:
    """The settings every campaign command shares, from its arguments."""
    from loadfuzz.settings import CampaignSettings, RunSettings, TargetSpec

    defaults = CampaignSettings(TargetSpec(()))
    return CampaignSettings(
        target=TargetSpec(tuple(args.targets if targets is None else targets), tuple(args.add),
                          tuple(getattr(args, "select", ())), tuple(getattr(args, "exclude", ())),
                          args.env),
        run=RunSettings(limits_of(args), args.cold, getattr(args, "jobs", defaults.run.jobs)),
        flags=getattr(args, "flags", defaults.flags),
        expect=getattr(args, "expect", None),
        out=args.out,
        resume=getattr(args, "resume", False),
        shard=getattr(args, "shard", defaults.shard),
        invocation=tuple(args.invocation),
        fail_on=getattr(args, "fail_on", "unexpected"),
    )


class CouldNotFinish(Exception):
    """A campaign failed for a reason of loadfuzz's own; its results folder gets error.log."""

    def __init__(self, folder: Path, what: str | None = None):
        super().__init__(what or f"the campaign in {folder} could not finish")
        self.folder = folder
        self.what = what  # the one line to show instead of the cause's own words


@contextmanager
def failing_into(campaign: Prepared) -> Iterator[None]:
    """Any failure that is not bad input nor a stop becomes CouldNotFinish of this campaign;
    a results folder that cannot take more says so, and how to go on."""
    from loadfuzz.results import FULL_OR_READ_ONLY

    try:
        yield
    except (UsageError, KeyboardInterrupt, BrokenPipeError):  # the reader of stdout went away
        raise
    except OSError as exc:
        if exc.errno not in FULL_OR_READ_ONLY:
            raise CouldNotFinish(campaign.out) from exc
        then = f"continue with: {campaign.resume_command()}" if campaign.resume_command() else (
            "run it again with another --out")  # (this one holds results: it would be refused)
        raise CouldNotFinish(campaign.out, f"cannot write the results folder {campaign.out}: "
                             f"{exc.strerror}; the finished trials are kept in "
                             f"{campaign.folder.trials_path}; make room, then {then}") from exc
    except Exception as exc:
        raise CouldNotFinish(campaign.out) from exc


def interrupted(campaign: Prepared, stop: KeyboardInterrupt) -> int:
    """The line a stopped campaign leaves, and its exit status (128 + the signal)."""
    from loadfuzz.model import Stopped
    from loadfuzz.results import read_summary

    signum = stop.signum if isinstance(stop, Stopped) else signal.SIGINT
    if not campaign.folder.trials_path.exists():  # stopped before the folder was taken
        print(f"stopped by {signal.Signals(signum).name} before the first trial: nothing was "
              f"written to {campaign.out}", file=sys.stderr)
        return 128 + signum
    name = signal.Signals(signum).name
    # summary.json is written last: then every report agrees with it; none was written when
    # the stop came first (or a full disk)
    written = read_summary(campaign.out)
    finished = written is not None and not written.get("incomplete")
    summary = campaign.out / "summary.json" if written is not None else None
    if finished:  # the stop came as the last file was written
        print(f"stopped by {name} once the campaign had finished: its results are in "
              f"{campaign.out}", file=sys.stderr)
        return 128 + signum
    resume = campaign.resume_command()
    how = f"; continue with: {resume}" if resume else ""
    partial, report = "", campaign.out / "report.md"  # (repro writes no report)
    if summary is not None:
        partial = f", a partial report in {report}" if report.exists() else (
            f", a partial summary in {summary}")
    print(f"stopped by {name}: the finished trials are in "
          f"{campaign.folder.trials_path}{partial}{how}", file=sys.stderr)
    return 128 + signum


def scan_output(args: argparse.Namespace, consulted: Consulted, cache: DerivedCache,
                started_ns: int) -> tuple[str, str]:
    """What `scan` prints, as JSON and as text, read from the files (noted in `consulted`).
    The inventory is kept too: a campaign on the same targets starts from it."""
    from loadfuzz import inventory, inventory_cache, predict

    inv = inventory.load_targets(args.targets, args.add, args.env, consulted=consulted)
    inventory_cache.keep(cache, args.targets, args.add, args.env, consulted, started_ns, inv)
    predictions = predict.predict(inv)
    return (printing.json_text(printing.scan_json(inv, predictions)),
            printing.scan_text(inv, predictions))


def prepared(settings: CampaignSettings, command: str, **options: Any) -> Prepared:
    """`campaign.prepare`, then what reading the target skipped (a file that is no ELF
    library), one warning line each on stderr, as `scan` says it."""
    from loadfuzz.campaign import prepare

    campaign = prepare(settings, command, **options)
    for warning in campaign.inv.warnings:
        print(f"loadfuzz: warning: {visible(warning)}", file=sys.stderr)
    return campaign


def cmd_scan(args: argparse.Namespace) -> int:
    """The output comes from the derived cache while no file it was read from has changed."""
    from loadfuzz.derived import Consulted, DerivedCache

    cache = DerivedCache.default()
    key = cache.key("scan", (tuple(args.targets), tuple(str(p) for p in args.add), args.env))
    output = cache.get(key)
    if not (isinstance(output, tuple) and len(output) == 2
            and all(isinstance(text, str) for text in output)):
        started, consulted = time.time_ns(), Consulted()
        output = scan_output(args, consulted, cache, started)
        cache.keep(key, consulted, started, output)
    print(output[0] if args.json else output[1])
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from loadfuzz import api

    seq, names = api.load_order(args.target, args.steps, args.flags[0])
    record = api.run_cold(seq, limits_of(args), names)
    if args.json:
        printing.print_json(record.to_json())
    else:
        print(printing.describe_run(record))
    return 0 if record.outcome is Outcome.CLEAN else 1


def cmd_matrix(args: argparse.Namespace) -> int:
    from loadfuzz.baseline import check_fail_on
    from loadfuzz.run import ahead
    from loadfuzz.settings import check_input

    check_fail_on(args.fail_on, args.baseline)
    settings = campaign_settings(args)
    checked = check_input(settings, "matrix", args.baseline)  # before any server starts
    pool = ahead.start("matrix", settings)  # they start while the target is read
    try:
        from loadfuzz.campaign import exit_status, run_matrix

        campaign = prepared(settings, "matrix", baseline=args.baseline, checked=checked)
        try:
            with failing_into(campaign):
                summary, records = run_matrix(campaign, Progress("matrix"), pool)
        except KeyboardInterrupt as stop:
            return interrupted(campaign, stop)
    finally:
        pool.close()
    ahead.remember("matrix", settings, pool)
    if args.json:
        printing.print_json(summary)
    else:
        print(printing.matrix_text(summary, records))
        printing.print_summary(summary)
    return exit_status(summary, args.fail_on)


def cmd_fuzz(args: argparse.Namespace) -> int:
    from loadfuzz.baseline import check_fail_on
    from loadfuzz.campaign import exit_status
    from loadfuzz.search import fuzz

    check_fail_on(args.fail_on, args.baseline)
    options = fuzz.FuzzOptions(args.budget, args.max_len, args.seed, args.db)
    fuzz.db_folder(args.db)
    campaign = prepared(campaign_settings(args), "fuzz", baseline=args.baseline)
    try:
        with failing_into(campaign):
            summary, _ = fuzz.run_fuzz(campaign, options, Progress("fuzz"))
    except KeyboardInterrupt as stop:
        return interrupted(campaign, stop)
    for warning in summary["warnings"]:
        print(f"loadfuzz: warning: {visible(warning)}", file=sys.stderr)
    if args.json:
        printing.print_json(summary)
    else:
        printing.print_summary(summary)
    return exit_status(summary, args.fail_on)


def message_of(args: argparse.Namespace) -> tuple[str, list[str]]:
    """repro's input: the message (its first word, or --log's text; `-` for either: stdin)
    and the targets."""
    if args.log is None:
        if not args.words:
            raise UsageError("give either a MESSAGE or --log FILE")
        if args.words[0] != "-":
            if not too_long(args.words[0]) and Path(args.words[0]).is_file():
                # `repro crash.log TARGET`: looked for as text
                raise UsageError(f"the message {args.words[0]!r} names a file: to read a log, "
                                 f"give --log {args.words[0]}")
            return args.words[0], args.words[1:]
        args.log, args.words = Path("-"), args.words[1:]  # `-` as MESSAGE: as `--log -`
    if len(args.words) > 1:  # a message beside --log reads as a first target that is none
        from loadfuzz import targets

        try:
            targets.locate(args.words[0])
        except UsageError:
            word = args.words[0]
            if "/" in word and not any(c.isspace() for c in word):
                raise  # a path, mistyped: a target that is not there, as without --log
            raise UsageError("give either a MESSAGE or --log FILE (not both)") from None
    if str(args.log) == "-":
        return log_text(sys.stdin.buffer.read(), "the log on stdin"), args.words
    try:
        return log_text(args.log.read_bytes(), f"--log {args.log}"), args.words
    except OSError as exc:
        raise UsageError(f"--log {args.log}: {exc.strerror or exc}") from None


def log_text(data: bytes, what: str) -> str:
    """A log's text; UsageError for a binary file (a NUL byte: an executable, a core file), whose
    bytes would be printed and looked for as a message. utf-8-sig: a byte order mark (as some
    editors save a log) would hide the first line's time stamp from `repro.unprefixed`."""
    if b"\0" in data:
        raise UsageError(f"{what} is no text log (it holds NUL bytes): give the log the crash "
                         "was written to")
    return data.decode("utf-8-sig", "replace")


def cmd_repro(args: argparse.Namespace) -> int:
    from loadfuzz.search import repro

    text, targets = message_of(args)
    message = repro.read_message(text)
    campaign = prepared(campaign_settings(args, targets), "repro", suffix="-repro")
    try:
        with failing_into(campaign):
            result = repro.reproduce(campaign, message, Progress("repro"))
    except KeyboardInterrupt as stop:
        return interrupted(campaign, stop)
    if args.json:
        printing.print_json(result)
    else:
        printing.print_repro(result, campaign.inv)
    return 0 if result["reproduced"] else 1


def cmd_merge(args: argparse.Namespace) -> int:
    from loadfuzz import merge
    from loadfuzz.campaign import exit_status

    summary, records = merge.merge(args.folders, args.out, fail_on=args.fail_on)
    if args.json:
        printing.print_json(summary)
    else:
        if summary["command"] == "matrix":
            print(printing.matrix_text(summary, records))
        printing.print_summary(summary)
    return exit_status(summary, args.fail_on)


COMMANDS = {"scan": cmd_scan, "run": cmd_run, "matrix": cmd_matrix, "fuzz": cmd_fuzz,
            "repro": cmd_repro, "merge": cmd_merge}
