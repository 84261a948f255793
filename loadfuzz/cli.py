"""The command line: parse arguments, check every input, run the pipeline, print, exit.

Exit status: 0 nothing unexpected, 1 something unexpected (repro: not
reproduced), 2 bad usage or bad input, reported as one line on stderr. All
input is checked before anything is written, so bad input writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from loadfuzz import api, inventory, plan, predict, scan
from loadfuzz.campaign import (
    Campaign,
    Progress,
    ResultsFolder,
    default_out,
    exit_status,
    run_work,
    summarize,
    utc_now,
    write_results,
)
from loadfuzz.execute import Limits
from loadfuzz.expect import Expectation, load_expectations
from loadfuzz.model import Flags, Outcome, Step, TrialRecord, UsageError
from loadfuzz.trial import Trials

EXAMPLES = {
    "scan": """examples:
  loadfuzz scan executorch
  loadfuzz scan executorch --add build/fixtures/legacy/libquantized_ops_legacy_plugin.so --json
  loadfuzz scan dist/mypkg-1.0-cp311-cp311-linux_x86_64.whl""",
    "run": """examples:
  loadfuzz run --json .venv/lib/python3.11/site-packages/executorch/lib/libexecutorch.so
  loadfuzz run --target executorch lib/libexecutorch_kernels_quantized.so local:extra/plugin.so
  loadfuzz run --target executorch lib/libexecutorch_etdump.so \\
      py:extension/pybindings/_C.cpython-311-x86_64-linux-gnu.so""",
    "matrix": """examples:
  loadfuzz matrix executorch --add build/fixtures/legacy/libquantized_ops_legacy_plugin.so \\
      --expect results/expectations/executorch.toml
  loadfuzz matrix executorch --select 'lib/*' --flags global --json
  loadfuzz matrix executorch --shard 2/3 --out results/ci/shard-2""",
    "fuzz": """examples:
  loadfuzz fuzz build/fixtures/corpus --budget 60s --seed 1
  loadfuzz fuzz executorch --add plugin.so --budget 10m --max-len 5 --db results/.hypothesis""",
    "repro": """examples:
  loadfuzz repro "Re-registering quantized_decomposed::add.out" executorch --add plugin.so
  loadfuzz repro --log crash.log executorch""",
}


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.removeprefix("loadfuzz").strip()
        raise UsageError(f"{command}: {message}" if command else message)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than zero: {text!r}")
    return value


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text!r}")
    return int(text)


def flags_list(text: str) -> tuple[Flags, ...]:
    try:
        return Flags.parse_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> Parser:
    parser = Parser(prog="loadfuzz", description="Process-isolated load-order fuzzer for the "
                    "native libraries that Python wheels ship.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    def command(name: str, help_text: str) -> Parser:
        return commands.add_parser(name, help=help_text, description=help_text,
                                   epilog=EXAMPLES[name],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)

    def limits(sub: Parser) -> None:
        sub.add_argument("--timeout", type=positive_float, default=10.0, metavar="S",
                         help="time limit of one step, in seconds (default 10)")
        sub.add_argument("--mem", type=positive_int, default=Limits().mem_mb, metavar="MB",
                         help="memory ceiling (RLIMIT_AS) of a trial in MiB")
        sub.add_argument("--at-exit", action="store_true",
                         help="end trials with exit(), running destructors (slower)")
        sub.add_argument("--cold", action="store_true",
                         help="one fresh process per trial, no fork server")

    def target(sub: Parser, campaign: bool = True) -> None:
        sub.add_argument("target", metavar="TARGET",
                         help="a .whl, a directory, or an installed distribution's name")
        sub.add_argument("--add", action="append", default=[], type=Path, metavar="LIB",
                         help="an extra library (id extra/<file name>); repeatable")
        if campaign:
            sub.add_argument("--select", action="append", default=[], metavar="GLOB",
                             help="only the libraries whose id matches; repeatable")
            sub.add_argument("--flags", type=flags_list, default=(Flags.GLOBAL, Flags.LOCAL),
                             metavar="MODES", help="flags modes, e.g. global,local (default)")
            sub.add_argument("--expect", type=Path, metavar="FILE",
                             help="expectations file (TOML) of accepted findings")
            sub.add_argument("--shard", type=plan.Shard.parse, default=plan.WHOLE,
                             metavar="K/N", help="run only the K-th of N slices of the work")
            sub.add_argument("--jobs", type=positive_int, default=os.cpu_count() or 1,
                             metavar="N", help="trials run at once (default: the cores)")
        sub.add_argument("--out", type=Path, metavar="DIR", help="results folder")
        sub.add_argument("--json", action="store_true", help="print JSON")
        limits(sub)

    sub = command("scan", "Inventory a target and predict which load orders collide.")
    sub.add_argument("target", metavar="TARGET")
    sub.add_argument("--add", action="append", default=[], type=Path, metavar="LIB")
    sub.add_argument("--json", action="store_true")

    sub = command("run", "Run one load order in a fresh, isolated process.")
    sub.add_argument("steps", nargs="+", metavar="STEP",
                     help="a library path (or id, with --target); global:/local: prefix sets "
                          "its flags; py:PATH imports a Python extension module")
    sub.add_argument("--target", metavar="TARGET")
    sub.add_argument("--flags", type=flags_list, default=(Flags.GLOBAL,), metavar="MODE",
                     help="flags of steps without a prefix (default global)")
    sub.add_argument("--json", action="store_true")
    limits(sub)

    sub = command("matrix", "Run both load orders of every pair of libraries.")
    target(sub)
    sub.add_argument("--resume", action="store_true",
                     help="continue the campaign in --out, skipping recorded trials")

    sub = command("fuzz", "Explore long load orders with Hypothesis; shrink each failure.")
    target(sub)
    sub.add_argument("--budget", type=plan.parse_budget, default=600.0, metavar="TIME",
                     help="wall-clock budget, e.g. 60s, 10m (default 10m)")
    sub.add_argument("--max-len", type=positive_int, default=4, metavar="N")
    sub.add_argument("--seed", type=int, metavar="N")
    sub.add_argument("--db", type=Path, default=Path("results/.hypothesis"), metavar="DIR")

    sub = command("repro", "Reproduce a reported abort from its message or a log.")
    sub.add_argument("message", nargs="?", metavar="MESSAGE")
    sub.add_argument("--log", type=Path, metavar="FILE")
    target(sub, campaign=False)
    return parser


# --- shared set-up -------------------------------------------------------------


def load_inventory(args: argparse.Namespace) -> inventory.Inventory:
    return inventory.load_target(args.target, args.add)


def limits_of(args: argparse.Namespace) -> Limits:
    return Limits(timeout_s=args.timeout, mem_mb=args.mem, at_exit=args.at_exit)


def trials_for(inv: inventory.Inventory, libs: Sequence[inventory.Library],
               args: argparse.Namespace) -> Trials:
    needs_python, preload = plan.trial_hooks(inv.libraries, libs)
    return Trials(limits_of(args), needs_python, preload=() if args.cold else preload,
                  cold=args.cold)


def expectations_of(args: argparse.Namespace) -> tuple[Expectation, ...]:
    return load_expectations(args.expect) if args.expect else ()


MARKS = {"clean": ".", "reregister": "R", "abort": "A", "crash": "C", "load-error": "L",
         "exit": "E", "timeout": "T"}


def matrix_text(summary: dict, records: Sequence[TrialRecord]) -> str:
    """The pair matrix on a terminal: one grid per flags mode, rows first, columns second."""
    libs = summary["libraries"]
    cells = {(r.sequence[0].lib, r.sequence[1].lib, r.sequence[0].flags.value): r.outcome.value
             for r in records if len(r.sequence) == 2}
    lines = []
    for mode in summary["flags"]:
        lines.append(f"{mode}: row = loaded first, column = loaded second "
                     "(. clean, R reregister, A abort, C crash, L load-error, E exit, T timeout)")
        lines.append("     " + "".join(f"{n % 100:>3}" for n in range(len(libs))))
        for row, first in enumerate(libs):
            marks = [" " if first == second else MARKS.get(cells.get((first, second, mode), ""), "?")
                     for second in libs]
            lines.append(f"{row:>3}  " + "".join(f"{m:>3}" for m in marks) + f"  {first}")
    return "\n".join(lines)


def print_summary(summary: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=2, ensure_ascii=False))
        return
    findings, unexpected = summary["findings"], summary["unexpected"]
    print(f"{summary['command']} {summary['target']}: {summary['trials']} trials, "
          f"{len(findings)} findings, {len(unexpected)} unexpected, "
          f"{len(summary['stale'])} stale expectations")
    if summary.get("throughput"):
        print(f"throughput: {summary['throughput']} trials/s")
    for record in findings:
        mark = "UNEXPECTED" if record in unexpected else "expected  "
        seq = " -> ".join(f"{s['lib']}@{s['flags']}" for s in record["sequence"])
        what = record["signature"] or record["outcome"]
        print(f"  {mark} {record['outcome']:<10} {seq}  [{what}{' ' + record['op'] if record['op'] else ''}]")
    for entry in summary.get("interposition", []):
        print(f"  flags matter: {entry['first']} -> {entry['second']}: global {entry['global']}, "
              f"local {entry['local']}; both define {', '.join(entry['shared_symbols']) or '-'}")
    for entry in summary["stale"]:
        print(f"  stale expectation: {entry['first']} x {entry['second']} ({entry['source']})")
    print(f"report: {Path(summary['out']) / 'report.md'}  (matrix.html, junit.xml, repro/)")


# --- the commands --------------------------------------------------------------


def cmd_scan(args: argparse.Namespace) -> int:
    inv = load_inventory(args)
    predictions = predict.predict(inv)
    if args.json:
        print(json.dumps(scan.scan_json(inv, predictions), indent=2, ensure_ascii=False))
    else:
        print(scan.scan_text(inv, predictions))
    return 0


def describe_run(record: TrialRecord) -> str:
    lines = []
    for index, step in enumerate(record.sequence):
        state = "done"
        if record.step == index:
            state = f"<- {record.outcome.value}"
        elif record.step is not None and index > record.step:
            state = "not reached"
        lines.append(f"step {index}  {step.kind.value:<6} {step.flags.value:<6} {step.lib}  {state}")
    lines.append(f"outcome: {record.outcome.value}"
                 + (f"  signature: {record.signature}" if record.signature else "")
                 + (f"  op: {record.op}" if record.op else ""))
    lines.append(f"detail: {record.detail}")
    lines.append(f"time: {record.duration_s:.3f} s, peak RSS {record.peak_rss_mb:.1f} MB")
    lines.append(f"repro: {record.repro}")
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    inv = inventory.load_target(args.target) if args.target else None
    seq = tuple(api.parse_step(text, args.flags[0], inv) for text in args.steps)
    python = api.needing_python(seq, inv)

    def needs_python(steps: Sequence[Step]) -> bool:
        return any(step.path.resolve() in python for step in steps)

    with Trials(limits_of(args), needs_python, cold=True) as trials:
        record = trials.run(seq)
    print(json.dumps(record.to_json(), indent=2, ensure_ascii=False) if args.json
          else describe_run(record))
    return 0 if record.outcome is Outcome.CLEAN else 1


def cmd_matrix(args: argparse.Namespace) -> int:
    inv = load_inventory(args)
    libs = inv.select(args.select)
    expectations = expectations_of(args)
    if args.resume and args.out is None:
        raise UsageError("--resume needs --out DIR, the folder of the campaign to continue")
    out = args.out or default_out(inv.name, inv.version)
    folder = ResultsFolder(out, args.resume, inv.locate)
    work = args.shard.take(plan.pairs([(lib.id, lib.path) for lib in libs], args.flags))
    campaign = Campaign("matrix", inv.target, inv.name, inv.version,
                        tuple(lib.id for lib in libs), args.flags, expectations, out,
                        shard=None if args.shard == plan.WHOLE else str(args.shard))
    started, clock = utc_now(), time.monotonic()
    folder.open()
    try:
        with trials_for(inv, libs, args) as trials:
            records = run_work(work, trials, folder, args.jobs,
                               Progress(len(work), "matrix"))
            findings = [r for r in records if not r.clean]
            campaign.extra["interposition"] = predict.interposition(inv, records)
            summary = summarize(campaign, records, findings, trials, started,
                                time.monotonic() - clock)
    except KeyboardInterrupt:
        print(f"interrupted: finished trials are in {folder.trials_path}; continue with "
              f"--resume --out {out}", file=sys.stderr)
        return 130
    finally:
        folder.close()
    write_results(folder, summary, records, per="pair")
    if not args.json:
        print(matrix_text(summary, records))
    print_summary(summary, args.json)
    return exit_status(summary)


def cmd_fuzz(args: argparse.Namespace) -> int:
    from loadfuzz import fuzz

    return fuzz.command(args)


def cmd_repro(args: argparse.Namespace) -> int:
    from loadfuzz import repro

    return repro.command(args)


COMMANDS = {"scan": cmd_scan, "run": cmd_run, "matrix": cmd_matrix, "fuzz": cmd_fuzz,
            "repro": cmd_repro}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"loadfuzz: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
