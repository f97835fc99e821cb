"""The ``activations`` section: each activation memory (a KV cache) by item id: its locator,
producer role, shape facts and the label of how its producer is known (provenance)."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .files import FileEntry
from .locator import Locator


#: A provenance record's keys (``model``, ``tokens``, ``max_error``, ``at``, ``retokenized``:
#: what a recomputation or re-prefill measured).
PROVENANCE_KEYS = frozenset({"kind", "detail", "model", "tokens", "max_error", "at",
                             "retokenized"})


@dataclass(frozen=True)
class Provenance:
    """How an activation's producer is known: ``kind`` (a label of ``format/_provenance``)
    and ``detail``; what a recomputation or re-prefill measured (``model``, ``tokens``,
    ``max_error``, ``at``, ``retokenized``) when one did."""

    kind: str
    detail: str = ""
    model: str | None = None
    tokens: int | None = None
    max_error: float | None = None
    at: str | None = None
    retokenized: Any = None
    fields: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> Provenance:
        return cls(kind=value["kind"], detail=value.get("detail", ""), model=value.get("model"),
                   tokens=value.get("tokens"), max_error=value.get("max_error"),
                   at=value.get("at"), retokenized=value.get("retokenized"),
                   fields=MappingProxyType(value))

    def to_dict(self) -> dict[str, Any]:
        """The record as the lock stores it, key for key."""
        return dict(self.fields)


@dataclass(frozen=True)
class Activation:
    """One activation memory. ``provenance`` is None only in a version-1 lock (which recorded
    none). ``locator``: where its bytes are (today a whole file: ``file``)."""

    item_id: str
    file: str
    model_role: str
    token_count: int
    kv_dtype: str
    num_layers: int
    sha256: str
    provenance: Provenance | None
    locator: Locator
    #: The KV header's checksum record as a shard's index states it (the header's own must
    #: equal it at load); None for a memory that is a whole file (its lock records none).
    checksums: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str | None:
        """Its provenance label (None: a version-1 lock's, unlabelled)."""
        return None if self.provenance is None else self.provenance.kind


def parse(value: dict[str, Any], files: Mapping[str, FileEntry]) -> Mapping[str, Activation]:
    """The typed section of a validated ``activations`` value (``files``: the typed files
    section, which holds each activation's file)."""
    return MappingProxyType({
        item: Activation(
            item_id=item, file=entry["file"], model_role=entry["model_role"],
            token_count=entry["token_count"], kv_dtype=entry["kv_dtype"],
            num_layers=entry["num_layers"], sha256=entry["sha256"],
            provenance=(Provenance.of(entry["provenance"]) if "provenance" in entry else None),
            locator=Locator.whole(entry["file"], files[entry["file"]].size, entry["sha256"]))
        for item, entry in value.items()})


def activation_id_key(item_id: str) -> str:
    """An activation id as Unicode normalises it (NFKC, which NFC and NFD forms share): two
    ids with one key are one name to a normalising file system (macOS) and to whoever types
    it, and look alike anywhere, so a cube holds at most one of them."""
    return unicodedata.normalize("NFKC", item_id)


def duplicate_id(first: str, second: str) -> str:
    """Why two activation ids with one :func:`activation_id_key` cannot both be a cube's."""
    if first == second:
        return f"both carry the id {first!r}"
    return (f"carry the ids {first!r} and {second!r}, which differ only by Unicode "
            f"normalisation (both {activation_id_key(first)!r} in NFKC): one name on a "
            "normalising file system (macOS), and alike to whoever reads them")
