"""The shared vocabulary: the records every pipeline stage reads and writes, and how they are spelled.

Nothing here runs anything (parsing a step looks only at whether its file
exists). Flags, outcomes, roles and step kinds are enums;
steps, trial evidence and trial records are frozen dataclasses with an exact
JSON form (the one docs/contract.md documents). How a step is typed on the
command line and spelled back, and how a sequence is keyed, are defined here
once, for every stage that needs them (how a finding reads for people:
`spelling`).
"""

from __future__ import annotations

import enum
import re
import signal as signals
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class Flags(enum.Enum):
    """How a step's library is opened."""

    GLOBAL = "global"  # RTLD_NOW | RTLD_GLOBAL: a C++ application linking it
    LOCAL = "local"  # RTLD_NOW | RTLD_LOCAL: what CPython's import gives an extension
    # The way Python code loads it: an extension module by its qualified import, an export
    # plugin by torch.ops.load_library (after `import torch`), anything else by ctypes.CDLL.
    PYTHON = "python"

    @classmethod
    def parse_list(cls, text: str) -> tuple[Flags, ...]:
        """`"global,local"` -> (GLOBAL, LOCAL); raises ValueError on an unknown mode."""
        modes = []
        for word in text.split(","):
            try:
                mode = cls(word.strip())
            except ValueError:
                raise ValueError(
                    f"unknown flags mode {word.strip()!r} (expected global, local or python)"
                ) from None
            if mode not in modes:
                modes.append(mode)
        return tuple(modes)


class StepKind(enum.Enum):
    DLOPEN = "dlopen"  # load the library at path: dlopen(path, flags), or as Python does (PYTHON)
    IMPORT = "import"  # import the extension module at path under its qualified module name
    MODULE = "module"  # import a module by name (`lib` is the name; there is no path)


class Outcome(enum.Enum):
    """Exactly one per trial; see the contract's table."""

    CLEAN = "clean"
    REREGISTER = "reregister"
    ABORT = "abort"
    CRASH = "crash"
    LOAD_ERROR = "load-error"
    EXIT = "exit"
    TIMEOUT = "timeout"


class Role(enum.Enum):
    RUNTIME = "runtime"
    PYTHON_EXTENSION = "python-extension"
    EXPORT_PLUGIN = "export-plugin"
    OTHER = "other"


@dataclass(frozen=True)
class Step:
    """One action of a trial. `lib` is the library id; `path` is where it is here."""

    kind: StepKind
    lib: str
    flags: Flags
    path: Path = field(compare=False, hash=False, repr=False, default=Path())

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind.value, "lib": self.lib, "flags": self.flags.value}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], locate: Callable[[str], Path]) -> Step:
        """Rebuild a step; `locate` maps a library id back to its path on this machine."""
        kind = StepKind(data["kind"])
        path = Path() if kind is StepKind.MODULE else locate(data["lib"])
        return cls(kind, data["lib"], Flags(data["flags"]), path)

    def spelling(self) -> str:
        """The way a user types this step on the `run` command line (path form)."""
        if self.kind is StepKind.IMPORT:  # python: on an extension module is its import too
            return f"{'python' if self.flags is Flags.PYTHON else 'py'}:{self.path}"
        if self.kind is StepKind.MODULE:
            return f"import:{self.lib}"
        return f"{self.flags.value}:{self.path}"


Sequence = tuple[Step, ...]
Key = tuple[tuple[str, str, str], ...]  # a sequence as data: (kind, lib, flags) per step


def sequence_key(seq: Iterable[Step]) -> Key:
    """What makes two trials the same trial: the steps' kinds, library ids and flags."""
    return tuple((s.kind.value, s.lib, s.flags.value) for s in seq)


def json_key(record: Mapping[str, Any]) -> Key:
    """`sequence_key` of a trial record in its JSON form."""
    return tuple((s["kind"], s["lib"], s["flags"]) for s in record["sequence"])


def new_and_unexpected(summary: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A summary's findings that are both new since its baseline and covered by no
    expectation: what fails a campaign run with `--fail-on new`."""
    new = {json_key(r) for r in summary.get("baseline", {}).get("new", [])}
    return [r for r in summary["unexpected"] if json_key(r) in new]


# The version part of a `<name>-<version>` folder: a PEP 440 version as it appears in a
# wheel's or a distribution's name (no `-` inside), or `unversioned` (a target without one).
VERSION = re.compile(r"\d[A-Za-z0-9_.+!]*|unversioned")
NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


def normal_id(lib: str) -> str:
    """A library id without the version of its target: `executorch-1.5.1/lib/x.so` ->
    `executorch/lib/x.so`. An id whose first component is not `<name>-<version>`, or that has
    a single component (`lib/x.so`, `extra/p.so`, `libx-1.2.so`), stays as it is."""
    head, slash, rest = lib.partition("/")
    name, dash, version = head.rpartition("-")
    if slash and dash and NAME.fullmatch(name) and VERSION.fullmatch(version):
        return f"{name}/{rest}"
    return lib


# step prefix on the command line -> (kind, flags mode; None: the command's default)
STEP_PREFIXES: dict[str, tuple[StepKind, Flags | None]] = {
    "global": (StepKind.DLOPEN, Flags.GLOBAL),
    "local": (StepKind.DLOPEN, Flags.LOCAL),
    "python": (StepKind.DLOPEN, Flags.PYTHON),
    "py": (StepKind.IMPORT, Flags.LOCAL),
    "import": (StepKind.MODULE, Flags.PYTHON),
}
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
# The longest limit a step may have, in seconds (a week): the harness counts nanoseconds in
# 64 bits, and nan or inf would be no limit at all.
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 0.001, 7 * 24 * 3600  # the harness counts in milliseconds
DEFAULT_MEM_MB = 16384  # a trial's RLIMIT_AS: libtorch alone maps several GB


def parse_step(text: str, default: Flags, locate: Callable[[str], Path | None]) -> Step:
    """`[global:|local:|python:|py:]ID-OR-PATH` or `import:MODULE` -> a Step. `locate(name)`
    gives the path of a library id, or None when `name` is no id (then it must be a file).
    Raises UsageError."""
    prefix, sep, rest = text.partition(":")
    known = bool(sep) and prefix in STEP_PREFIXES
    kind, flags = STEP_PREFIXES[prefix] if known else (StepKind.DLOPEN, None)
    name = rest if known else text
    if kind is StepKind.MODULE:
        if not MODULE_NAME.fullmatch(name):
            raise UsageError(f"import:{name}: not a module name (e.g. import:torch)")
        return Step(kind, name, Flags.PYTHON)
    if not name:
        raise UsageError(f"an empty step {text!r}: give a library's path (or id) after the prefix"
                         if known else "an empty step: give a library's path or id")
    found = locate(name)
    if found is not None:
        return Step(kind, name, flags or default, found)
    path = Path(name).absolute()
    if not path.is_file():
        raise UsageError(f"not a library file: {name}" if path.exists()
                         else f"no such library: {name}")
    return Step(kind, str(path), flags or default, path)


def step_label(step: Mapping[str, Any]) -> str:
    """A step (JSON form) as `run` spells it, with the library id: `global:lib/x.so`, `py:ext.so`,
    `import:torch`."""
    prefixes = {StepKind.IMPORT.value: "py", StepKind.MODULE.value: "import"}
    if step["flags"] == Flags.PYTHON.value and step["kind"] != StepKind.MODULE.value:
        return f"python:{step['lib']}"  # an extension's import, as `python:` spells it
    return f"{prefixes.get(step['kind'], step['flags'])}:{step['lib']}"


@dataclass(frozen=True)
class Evidence:
    """Everything one trial left behind, as the harness reported it.

    This is the classifier's whole input: it is recorded, replayed in tests,
    and never re-derived from anything else.
    """

    steps: int  # how many steps the trial had
    started: int  # how many steps the harness began (the last began is started - 1)
    done: int  # how many steps completed
    exit_code: int | None  # set when the process exited
    signal: int | None  # set when a signal ended the process
    timed_out: bool  # the harness killed it because a step ran past the limit
    error: str  # dlerror() or the Python exception of the failed step, else ""
    output: bytes  # stdout and stderr interleaved, bounded (head and tail kept)
    output_bytes: int  # how many bytes the process wrote in all
    duration_s: float
    peak_rss_mb: float
    leftovers: int = 0  # processes the trial left running, which the harness killed

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["output"] = self.output.decode("utf-8", "replace")
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Evidence:
        values = dict(data)
        values["output"] = values["output"].encode("utf-8")
        return cls(**values)


@dataclass(frozen=True)
class Verdict:
    """What the classifier says about one trial's evidence."""

    outcome: Outcome
    step: int | None
    signature: str | None
    op: str | None
    signal: int | None
    exit_code: int | None
    detail: str


@dataclass(frozen=True)
class Carrier:
    """A library that carries a copy of what collided, and how it got into the process."""

    lib: str  # its id (or its file name, outside every target)
    step: int | None  # the step that brought it in (None: the loader's account did not say)
    needed_by: str | None = None  # None: the step loaded it itself; else whose dependency it was

    def how(self, sequence: Sequence) -> str:
        """`loaded by step 1 (global)`, `imported by step 0 (py:ext.so)`, or
        `a dependency of lib/x.so, loaded by step 0 (local)`."""
        if self.step is None or not 0 <= self.step < len(sequence):
            return f"a dependency of {self.needed_by}" if self.needed_by else "in the process"
        step = sequence[self.step]
        loaded = (f"loaded by step {self.step} ({step.flags.value})" if step.kind is StepKind.DLOPEN
                  else f"imported by step {self.step} ({step_label(step.to_json())})")
        return f"a dependency of {self.needed_by}, {loaded}" if self.needed_by else loaded

    def to_json(self, sequence: Sequence) -> dict[str, Any]:
        return {"lib": self.lib, "step": self.step, "needed_by": self.needed_by,
                "how": self.how(sequence)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Carrier:
        return cls(data["lib"], data["step"], data["needed_by"])


@dataclass(frozen=True)
class BoundSymbol:
    """An exported symbol that mattered: who defines it, and where each caller's reference bound."""

    symbol: str  # as people read it (the qualified name of a C++ function)
    mangled: str
    defined_by: tuple[str, ...]
    bindings: tuple[tuple[str, str], ...] = ()  # (caller, the library its reference bound to)

    def to_json(self) -> dict[str, Any]:
        return {"symbol": self.symbol, "mangled": self.mangled, "defined_by": list(self.defined_by),
                "bindings": [{"from": a, "to": b} for a, b in self.bindings]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BoundSymbol:
        return cls(data["symbol"], data["mangled"], tuple(data["defined_by"]),
                   tuple((b["from"], b["to"]) for b in data["bindings"]))


@dataclass(frozen=True)
class Fix:
    name: str  # the catalogue's name for it (causes.toml)
    text: str
    last_resort: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"fix": self.name, "text": self.text, "last_resort": self.last_resort}


@dataclass(frozen=True)
class Cause:
    """Why a finding happened, as observed in its confirmation run (or, where the run could
    not say, as the ELF files tell it), with the ways out."""

    kind: str  # a kind of causes.toml: duplicate-registration, missing-symbol, ...
    libraries: tuple[Carrier, ...]
    symbols: tuple[BoundSymbol, ...]
    text: str  # one paragraph for a bug report
    evidence: str  # "observed" (the loader's own account of the run) or "static" (ELF files)
    fixes: tuple[Fix, ...] = ()

    def to_json(self, sequence: Sequence) -> dict[str, Any]:
        return {"kind": self.kind, "libraries": [c.to_json(sequence) for c in self.libraries],
                "symbols": [s.to_json() for s in self.symbols], "text": self.text,
                "evidence": self.evidence}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], fixes: Iterable[Mapping[str, Any]]) -> Cause:
        return cls(data["kind"], tuple(Carrier.from_json(c) for c in data["libraries"]),
                   tuple(BoundSymbol.from_json(s) for s in data["symbols"]), data["text"],
                   data["evidence"],
                   tuple(Fix(f["fix"], f["text"], f["last_resort"]) for f in fixes))


@dataclass(frozen=True)
class TrialRecord:
    """One trial, in the contract's JSON shape (plus `via`, how it was run)."""

    sequence: Sequence
    outcome: Outcome
    step: int | None
    signature: str | None
    op: str | None
    signal: int | None
    exit_code: int | None
    detail: str
    duration_s: float
    peak_rss_mb: float
    repro: str
    via: str = "cold"  # "cold" (a fresh process), "fork-server" or "shared prefix" (+ ", confirmed cold")
    cause: Cause | None = None  # a finding's explanation (see explain); None for a clean trial
    # The step's error, then what the trial printed (the head and tail the harness kept), when
    # its runner keeps them (`repro` looks for a message there); never part of the JSON record.
    printed: str = field(default="", compare=False, repr=False)

    @property
    def clean(self) -> bool:
        return self.outcome is Outcome.CLEAN

    def key(self) -> Key:
        """What makes two records the same trial: the sequence (ids and flags)."""
        return sequence_key(self.sequence)

    def to_json(self) -> dict[str, Any]:
        return {
            "sequence": [s.to_json() for s in self.sequence],
            "outcome": self.outcome.value,
            "step": self.step,
            "signature": self.signature,
            "op": self.op,
            "signal": self.signal,
            "exit_code": self.exit_code,
            "detail": self.detail,
            "duration_s": round(self.duration_s, 4),
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "repro": self.repro,
            "via": self.via,
            **({"cause": self.cause.to_json(self.sequence),
                "fixes": [f.to_json() for f in self.cause.fixes]} if self.cause else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], locate: Callable[[str], Path]) -> TrialRecord:
        return cls(
            sequence=tuple(Step.from_json(s, locate) for s in data["sequence"]),
            outcome=Outcome(data["outcome"]),
            step=data["step"],
            signature=data["signature"],
            op=data["op"],
            signal=data["signal"],
            exit_code=data["exit_code"],
            detail=data["detail"],
            duration_s=data["duration_s"],
            peak_rss_mb=data["peak_rss_mb"],
            repro=data["repro"],
            via=data.get("via", "cold"),
            cause=Cause.from_json(data["cause"], data.get("fixes", ())) if data.get("cause")
            else None,
        )


class UsageError(Exception):
    """Bad usage or bad input: the CLI prints the message as one line and exits 2."""


class Stopped(KeyboardInterrupt):
    """A command was stopped by a signal (SIGINT, SIGTERM, SIGHUP): finished trials are kept."""

    def __init__(self, signum: int = signals.SIGINT):
        super().__init__(signals.Signals(signum).name)
        self.signum = signum
