"""Bench: what users wait for, the whole loadfuzz command, against the plain way on every core.

    .venv/bin/python tools/bench.py [--only scan,executorch,torch,fuzz,scale] [--fuzz-budget 60]

Each loadfuzz time is the wall clock of `.venv/bin/loadfuzz ...` run as a
subprocess, exactly as a user types it: interpreter start-up, imports,
reading the ELF files (the ELF cache warm, as after a first run, except where
`scan` measures it cold), planning, the trials, the reports. The plain way is
what a user would otherwise run: tools/plain.c (compiled here with $CC), one
fresh process per trial (fork + exec of a tiny C loader that dlopens the
steps, RTLD_NOW), a pool of os.cpu_count() of them, nothing preloaded but
libpython (RTLD_GLOBAL, as a Python process has it) when the libraries
include Python extensions, LD_LIBRARY_PATH = torch's lib folder (as loadfuzz
sets it); it knows nothing of loadfuzz. Its time is its wall clock too; its
work list is its own (every ELF file the distribution's RECORD lists),
except where it replays the trials loadfuzz chose (fuzz, scale).

Workloads, one line each, then the floor lines and a summary block:

1. `matrix executorch --flags global`: both times (loadfuzz's the median of
   MATRIX_RUNS runs, each in a results folder of its own, as a user repeating
   the command gets them), and whether every pair's verdict is the same, in
   every run (clean / signal N / load-error / exit N / timeout);
2. `matrix torch --flags global`: the same, each plain trial pulling libtorch;
3. `fuzz executorch --budget 60s --seed 1`: loadfuzz's trials/s (its summary)
   against the plain way's on a shuffled sample of the fuzz's own trials;
4. `scan torch` in a fresh cache folder (cold), then again (warm);
5. the cost as the number of libraries grows: copies of a library that does
   nothing (scanned once, untimed, so the caches are warm), `matrix DIR
   --flags global --shard 1/K` with K keeping each run near the same number of
   trials (a shard is a run of consecutive pairs: its rows are whole, as in a
   whole campaign); the fixed cost and the rate predict a whole campaign, and
   the plain way's rate its own.

The floor is what a trial cannot cost less than on one core (tools/floor.py).
A benchmark, not a test: no timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.metadata
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLOOR = HERE / "floor.py"
PLAIN_C = HERE / "plain.c"
LOADFUZZ = Path(sys.executable).with_name("loadfuzz")
CORES = os.cpu_count() or 1
WORKLOADS = ("scan", "executorch", "torch", "fuzz", "scale")
# Runs of each loadfuzz matrix (one plain run: it takes 10-20 times longer); the median is
# reported. A run is one user's command, in a results folder of its own.
MATRIX_RUNS = 5
NOOP_C = "__attribute__((constructor)) static void ready(void) {}\nint noop(void) { return 0; }\n"


def say(text: str = "") -> None:
    print(text, flush=True)


def note(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


# --- running things -------------------------------------------------------------------


def timed(cmd: list[str], env: dict[str, str] | None = None,
          stdin: str | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """Wall-clock seconds of a command, and what it printed."""
    began = time.perf_counter()
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - began
    if done.returncode >= 2:  # 0 and 1 are answers; anything else means no result
        tail = "\n".join(done.stderr.splitlines()[-5:])
        raise SystemExit(f"bench: {' '.join(cmd[:4])} ... exited {done.returncode}:\n{tail}")
    return seconds, done


def loadfuzz(*words: str, env: dict[str, str] | None = None) -> tuple[float, int]:
    seconds, done = timed([str(LOADFUZZ), *words], env)
    return seconds, done.returncode


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- the plain way ----------------------------------------------------------------------


@dataclass
class Plain:
    """The plain harness, built in a scratch folder, and the environment its trials get."""

    binary: Path
    env: dict[str, str]
    libpython: str | None

    @classmethod
    def build(cls, scratch: Path) -> Plain:
        binary = scratch / "plain"
        cc = os.environ.get("CC") or "gcc"
        subprocess.run([cc, "-O2", "-o", str(binary), str(PLAIN_C), "-ldl"], check=True)
        path = os.pathsep.join(p for p in sys.path if p and Path(p) != HERE)  # not tools/
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(scratch), "LANG": "C.UTF-8",
               "PYTHONHOME": sys.base_prefix, "PYTHONPATH": path,
               "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        if (torch_lib := distribution_root("torch") / "torch" / "lib").is_dir():
            env["LD_LIBRARY_PATH"] = str(torch_lib)
        libdir, name = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
        libpython = str(Path(libdir) / name) if libdir and name and ".so" in name else None
        return cls(binary, env, libpython)

    def run(self, trials: list[list[str]], python: bool, budget_s: float | None = None,
            ) -> tuple[float, list[str | None]]:
        """Wall seconds for the trials (lists of `g:PATH`, `l:PATH`, `y:SOURCE`) on every core,
        and each one's verdict (None: not started within the budget)."""
        cmd = [str(self.binary), "-j", str(CORES), "-t", "10"]
        if python and self.libpython:
            cmd += ["-p", self.libpython]
        if budget_s:
            cmd += ["-b", str(budget_s)]
        lines = "".join("\t".join(steps) + "\n" for steps in trials)
        seconds, done = timed(cmd, self.env, lines)
        verdicts: list[str | None] = [None] * len(trials)
        for line in done.stdout.splitlines():
            index, verdict = line.split("\t")
            verdicts[int(index)] = verdict
        return seconds, verdicts


def distribution_root(name: str) -> Path:
    """site-packages of an installed distribution."""
    return Path(importlib.metadata.distribution(name).locate_file(""))


def distribution_libraries(name: str) -> list[Path]:
    """Every ELF shared object the distribution's RECORD lists: the plain way's own work list."""
    found = []
    for entry in importlib.metadata.distribution(name).files or ():
        path = Path(entry.locate())
        if ".so" in path.name and path.is_file() and path.read_bytes()[:4] == b"\x7fELF":
            found.append(path)
    return sorted(found)


def is_extension(path: Path) -> bool:
    return any(path.name.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES if s != ".so")


def module_of(path: Path) -> str:
    """The dotted name `import` gives an extension module under site-packages."""
    suffix = max((s for s in importlib.machinery.EXTENSION_SUFFIXES if path.name.endswith(s)), key=len)
    parts = path.relative_to(sysconfig.get_paths()["purelib"]).parts
    return ".".join([*parts[:-1], path.name[:-len(suffix)]])


class Locator:
    """loadfuzz's library ids (paths under its target's root) as absolute paths."""

    def __init__(self, paths: list[Path]):
        self.paths = paths

    def __call__(self, lib_id: str) -> Path:
        hits = [p for p in self.paths if str(p).endswith("/" + lib_id)]
        if len(hits) != 1:
            raise SystemExit(f"bench: library id {lib_id!r} names {len(hits)} of the plain way's files")
        return hits[0]


def plain_step(step: dict, locate: Locator) -> str | None:
    """One step of a loadfuzz record as the plain harness takes it (None: no plain equivalent)."""
    if step["kind"] == "module":
        return f"y:import {step['lib']}"
    path = locate(step["lib"])
    if step["kind"] == "import":
        return f"y:import {module_of(path)}"
    if step["flags"] == "python":
        return None
    return f"{'g' if step['flags'] == 'global' else 'l'}:{path}"


def loadfuzz_verdict(record: dict) -> str:
    """A loadfuzz record in the plain harness's words."""
    if record["outcome"] in ("clean", "load-error", "timeout"):
        return record["outcome"]
    if record["signal"] is not None:
        return f"signal {record['signal']}"
    return f"exit {record['exit_code']}"


# --- the workloads ----------------------------------------------------------------------


@dataclass
class Bench:
    scratch: Path
    plain: Plain
    fuzz_budget_s: float
    plain_sample_s: float
    scale_sizes: list[int]
    scale_trials: int
    summary: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    mismatches: int = 0

    def folder(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.scratch))

    def matrix(self, target: str, label: str) -> None:
        runs = []  # (seconds, exit status, records, summary), one per run, in a folder of its own
        for _ in range(MATRIX_RUNS):
            out = self.folder(f"matrix-{target}") / "results"
            seconds, status = loadfuzz("matrix", target, "--flags", "global", "--out", str(out))
            runs.append((seconds, status, read_jsonl(out / "trials.jsonl"),
                         json.loads((out / "summary.json").read_text())))
        lf_s, status, records, summary = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
        times = ", ".join(f"{run[0]:.2f}" for run in runs)

        libs = distribution_libraries(target)
        pairs = [(a, b) for a in libs for b in libs if a != b]
        plain_s, verdicts = self.plain.run([[f"g:{a}", f"g:{b}"] for a, b in pairs],
                                           python=any(map(is_extension, libs)))
        plain_of = dict(zip(pairs, verdicts, strict=True))
        locate = Locator(libs)
        same = differ = missing = 0
        examples = []
        for _, _, run_records, _ in runs:  # every run must agree with the plain way
            for record in run_records:
                a, b = (locate(step["lib"]) for step in record["sequence"])
                theirs, ours = loadfuzz_verdict(record), plain_of.get((a, b))
                if theirs == ours:
                    same += 1
                else:
                    differ += 1
                    examples.append(f"{a.name} -> {b.name}: loadfuzz {theirs}, plain {ours}")
            missing += len(pairs) - len(run_records)
        identical = differ == 0 and missing == 0
        self.mismatches += not identical
        findings = len(summary["findings"])
        say(f"{label}: {len(records)} pairs of {len(summary['libraries'])} libraries, "
            f"{findings} findings  loadfuzz {lf_s:.2f} s (exit {status}; median of {times})  "
            f"plain {plain_s:.2f} s  plain/loadfuzz {plain_s / lf_s:.1f}x  "
            f"identical={'yes' if identical else 'NO'} ({same} same, {differ} differ, {missing} "
            f"pairs only the plain way ran, over the {len(runs)} runs)")
        for line in examples[:5]:
            say(f"    differs: {line}")
        self.summary.append((label, f"{lf_s:.1f} s", f"{plain_s:.1f} s", f"{plain_s / lf_s:.1f}x",
                             f"verdicts {'identical' if identical else 'DIFFER'}"))
        if target == "executorch":
            self.floor_lines(target, records, summary, lf_s)
        self.work_line(records, summary, lf_s, plain_s)

    def floor_lines(self, target: str, records: list[dict], summary: dict, lf_s: float) -> None:
        floor = floor_per_trial(target)
        in_run_s = len(records) / summary["throughput"]
        children = [r["duration_s"] for r in records if "cold" not in r["via"]]
        servers = summary["servers"]
        say(f"    floor_ms_per_trial={floor * 1000:.2f} (fork + a trial's own dlopens + wait, one core) "
            f"loadfuzz_ms_per_trial_per_worker={in_run_s / len(records) * CORES * 1000:.2f} "
            f"whole_command_ms_per_trial={lf_s / len(records) * 1000:.2f} "
            f"child_ms_per_trial={statistics.mean(children) * 1000 if children else 0:.2f} "
            f"disagreements={len(summary['disagreements'])} "
            f"preload={','.join(Path(p).name for p in summary['preload'])}")
        say(f"    outside_trials: servers={servers['servers']} "
            f"server_start_s={servers['server_start_s']:.2f} rows_shared={servers['rows_shared']} "
            f"row_start_s={servers['row_start_s']:.2f} "
            f"rows_not_shared={sum(servers['rows_not_shared'].values())} "
            f"trials_s={in_run_s:.2f} outside_trials_s={lf_s - in_run_s:.2f}")

    def work_line(self, records: list[dict], summary: dict, lf_s: float, plain_s: float) -> None:
        """What the child processes did (fork servers started, row servers' first steps, the
        trials themselves), and the time it would take on every core were it packed with no
        gap and loadfuzz's own process free: how far the command is from its own work."""
        servers = summary["servers"]
        trials_s = sum(r["duration_s"] for r in records)
        work_s = trials_s + servers["server_start_s"] + servers["row_start_s"]
        packed_s = work_s / CORES
        say(f"    children's work: trials {trials_s:.2f} s + servers started "
            f"{servers['server_start_s']:.2f} s + rows' first steps {servers['row_start_s']:.2f} s"
            f" = {work_s:.2f} s; on {CORES} cores with no gap {packed_s:.2f} s = "
            f"{plain_s / packed_s:.1f}x the plain way (the command: {lf_s:.2f} s)")

    def fuzz(self) -> None:
        out = self.folder("fuzz")
        budget = f"{self.fuzz_budget_s:g}s"
        lf_s, status = loadfuzz("fuzz", "executorch", "--budget", budget, "--seed", "1",
                                "--out", str(out / "results"), "--db", str(out / "db"))
        records = read_jsonl(out / "results" / "trials.jsonl")
        summary = json.loads((out / "results" / "summary.json").read_text())
        rate = summary["throughput"] or 0.0
        locate = Locator(distribution_libraries("executorch"))
        sample = [steps for r in records
                  if None not in (steps := [plain_step(s, locate) for s in r["sequence"]])]
        random.Random(1).shuffle(sample)
        # enough to fill the sample's time however fast the plain way goes: it stops at the budget
        sample = (sample * (1 + 20_000 // max(len(sample), 1)))[:20_000]
        plain_s, verdicts = self.plain.run(sample, python=True, budget_s=self.plain_sample_s)
        ran = sum(v is not None for v in verdicts)
        plain_rate = ran / plain_s
        say(f"fuzz executorch --budget {budget} --seed 1: {len(records)} trials, "
            f"{len(summary['findings'])} findings  loadfuzz {rate:.1f} trials/s "
            f"(its summary; {len(records) / lf_s:.1f} over the whole {lf_s:.1f} s command, exit {status})  "
            f"plain {plain_rate:.1f} trials/s ({ran} of its trials in {plain_s:.1f} s)  "
            f"loadfuzz/plain {rate / plain_rate:.1f}x")
        self.fuzz_ceiling(records, summary, plain_rate)
        self.summary.append((f"fuzz executorch {budget}", f"{rate:.1f} trials/s",
                             f"{plain_rate:.1f} trials/s", f"{rate / plain_rate:.1f}x",
                             f"command {lf_s:.0f} s for a {budget} budget"))

    def fuzz_ceiling(self, records: list[dict], summary: dict, plain_rate: float) -> None:
        """Where a fuzz campaign's trial time goes: in the trials with a Python step, which
        imports what the step imports (torch: 1.5 s) in the trial itself, as CPython does,
        unless the step comes first and imports torch first (`run/warm.py`). With every other
        trial free, the campaign could go no faster than those on every core."""
        def python(record: dict) -> bool:
            return any(s["kind"] != "dlopen" or s["flags"] == "python" for s in record["sequence"])

        total_s = sum(r["duration_s"] for r in records)
        slow = [r for r in records if python(r)]
        slow_s = sum(r["duration_s"] for r in slow)
        ceiling = len(records) / (slow_s / CORES) if slow_s else float("inf")
        say(f"    where the time goes: {len(slow)} of {len(records)} trials have a Python step, "
            f"{slow_s:.1f} of the {total_s:.1f} s their trials took; were every other trial "
            f"free, at most {ceiling:.1f} trials/s = {ceiling / plain_rate:.1f}x the plain way")
        # a step that fails by itself in this environment (a Python module it needs is not
        # installed) fails again in every sequence that reaches it: each is a real trial (what
        # comes before may change how it fails), and most import torch before they fail
        kinds = {(r["signature"], r["op"]) for r in summary.get("environment", [])}
        environment = [r for r in records if (r["signature"], r["op"]) in kinds]
        environment_s = sum(r["duration_s"] for r in environment)
        say(f"    {len(environment)} trials ended as one of the environment problems the "
            f"campaign reported (a missing Python module), {environment_s:.1f} s of the {total_s:.1f} s")

    def scan(self) -> None:
        env = dict(os.environ, XDG_CACHE_HOME=str(self.folder("cache")))
        cold_s, _ = loadfuzz("scan", "torch", env=env)
        warm = [loadfuzz("scan", "torch", env=env)[0] for _ in range(3)]
        warm_s = statistics.median(warm)
        say(f"scan torch: cold {cold_s:.2f} s (a fresh cache folder)  warm {warm_s:.2f} s "
            f"(the same cache; median of {', '.join(f'{w:.2f}' for w in warm)})  "
            f"cold/warm {cold_s / warm_s:.1f}x")
        self.summary.append(("scan torch cold / warm", f"{cold_s:.2f} s", f"{warm_s:.2f} s",
                             f"{cold_s / warm_s:.1f}x", "cold/warm"))

    def scale(self) -> None:
        build = self.folder("noop")
        (build / "noop.c").write_text(NOOP_C)
        cc = os.environ.get("CC") or "gcc"
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(build / "noop.so"),
                        str(build / "noop.c")], check=True)
        for n in self.scale_sizes:
            (build / f"libs-{n}").mkdir()
            for i in range(n):
                shutil.copyfile(build / "noop.so", build / f"libs-{n}" / f"libnoop{i:04d}.so")
        # As for the other workloads, the caches are warm, as after a first run: what was read
        # from a file changed less than 2 s before is not kept (see loadfuzz/elf/cache.py).
        time.sleep(2.5)
        for n in self.scale_sizes:
            loadfuzz("scan", str(build / f"libs-{n}"))
        for n in self.scale_sizes:
            libs = build / f"libs-{n}"
            pairs = n * (n - 1)
            shards = max(1, round(pairs / self.scale_trials))
            out = self.folder(f"scale-{n}")
            lf_s, _ = loadfuzz("matrix", str(libs), "--flags", "global", "--shard", f"1/{shards}",
                               "--out", str(out / "results"))
            records = read_jsonl(out / "results" / "trials.jsonl")
            summary = json.loads((out / "results" / "summary.json").read_text())
            rate = summary["throughput"]
            fixed_s = max(lf_s - len(records) / rate, 0.0)
            whole_s = fixed_s + pairs / rate
            plain_s, verdicts = self.plain.run(
                [[f"g:{libs / s['lib']}" for s in r["sequence"]] for r in records], python=False)
            plain_whole_s = pairs * plain_s / len(records)
            same = all(v == loadfuzz_verdict(r) for v, r in zip(verdicts, records, strict=True))
            self.mismatches += not same
            say(f"matrix of {n} no-op libraries --flags global --shard 1/{shards}: {len(records)} trials  "
                f"loadfuzz {lf_s:.2f} s = {len(records) / lf_s:.0f} trials/s whole command "
                f"({rate:.0f} trials/s in the run + {fixed_s:.2f} s fixed)  "
                f"plain {plain_s:.2f} s = {len(records) / plain_s:.0f} trials/s  "
                f"plain/loadfuzz {plain_s / lf_s:.1f}x  identical={'yes' if same else 'NO'}  "
                f"whole matrix ({pairs} pairs) ~ {whole_s:.0f} s, "
                f"the plain way ~ {plain_whole_s:.0f} s")
            self.summary.append((f"matrix {n} libs, {len(records)} trials", f"{lf_s:.1f} s",
                                 f"{plain_s:.1f} s", f"{plain_s / lf_s:.1f}x",
                                 f"{len(records) / lf_s:.0f} trials/s, fixed {fixed_s:.1f} s, "
                                 f"whole matrix ~{whole_s:.0f} s (plain ~{plain_whole_s:.0f} s)"))

    def print_summary(self, began: float, load: str) -> None:
        say()
        say(f"summary: {CORES} cores (load average {load} at the start, "
            f"{os.getloadavg()[0]:.2f} at the end), bench {time.perf_counter() - began:.0f} s")
        header = ("workload", "loadfuzz", "plain", "ratio")
        widths = [max(len(row[i]) for row in [header, *self.summary]) for i in range(4)]
        say(f"  {'workload':<{widths[0]}}  {'loadfuzz':>{widths[1]}}  {'plain':>{widths[2]}}  "
            f"{'ratio':>{widths[3]}}")
        for label, ours, theirs, ratio, extra in self.summary:
            say(f"  {label:<{widths[0]}}  {ours:>{widths[1]}}  {theirs:>{widths[2]}}  "
                f"{ratio:>{widths[3]}}  {extra}")
        say("  (scan: the columns are cold and warm; fuzz: trials/s, the ratio loadfuzz/plain; "
            "the rest: wall seconds, the ratio plain/loadfuzz)")


def floor_per_trial(target: str, samples: int = 30) -> float:
    """Seconds a trial cannot go below, the way loadfuzz runs it (see tools/floor.py).

    Per fork-server tier and per path: a trial of a shared row pays only for
    the steps after the row's first, any other trial for all its steps. Each
    is timed over `samples` trials and weighted by how many trials of the
    work take it.
    """
    from loadfuzz import inventory, plan
    from loadfuzz.model import Flags
    from loadfuzz.run.harness import Limits, trial_environment
    from loadfuzz.run.tiers import Tiers
    from loadfuzz.run.trials import Trials, harness_step

    libs = inventory.load_target(target).libraries
    work = plan.pairs(libs, [Flags.GLOBAL])
    with Trials(Limits(), Tiers.of(libs)) as trials:
        groups: dict[tuple, list] = {}
        for batch in trials.batches(work):
            groups.setdefault((trials.tiers.preload(batch[0]), len(batch) > 1), []).append(batch)
        tiers = []
        for (preload, shared), batches in groups.items():
            rows, left = [], samples
            for batch in batches:
                if left > 0:
                    rows.append([[[harness_step(step, trials.tiers).mode, str(step.path)]
                                  for step in seq] for seq in batch[:left]])
                    left -= len(rows[-1])
            tiers.append({"preload": [[step.mode, str(step.path)] for step in preload],
                          "shared": shared, "rows": rows})
    with tempfile.TemporaryDirectory(prefix="loadfuzz-floor-") as scratch:
        done = subprocess.run([sys.executable, str(FLOOR)], input=json.dumps(tiers),
                              capture_output=True, text=True, check=True, cwd=scratch,
                              env=trial_environment(Path(scratch)))
    medians = json.loads(done.stdout)
    weights = [sum(len(batch) for batch in batches) for batches in groups.values()]
    return sum(m * w for m, w in zip(medians, weights, strict=True)) / len(work)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loadfuzz-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(WORKLOADS),
                        help=f"comma-separated workloads among {','.join(WORKLOADS)}")
    parser.add_argument("--fuzz-budget", type=float, default=60.0, metavar="S")
    parser.add_argument("--plain-sample", type=float, default=20.0, metavar="S",
                        help="seconds the plain way replays the fuzz's trials")
    parser.add_argument("--sizes", default="50,100,200,400", help="library counts of the scale runs")
    parser.add_argument("--scale-trials", type=int, default=600, metavar="N",
                        help="about how many trials each scale run makes (--shard 1/K)")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    if only - set(WORKLOADS):
        parser.error(f"unknown workload: {', '.join(sorted(only - set(WORKLOADS)))}")

    began, load = time.perf_counter(), f"{os.getloadavg()[0]:.2f}"
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean the scratch folder up
    with tempfile.TemporaryDirectory(prefix="loadfuzz-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        bench = Bench(scratch, Plain.build(scratch), args.fuzz_budget, args.plain_sample,
                      [int(n) for n in args.sizes.split(",")], args.scale_trials)
        note(f"{CORES} cores, loadfuzz {LOADFUZZ}, plain harness {PLAIN_C.name}; "
             "warming the ELF cache (scan executorch, scan torch; not timed)")
        for target in ("executorch", "torch"):
            loadfuzz("scan", target)
        if "executorch" in only:
            bench.matrix("executorch", "matrix executorch --flags global")
        if "torch" in only:
            bench.matrix("torch", "matrix torch --flags global")
        if "fuzz" in only:
            bench.fuzz()
        if "scan" in only:
            bench.scan()
        if "scale" in only:
            bench.scale()
        bench.print_summary(began, load)
    return 1 if bench.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
