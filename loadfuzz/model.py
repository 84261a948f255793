"""The shared vocabulary: the records every pipeline stage reads and writes.

Nothing here does any work. Flags, outcomes, roles and step kinds are enums;
steps, trial evidence and trial records are frozen dataclasses with an exact
JSON form (the one `../shared/CONTRACT.md` documents).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class Flags(enum.Enum):
    """How a step's library is opened."""

    GLOBAL = "global"  # RTLD_NOW | RTLD_GLOBAL: a C++ application linking it
    LOCAL = "local"  # RTLD_NOW | RTLD_LOCAL: what CPython's import gives an extension

    @classmethod
    def parse_list(cls, text: str) -> tuple[Flags, ...]:
        """`"global,local"` -> (GLOBAL, LOCAL); raises ValueError on an unknown mode."""
        modes = []
        for word in text.split(","):
            try:
                mode = cls(word.strip())
            except ValueError:
                raise ValueError(
                    f"unknown flags mode {word.strip()!r} (expected global or local)"
                ) from None
            if mode not in modes:
                modes.append(mode)
        return tuple(modes)


class StepKind(enum.Enum):
    DLOPEN = "dlopen"  # dlopen(path, flags)
    IMPORT = "import"  # import the extension module at path in an embedded interpreter


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
        return cls(StepKind(data["kind"]), data["lib"], Flags(data["flags"]), locate(data["lib"]))

    def spelling(self) -> str:
        """The way a user types this step on the `run` command line (path form)."""
        if self.kind is StepKind.IMPORT:
            return f"py:{self.path}"
        return f"{self.flags.value}:{self.path}"


Sequence = tuple[Step, ...]


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

    @property
    def clean(self) -> bool:
        return self.outcome is Outcome.CLEAN

    def key(self) -> tuple:
        """What makes two records the same trial: the sequence (ids and flags)."""
        return tuple((s.kind.value, s.lib, s.flags.value) for s in self.sequence)

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
        )


class UsageError(Exception):
    """Bad usage or bad input: the CLI prints the message as one line and exits 2."""
