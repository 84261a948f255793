"""The Python API for a project's own tests: run one load order, get its trial record.

    from loadfuzz.api import Outcome, run_load_order

    record = run_load_order("executorch", "lib/libexecutorch_kernels_quantized.so",
                            "local:extra/my_plugin.so", add=["build/my_plugin.so"])
    assert record.clean, f"{record.outcome.value}: {record.detail}\\n{record.repro}"

Steps are spelled as on the `loadfuzz run` command line: a library id of the
target (or a path), with an optional `global:` or `local:` prefix for its
flags mode, or `py:PATH` to import a Python extension module. With target
None every step is a path. Each call is one cold trial in a fresh process.
Inside pytest the `loadfuzz_run` fixture hands out this same function.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from loadfuzz import inventory
from loadfuzz.execute import Limits
from loadfuzz.model import Flags, Outcome, Step, StepKind, TrialRecord, UsageError
from loadfuzz.trial import Trials

__all__ = ["Outcome", "TrialRecord", "UsageError", "run_load_order"]

# step prefix -> (kind, flags mode; None: the call's `flags`)
PREFIXES: dict[str, tuple[StepKind, Flags | None]] = {
    "global": (StepKind.DLOPEN, Flags.GLOBAL),
    "local": (StepKind.DLOPEN, Flags.LOCAL),
    "py": (StepKind.IMPORT, Flags.LOCAL),
}


def run_load_order(target: str | Path | None, *steps: str | Path,
                   add: Iterable[str | Path] = (), flags: str = "global",
                   timeout: float = 10.0) -> TrialRecord:
    """Run `steps` in this order in one fresh process and return the trial record.

    target: a .whl, a directory or an installed distribution's name (then a
    step may be a library id), or None. add: extra libraries of the target
    (ids `extra/<file name>`). flags: the mode of steps without a prefix.
    timeout: the limit of one step, in seconds. Bad input raises UsageError.
    """
    if not steps:
        raise UsageError("run_load_order needs at least one step")
    try:
        default = Flags(flags)
    except ValueError:
        raise UsageError(f"unknown flags mode {flags!r} (expected global or local)") from None
    if not timeout > 0:
        raise UsageError(f"timeout must be more than zero seconds, not {timeout!r}")
    inv = None if target is None else inventory.load_target(str(target), [Path(p) for p in add])
    seq = tuple(parse_step(str(text), default, inv) for text in steps)
    python = needing_python(seq, inv)
    with Trials(Limits(timeout_s=timeout), lambda s: any(st.path.resolve() in python for st in s),
                cold=True) as trials:
        return trials.run(seq)


def parse_step(text: str, default: Flags, inv: inventory.Inventory | None) -> Step:
    """`[global:|local:|py:]ID-OR-PATH` -> a Step; an id only counts when there is a target."""
    prefix, sep, rest = text.partition(":")
    kind, flags = PREFIXES[prefix] if sep and prefix in PREFIXES else (StepKind.DLOPEN, None)
    name = rest if sep and prefix in PREFIXES else text
    flags = flags or default
    if inv is not None and any(lib.id == name for lib in inv.libraries):
        return Step(kind, name, flags, inv.locate(name))
    path = Path(name).absolute()
    if not path.is_file():
        where = f" and no library id of {inv.target}" if inv is not None else ""
        raise UsageError(f"no such library: {name} (not a file{where})")
    return Step(kind, str(path), flags, path)


def needing_python(seq: Iterable[Step], inv: inventory.Inventory | None) -> set[Path]:
    """The (resolved) paths among the steps' libraries that need libpython loaded first."""
    known = {lib.path.resolve(): lib for lib in inv.libraries} if inv is not None else {}
    loose = [step.path for step in seq if step.path.resolve() not in known]
    if loose:
        known |= {lib.path.resolve(): lib for lib in inventory.load_libraries(loose).libraries}
    return {path for path, lib in known.items() if lib.needs_python}
