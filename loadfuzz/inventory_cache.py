"""An inventory kept in the derived cache: the same `Inventory` without reading a file again.

`load_targets` is `inventory.load_targets` through `derived.DerivedCache`:
while no file, folder or metadata the inventory was read from has changed,
it comes back from one entry (as plain values: `to_plain` and `from_plain`
turn an inventory, its libraries and its link map into tuples, strings and
numbers and back) instead of from the ELF cache, importlib.metadata and the
loader's search. The campaign commands (`matrix`, `fuzz`, `repro`) load
their targets this way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from loadfuzz import inventory
from loadfuzz.derived import Consulted, DerivedCache
from loadfuzz.elf.cache import facts_from, facts_to
from loadfuzz.elf.loader import LinkMap
from loadfuzz.inventory import Inventory, Library
from loadfuzz.model import Role
from loadfuzz.registries import EntryPoints


def key_of(cache: DerivedCache, names: Sequence[str], add: Sequence[Path], env: bool) -> tuple:
    return cache.key("inventory", (tuple(names), tuple(str(p) for p in add), env))


def keep(cache: DerivedCache, names: Sequence[str], add: Sequence[Path], env: bool,
         consulted: Consulted, started_ns: int, inv: Inventory) -> None:
    """Keep an inventory read by another command (`scan`), so that a campaign on the same
    targets starts from it."""
    cache.keep(key_of(cache, names, add, env), consulted, started_ns, to_plain(inv))


def load_targets(names: Sequence[str], add: Sequence[Path] = (), env: bool = False,
                 cache: DerivedCache | None = None) -> Inventory:
    """`inventory.load_targets(names, add, env)`, from the derived cache when it holds it."""
    cache = cache or DerivedCache.default()
    key = key_of(cache, names, add, env)
    stored = cache.get(key)
    if stored is not None:
        try:
            return from_plain(stored)
        except (TypeError, ValueError, KeyError, IndexError):
            pass  # not an inventory this code wrote: read the files
    started, consulted = time.time_ns(), Consulted()
    found = inventory.load_targets(names, add, env, consulted=consulted)
    cache.keep(key, consulted, started, to_plain(found))
    return found


def library_to_plain(lib: Library) -> tuple:
    return (lib.id, str(lib.path), lib.role.value, lib.soname, lib.needed, lib.runpath,
            lib.needs_python, lib.registry_owner, lib.registers, lib.registry, lib.closure,
            tuple(map(str, lib.external)), lib.missing, lib.registrations,
            tuple((e.kind, e.defined, e.imported) for e in lib.entries))


def library_from_plain(plain: tuple) -> Library:
    (lib_id, path, role, soname, needed, runpath, needs_python, registry_owner, registers,
     registry, closure, external, missing, registrations, entries) = plain
    return Library(lib_id, Path(path), Role(role), soname, needed, runpath, needs_python,
                   registry_owner, registers, registry, closure, tuple(map(Path, external)),
                   missing, registrations, tuple(EntryPoints(*entry) for entry in entries))


def to_plain(inv: Inventory) -> tuple:
    """An inventory as plain values (what a cache entry may hold)."""
    files = tuple((str(path), facts.identity, facts_to(facts))
                  for path, facts in inv.link_map.files.items())
    links = tuple((str(requester), name, None if found is None else str(found))
                  for (requester, name), found in inv.link_map.links.items())
    through = tuple((str(requester), name, tuple(map(str, chain)),
                     None if found is None else str(found))
                    for (requester, name, chain), found in inv.link_map.through.items())
    return (inv.target, inv.name, inv.version, str(inv.root),
            tuple(map(library_to_plain, inv.libraries)), inv.warnings, files, links, through,
            inv.labels)


def from_plain(plain: object) -> Inventory:
    """The inventory `to_plain` gave; TypeError, ValueError, KeyError or IndexError for
    anything else."""
    if not isinstance(plain, tuple):
        raise TypeError("not an inventory")
    target, name, version, root, libraries, warnings, files, links, through, labels = plain
    link_map = LinkMap(
        {Path(path): facts_from(facts, Path(path), identity) for path, identity, facts in files},
        {(Path(requester), needed): None if found is None else Path(found)
         for requester, needed, found in links},
        {(Path(requester), needed, tuple(map(Path, chain))): None if found is None else Path(found)
         for requester, needed, chain, found in through})
    return Inventory(target, name, version, Path(root),
                     tuple(map(library_from_plain, libraries)), warnings, link_map, labels)
