"""The Python API for a project's own tests: run one load order, get its trial record.

    from loadfuzz.api import Outcome, run_load_order

    record = run_load_order("executorch", "lib/libexecutorch_kernels_quantized.so",
                            "local:extra/my_plugin.so", add=["build/my_plugin.so"])
    assert record.clean, f"{record.outcome.value}: {record.detail}\\n{record.repro}"

Steps are spelled as on the `loadfuzz run` command line: a library id of the
target (or a path), with an optional `global:`, `local:` or `python:` prefix
for its flags mode, `py:PATH` to import a Python extension module, or
`import:NAME` to import a module by name. With target
None every step is a path. Each call is one cold trial in a fresh process (one
that is not clean runs once more under the loader's report, `LD_DEBUG`, for
its cause).
Inside pytest the `loadfuzz_run` fixture hands out this same function.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from loadfuzz import inventory
from loadfuzz.explain import Explainer, identity
from loadfuzz.model import (
    MAX_TIMEOUT_S,
    MIN_TIMEOUT_S,
    Flags,
    Outcome,
    Role,
    Sequence,
    Step,
    StepKind,
    TrialRecord,
    UsageError,
    parse_step,
)
from loadfuzz.run.harness import Limits
from loadfuzz.run.tiers import NO_TIERS, Tiers
from loadfuzz.run.trials import Trials

__all__ = ["Outcome", "TrialRecord", "UsageError", "run_load_order"]


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
    # (types first: a str `add` would be read a character at a time, a bool taken for 1 s)
    extra = tuple(add) if isinstance(add, Iterable) and not isinstance(add, str) else None
    if extra is None or not all(isinstance(p, str | Path) for p in extra):
        raise UsageError(f"add is a list of library paths, not {add!r}")
    if any(isinstance(p, str) and not p.strip() for p in extra):  # Path("") is the working folder
        raise UsageError("add: an empty path")
    if extra and target is None:  # (it would be ignored: the steps are paths already)
        raise UsageError("add names extra libraries of a target: give the target, or the "
                         "libraries as steps")
    if not isinstance(flags, str):
        raise UsageError(f"flags is a mode's name (global, local or python), not {flags!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise UsageError(f"timeout is a number of seconds, not {timeout!r}")
    try:
        modes = Flags.parse_list(flags)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if len(modes) != 1:
        raise UsageError(f"flags is the one mode of the steps without a prefix (global, local or "
                         f"python), not {flags!r}")
    default = modes[0]
    if not MIN_TIMEOUT_S <= timeout <= MAX_TIMEOUT_S:  # also false for nan
        raise UsageError(f"timeout must be at least {MIN_TIMEOUT_S} seconds and at most {MAX_TIMEOUT_S} "
                         f"(a week), not {timeout!r}")
    seq, names = load_order(None if target is None else str(target), steps, default, extra)
    return run_cold(seq, Limits(timeout_s=timeout), names)


def load_order(target: str | None, steps: Iterable[str | Path], default: Flags,
               add: Iterable[str | Path] = ()) -> tuple[Sequence, Mapping[tuple[int, int], str]]:
    """The steps as `run` spells them, library ids looked up in `target` (None: paths only),
    a path to one of the target's files recorded under its id; and the target's ids by the
    identity of their file, which a cause names them by."""
    ids: dict[str, Path] = {}
    names: dict[tuple[int, int], str] = {}
    if target is not None:
        inv = inventory.load_target(target, [Path(p) for p in add])
        ids = {lib.id: lib.path for lib in inv.libraries}
        names = {ident: lib.id for ident, lib in inv.by_identity.items()}
    try:
        seq = tuple(parse_step(str(text), default, ids.get) for text in steps)
    except UsageError as exc:
        where = f" (and no library id of {target})" if target is not None else ""
        raise UsageError(f"{exc}{where}") from None
    seq = tuple(s if s.kind is StepKind.MODULE else replace(s, lib=names.get(
        identity(str(s.path)) or (-1, -1), s.lib)) for s in seq)
    return as_python_loads_it(seq), names


def as_python_loads_it(seq: Sequence) -> Sequence:
    """`python:` steps as Python code loads their library: an extension module by its import
    (a `py:` step), as `matrix --flags python` does; anything else stays a `ctypes` load."""
    python = [s.path for s in seq if s.kind is StepKind.DLOPEN and s.flags is Flags.PYTHON]
    if not python:
        return seq
    roles = {lib.path: lib.role for lib in inventory.load_libraries(python).libraries}
    return tuple(Step(StepKind.IMPORT, s.lib, s.flags, s.path)
                 if s.kind is StepKind.DLOPEN and s.flags is Flags.PYTHON
                 and roles.get(s.path) is Role.PYTHON_EXTENSION else s for s in seq)


def run_cold(seq: Sequence, limits: Limits,
             names: Mapping[tuple[int, int], str] | None = None) -> TrialRecord:
    """One trial of `seq` in a fresh process (what `run` and this API do); `names`: what its
    cause calls a file by (a target's ids, see `load_order`), else the inventory's."""
    files = list(dict.fromkeys(s.path for s in seq if s.kind is not StepKind.MODULE))
    if not files:  # modules by name only: nothing to read, a finding is still explained
        inv = inventory.Inventory("", "modules", None, Path.cwd(), (), ())
        return run_with(seq, limits, NO_TIERS, Explainer(inv, names=names))
    inv = inventory.load_libraries(files)
    return run_with(seq, limits, Tiers.of(inv.libraries), Explainer(inv, names=names))


def run_with(seq: Sequence, limits: Limits, tiers: Tiers, explainer: Explainer) -> TrialRecord:
    with Trials(limits, tiers, cold=True, explainer=explainer) as trials:
        return trials.run(seq)
