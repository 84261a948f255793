"""The command line's grammar: every command, its options and their types, and the examples.

A usage error is one line and exit status 2 (`Parser.error` raises UsageError).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from loadfuzz import hostenv
from loadfuzz.baseline import FAIL_ON
from loadfuzz.model import DEFAULT_MEM_MB, MAX_TIMEOUT_S, MIN_TIMEOUT_S, Flags, UsageError
from loadfuzz.plan import WHOLE, Shard

EXAMPLES = {
    "scan": """examples:
  loadfuzz scan executorch
  loadfuzz scan executorch --add build/fixtures/legacy/libquantized_ops_legacy_plugin.so --json
  loadfuzz scan dist/mypkg-1.0-cp311-cp311-linux_x86_64.whl
  loadfuzz scan executorch torch
  loadfuzz scan --env --json""",
    "run": """examples:
  loadfuzz run --json .venv/lib/python3.11/site-packages/executorch/lib/libexecutorch.so
  loadfuzz run --target executorch lib/libexecutorch_kernels_quantized.so local:build/plugin.so
  loadfuzz run import:torch python:build/plugin.so
  loadfuzz run --target executorch lib/libexecutorch_etdump.so \\
      py:extension/pybindings/_C.cpython-311-x86_64-linux-gnu.so""",
    "matrix": """examples:
  loadfuzz matrix executorch --add build/fixtures/legacy/libquantized_ops_legacy_plugin.so \\
      --expect results/expectations/executorch.toml
  loadfuzz matrix executorch --select 'lib/*' --flags global --json
  loadfuzz matrix executorch --shard 2/3 --out results/ci/shard-2
  loadfuzz matrix executorch --baseline results/executorch-1.4.1/20250101T000000Z --fail-on new""",
    "fuzz": """examples:
  loadfuzz fuzz build/fixtures/corpus --budget 60s --seed 1
  loadfuzz fuzz executorch --add plugin.so --budget 10m --max-len 5 --db results/.hypothesis""",
    "repro": """examples:
  loadfuzz repro "Re-registering quantized_decomposed::add.out" executorch --add plugin.so
  loadfuzz repro --log crash.log executorch""",
    "merge": """examples:
  loadfuzz merge results/ci/shard-1 results/ci/shard-2 results/ci/shard-3 --out results/ci/all""",
}


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.removeprefix("loadfuzz").strip()
        raise UsageError(f"{command}: {message}" if command else message)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        """A command's words may come after its options (`matrix torch --flags global
        executorch`, `repro MESSAGE --log FILE TARGET`): plain argparse fills a positional
        list from one run of words only and calls the rest unrecognized."""
        if self._subparsers is not None or getattr(self, "_intermixing", False):
            return super().parse_known_args(args, namespace)
        self._intermixing = True  # parse_known_intermixed_args calls back into this method
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


class Once(argparse.Action):
    """An option that names a file whose every entry counts (--expect, --baseline, --log,
    --out, --db): given twice it is an error, where argparse would keep the last silently (a
    release job that passes two expectations files would lose the first without a word)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option: str | None = None) -> None:
        if getattr(namespace, f"_{self.dest}_given", False):
            parser.error(f"{option} given twice: give it once")
        setattr(namespace, f"_{self.dest}_given", True)
        setattr(namespace, self.dest, values)


# The largest --mem, in MiB (a PiB): far past any machine, far from a 64-bit byte count's end.
MAX_MEM_MB = 1 << 30
# More trials at once than any machine has cores for (each is a process and pipes of its own).
MAX_JOBS = 4096


def seconds(text: str) -> float:
    """A step's time limit in seconds: a millisecond at least, a week at most (not nan)."""
    try:
        if "_" in text:  # Python's 1_0 is no number as people write them
            raise ValueError(text)
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not MIN_TIMEOUT_S <= value <= MAX_TIMEOUT_S:  # also false for nan
        raise argparse.ArgumentTypeError(f"must be at least {MIN_TIMEOUT_S} and at most {MAX_TIMEOUT_S} "
                                         f"(a week): {text!r}")
    return value


def positive_int(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text!r}")
    return int(text)


def jobs(text: str) -> int:
    """How many trials at once: a positive whole number, at most MAX_JOBS."""
    value = positive_int(text)
    if value > MAX_JOBS:
        raise argparse.ArgumentTypeError(f"at most {MAX_JOBS}: {text!r}")
    return value


def a_path(text: str) -> Path:
    """A file's or a folder's path; an empty word is refused (Path('') would be the working
    folder), and so is one no file system takes (see `too_long`)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    if too_long(text):
        raise argparse.ArgumentTypeError(too_long_message(text))
    return Path(text)


NAME_MAX, PATH_MAX = 255, 4096  # Linux's limits, in bytes: of one name, and of a whole path


def too_long_message(text: str) -> str:
    return f"a name longer than a file system allows: {text[:60]!r}..."


def too_long(text: str) -> bool:
    """Whether no Linux file system could hold this path (ENAMETOOLONG)."""
    encoded = os.fsencode(text)
    return len(encoded) >= PATH_MAX or any(len(part) > NAME_MAX for part in encoded.split(b"/"))


def megabytes(text: str) -> int:
    """A memory ceiling in MiB, at most MAX_MEM_MB (the harness shifts it into bytes)."""
    value = positive_int(text)
    if value > MAX_MEM_MB:
        raise argparse.ArgumentTypeError(f"at most {MAX_MEM_MB} (a PiB): {text!r}")
    return value


def flags_list(text: str) -> tuple[Flags, ...]:
    try:
        return Flags.parse_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def budget(text: str) -> float:
    """`90`, `90s`, `10m`, `1h30m` -> seconds. Raises UsageError itself, so that the message
    names the option the way users write it (argparse would prefix its own words)."""
    found = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*",
                         text)
    if not text.strip() or not found or not any(found.groups()):
        raise UsageError(f"bad --budget {text!r}: expected a duration such as 60s, 10m or 1h")
    if (found[1] or found[2]) and found[3] and not text.rstrip().endswith("s"):
        unit = "m" if found[2] is None else "s"  # 1h30 reads as 1h30m to a person, 1h30s here
        raise UsageError(f"bad --budget {text!r}: give the last number its unit "
                         f"({text.strip()}{unit}?)")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in found.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise UsageError(f"bad --budget {text!r}: it must be more than zero")
    return total


def build_parser() -> Parser:
    parser = Parser(prog="loadfuzz", description="Process-isolated load-order fuzzer for the "
                    "native libraries that Python wheels ship.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    def command(name: str, help_text: str) -> Parser:
        return commands.add_parser(name, help=help_text, description=help_text,
                                   epilog=EXAMPLES[name],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)

    def limits(sub: Parser) -> None:
        sub.add_argument("--timeout", type=seconds, default=10.0, metavar="S",
                         help="time limit of one step, in seconds (default 10)")
        sub.add_argument("--mem", type=megabytes, metavar="MB",  # default: Limits()'s
                         help=f"memory ceiling (RLIMIT_AS) of a trial in MiB "
                              f"(default {DEFAULT_MEM_MB})")
        sub.add_argument("--at-exit", action="store_true",
                         help="end trials with exit(), running destructors (slower)")
        sub.add_argument("--cold", action="store_true",
                         help="one fresh process per trial, no fork server")

    def targets(sub: Parser, positional: bool = True) -> None:
        if positional:
            sub.add_argument("targets", nargs="*", metavar="TARGET",
                             help="a .whl, a directory, a .so, or an installed distribution's "
                                  "name; several make one campaign (ids "
                                  "<name>-<version>/<path>)")
        sub.add_argument("--env", action="store_true",
                         help="every installed distribution that ships shared libraries")
        sub.add_argument("--add", action="append", default=[], type=a_path, metavar="LIB",
                         help="an extra library (id extra/<file name>); repeatable")

    def target(sub: Parser, campaign: bool = True, positional: bool = True,
               jobs_help: str = "trials run at once (default: the cores)") -> None:
        targets(sub, positional)
        if campaign:
            sub.add_argument("--select", action="append", default=[], metavar="GLOB",
                             help="only the libraries whose id matches; repeatable")
            sub.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                             help="not the libraries whose id matches; repeatable")
            sub.add_argument("--flags", type=flags_list, default=(Flags.GLOBAL, Flags.LOCAL),
                             metavar="MODES", help="flags modes, e.g. global,local (default)")
            sub.add_argument("--expect", type=a_path, action=Once, metavar="FILE",
                             help="expectations file (TOML) of accepted findings")
            sub.add_argument("--shard", type=Shard.parse, default=WHOLE,
                             metavar="K/N", help="run only the K-th of N slices of the work")
            sub.add_argument("--jobs", type=jobs, default=hostenv.usable_cores(), metavar="N",
                             help=jobs_help)
            sub.add_argument("--baseline", type=a_path, action=Once, metavar="RESULTS_FOLDER",
                             help="an earlier campaign's results folder: report the findings "
                                  "new, gone and still there since")
            sub.add_argument("--fail-on", choices=FAIL_ON, default="unexpected",
                             help="exit 1 on any unexpected finding (default), or only on an "
                                  "unexpected one that is new since --baseline")
        sub.add_argument("--out", type=a_path, action=Once, metavar="DIR", help="results folder")
        sub.add_argument("--json", action="store_true", help="print JSON")
        limits(sub)

    sub = command("scan", "Inventory targets and predict which load orders collide.")
    targets(sub)
    sub.add_argument("--json", action="store_true", help="print JSON")

    sub = command("run", "Run one load order in a fresh, isolated process.")
    sub.add_argument("steps", nargs="+", metavar="STEP",
                     help="a library path (or id, with --target); a global:, local: or "
                          "python: prefix sets how it is loaded; py:PATH imports a Python "
                          "extension module by file, import:NAME a module by name")
    sub.add_argument("--target", metavar="TARGET",
                     help="where STEP ids are looked up (a .whl, directory or distribution)")
    sub.add_argument("--flags", type=flags_list, default=(Flags.GLOBAL,), metavar="MODE",
                     help="flags of steps without a prefix (default global)")
    sub.add_argument("--json", action="store_true", help="print JSON")
    limits(sub)

    sub = command("matrix", "Run both load orders of every pair of libraries.")
    target(sub)
    sub.add_argument("--resume", action="store_true",
                     help="continue the campaign in --out, skipping recorded trials")

    sub = command("fuzz", "Explore long load orders with Hypothesis; shrink each failure.")
    target(sub, jobs_help="search processes, each with its own fork servers (default: the cores)")
    sub.add_argument("--budget", type=budget, default=600.0, metavar="TIME",
                     help="wall-clock budget, e.g. 60s, 10m (default 10m)")
    sub.add_argument("--max-len", type=positive_int, default=4, metavar="N",
                     help="longest sequence tried, in steps (default 4)")
    sub.add_argument("--seed", type=int, metavar="N",
                     help="seed of the search, to repeat a campaign (default: one drawn at "
                          "random, reported in the summary)")
    sub.add_argument("--db", type=a_path, action=Once, default=Path("results/.hypothesis"), metavar="DIR",
                     help="example database: findings kept across campaigns and replayed "
                          "first (default results/.hypothesis)")

    sub = command("repro", "Reproduce a reported abort from its message or a log.")
    sub.add_argument("words", nargs="*", metavar="[MESSAGE] TARGET",
                     help="the abort line (unless --log; `-`: as --log -), then the target(s)")
    sub.add_argument("--log", type=a_path, action=Once, metavar="FILE",
                     help="a crash log holding the message (the catalogue's signatures are "
                          "tried against its whole text); `-`: read it from stdin")
    target(sub, campaign=False, positional=False)
    sub.add_argument("--jobs", type=jobs, default=hostenv.usable_cores(), metavar="N",
                     help="orders tried at once (default: the cores); the first that "
                          "reproduces, in the order tried, is kept either way")

    sub = command("merge", "Merge the results folders of the shards of one campaign into one.")
    sub.add_argument("folders", nargs="+", type=a_path, metavar="DIR",
                     help="the results folder of each shard (--shard K/N) of the campaign")
    sub.add_argument("--out", type=a_path, action=Once, required=True, metavar="DIR",
                     help="results folder of the whole campaign (must not hold results)")
    sub.add_argument("--json", action="store_true", help="print the merged summary as JSON")
    sub.add_argument("--fail-on", choices=FAIL_ON, default="unexpected",
                     help="as the shards' --fail-on: exit 1 on any unexpected finding (default), "
                          "or only on one new since their --baseline")
    return parser
