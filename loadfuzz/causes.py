"""The cause catalogue: `causes.toml` as typed rules, each a kind of cause with its text and fixes.

Like the signature catalogue (`classify`), the causes are data: what each
kind of finding means, in a paragraph with fields the explanation fills in
(`explain`), and the fixes, most specific first, each offered always or only
under one of the `CONDITIONS` the explanation can establish.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources

from loadfuzz.model import BoundSymbol, Carrier

# The conditions a fix may ask for (`when` in causes.toml); an Account lists those that hold.
CONDITIONS = frozenset({"static-copy", "flags-decide", "provider-known", "provider-loaded-local",
                        "no-provider", "shipped", "not-shipped"})


@dataclass(frozen=True)
class FixRule:
    name: str
    text: str
    when: str | None = None
    last_resort: bool = False


@dataclass(frozen=True)
class CauseRule:
    kind: str
    signatures: frozenset[str]
    outcomes: frozenset[str]
    text: str
    fixes: tuple[FixRule, ...]
    registries: Mapping[str, str] = field(default_factory=dict)  # signature -> registry's name


def load_causes(text: str | None = None) -> tuple[CauseRule, ...]:
    """The cause catalogue; by default the one beside this module. A fix naming an unknown
    condition is an error (a typo would silently drop it)."""
    if text is None:
        text = resources.files("loadfuzz").joinpath("causes.toml").read_text()
    rules = []
    for entry in tomllib.loads(text)["cause"]:
        fixes = tuple(FixRule(f["name"], f["text"], f.get("when"), f.get("last_resort", False))
                      for f in entry.get("fix", ()))
        for fix in fixes:
            if fix.when is not None and fix.when not in CONDITIONS:
                raise ValueError(f"causes.toml: fix {fix.name!r} of {entry['kind']!r} asks for "
                                 f"an unknown condition {fix.when!r}")
        rules.append(CauseRule(entry["kind"], frozenset(entry.get("signatures", ())),
                               frozenset(entry.get("outcomes", ())), entry["text"], fixes,
                               entry.get("registries", {})))
    return tuple(rules)


@dataclass(frozen=True)
class Account:
    """What one finding's evidence says (`explain`), before the catalogue's words are put on it."""

    kind: str | None  # None: the catalogue decides from the signature or outcome
    carriers: tuple[Carrier, ...]  # the copies, the one that came first first
    symbols: tuple[BoundSymbol, ...] = ()
    fields: Mapping[str, str] = field(default_factory=dict)  # for the templates
    conditions: frozenset[str] = frozenset()  # those of CONDITIONS that hold


class Fields(dict):
    """Template fields; one the finding has no value for reads as `?`, never a KeyError."""

    def __missing__(self, key: str) -> str:
        return "?"
