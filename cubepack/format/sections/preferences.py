"""The ``preferences`` section (version 6 on): MemOS's preference memory (``pref_mem``), its
dense vectors pinned to the embedder that made them.

One entry for the cube's preference memory, by the file MemOS's config names for it: the model
role of its embedder (a pin of the ``models`` section, ``pref_mem.embedder``), each
collection's item count and their sum, the vectors' dimension, a sample of items by
``collection/id`` (what a report names), and, when pack was given the embedder, its vectors
for the lock's probe texts (its behavioural fingerprint). The items themselves stay in their
file, which the lock's files cover; a verifier draws its own sample to re-embed.

A private cube keeps the section in its encrypted manifest only (the sample names items).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ...errors import FormatError
from .files import FileEntry
from .locator import Locator
from .models import VectorsRecord

KEY = "preferences"
#: The lock version that added the section (a lock holding it is written at this version, so
#: an older cubepack refuses it by its version instead of half-reading it).
SINCE = 6
REQUIRED_KEYS = frozenset({"embedder", "collections", "count", "dimension", "sample"})
OPTIONAL_KEYS = frozenset({"probes"})


@dataclass(frozen=True)
class Preferences:
    """A preference memory: its file (the entry's name) and its locator, its embedder's model
    role, each collection's count, the vectors' dimension, a sample of item names, the probe
    vectors (None without ``pack --embedder``)."""

    file: str
    embedder: str
    collections: Mapping[str, int]
    count: int
    dimension: int
    sample: tuple[str, ...]
    probes: tuple[tuple[float, ...], ...] | None
    locator: Locator

    @property
    def vectors(self) -> VectorsRecord:
        """The section as a vectors record (what the embedder check compares with)."""
        return VectorsRecord(self.file, self.dimension, self.count, self.sample, self.probes)


def validate(value: Any, lock: Mapping[str, Any], probe_count: int) -> None:
    """Raise :class:`FormatError` naming what is wrong with a ``preferences`` value (file ->
    entry) of the lock document ``lock`` (``probe_count``: how many probe texts the lock's
    format defines)."""
    if not isinstance(value, dict) or not value:
        raise FormatError("cubepack.lock preferences must be a non-empty object (file -> entry).")
    if "encryption" in lock:
        raise FormatError("cubepack.lock preferences cannot sit in a private cube's public lock "
                          "(its sample names memories): a private cube keeps it in its "
                          "encrypted manifest.")
    for name, entry in value.items():
        _validate_entry(name, entry, lock, probe_count)


def _validate_entry(name: str, value: Any, lock: Mapping[str, Any], probe_count: int) -> None:
    def refuse(what: str) -> None:
        raise FormatError(f"cubepack.lock preferences {name!r} {what}.")

    if not isinstance(value, dict) or not REQUIRED_KEYS <= set(value) \
            or not set(value) <= REQUIRED_KEYS | OPTIONAL_KEYS:
        refuse(f"must hold the keys {sorted(REQUIRED_KEYS)} (and optionally "
               f"{sorted(OPTIONAL_KEYS)})")
    if name not in lock.get("files", {}):
        refuse("is not a file the lock's file list holds")
    if not isinstance(value["embedder"], str) or value["embedder"] not in lock.get("models", {}):
        refuse(f"names the embedder role {value['embedder']!r}, which the lock's models do not "
               "pin")
    for key in ("count", "dimension"):
        if type(value[key]) is not int or value[key] <= 0:
            refuse(f"{key} must be a positive integer")
    collections = value["collections"]
    if not (isinstance(collections, dict) and collections
            and all(isinstance(collection, str) and collection and type(n) is int and n > 0
                    for collection, n in collections.items())):
        refuse("collections must map each collection's name to its positive item count")
    if sum(collections.values()) != value["count"]:
        refuse(f"count {value['count']} is not the sum of its collections' counts "
               f"{sum(collections.values())}")
    sample = value["sample"]
    if not (isinstance(sample, list) and sample and len(set(sample)) == len(sample)
            and len(sample) <= value["count"]
            and all(isinstance(item, str) and item.partition("/")[0] in collections
                    and item.partition("/")[2] for item in sample)):
        refuse("sample must list distinct collection/id names of its collections")
    probes = value.get("probes")
    if probes is not None and not (
            isinstance(probes, list) and len(probes) == probe_count
            and all(isinstance(v, list) and len(v) == value["dimension"]
                    and all(type(x) in (int, float) for x in v) for v in probes)):
        refuse(f"probes must be {probe_count} vectors of dimension {value['dimension']}, or "
               "absent")


def describe(name: str, value: Mapping[str, Any]) -> str:
    """One line naming an entry, for diff and reports."""
    collections = value.get("collections") or {}
    return (f"preferences {name}: {value.get('count')} items "
            f"({', '.join(f'{name} {n}' for name, n in sorted(collections.items()))}), "
            f"dimension {value.get('dimension')}, embedder {value.get('embedder')}")


def parse(value: dict[str, Any], files: Mapping[str, FileEntry]) -> Mapping[str, Preferences]:
    """The typed section of a validated ``preferences`` value: file -> entry."""
    parsed = {}
    for name, entry in value.items():
        probes = entry.get("probes")
        parsed[name] = Preferences(
            file=name, embedder=entry["embedder"],
            collections=MappingProxyType(dict(entry["collections"])), count=entry["count"],
            dimension=entry["dimension"], sample=tuple(entry["sample"]),
            probes=None if probes is None else tuple(tuple(v) for v in probes),
            locator=files[name].locator)
    return MappingProxyType(parsed)
