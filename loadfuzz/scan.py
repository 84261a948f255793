"""Presents an inventory and its predictions: the `scan --json` object and the human table."""

from __future__ import annotations

from collections.abc import Sequence

from loadfuzz.inventory import Inventory, Library
from loadfuzz.predict import Prediction


def library_json(lib: Library) -> dict:
    return {
        "id": lib.id,
        "role": lib.role.value,
        "soname": lib.soname,
        "needed": list(lib.needed),
        "runpath": list(lib.runpath),
        "needs_python": lib.needs_python,
        "registry_owner": lib.registry_owner,
        "registers": list(lib.registers),
        "closure": list(lib.closure),
        "missing": list(lib.missing),
    }


def scan_json(inv: Inventory, predictions: Sequence[Prediction]) -> dict:
    """The contract's `scan --json` object (plus `version`, `warnings` and each `missing`)."""
    return {
        "target": inv.target,
        "version": inv.version,
        "libraries": [library_json(lib) for lib in inv.libraries],
        "predicted": [p.pair_json() for p in predictions],
        "warnings": list(inv.warnings),
    }


def registry_column(lib: Library) -> str:
    if lib.registry_owner:
        return "owner"
    return ", ".join(f"{kind}:{len(ops)}" for kind, ops in lib.registrations if ops) or "-"


def scan_text(inv: Inventory, predictions: Sequence[Prediction]) -> str:
    """A table of the libraries, then the predicted collisions with their reasons."""
    version = f" {inv.version}" if inv.version else ""
    lines = [f"{inv.name}{version}: {len(inv.libraries)} libraries under {inv.root}", ""]
    width = max(len(lib.id) for lib in inv.libraries)
    lines.append(f"{'library':<{width}}  {'role':<16} {'closure':>7}  {'python':<6}  registers")
    for lib in inv.libraries:
        flags = "yes" if lib.needs_python else "-"
        lines.append(f"{lib.id:<{width}}  {lib.role.value:<16} {len(lib.closure):>7}  "
                     f"{flags:<6}  {registry_column(lib)}")
        if lib.missing:
            lines.append(f"{'':<{width}}  missing: {', '.join(lib.missing)}")
    lines.append("")
    lines.append("registers: owner = defines a registry's entry point; kind:N = N operators "
                 "registered into that registry (executorch or torch)")
    lines.append("")
    if not predictions:
        lines.append("predicted collisions: none (every ordered pair should load clean)")
    else:
        lines.append(f"predicted collisions: {len(predictions)} (ordered pair @ flags)")
        for p in predictions:
            first, second = p.sequence[0], p.sequence[1]
            lines.append(f"  {first.lib} -> {second.lib} @ {first.flags.value}: "
                         f"{p.outcome.value} {p.op or ''}".rstrip())
            lines.append(f"      {p.why}")
    for warning in inv.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)
