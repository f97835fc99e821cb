"""The ``models`` section: each model role's pin (the model, its revision, its identity) and,
for an embedder, the record of the vectors it made."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ...identity._identity import ModelIdentity
from .locator import Locator


@dataclass(frozen=True)
class VectorsRecord:
    """What an embedder made (``models[role].vectors``): the vectors file, their dimension and
    count, a sample of the memories it embedded, the probe texts' vectors (its behavioural
    fingerprint; None in records written before them)."""

    file: str
    dimension: int
    count: int
    sample: tuple[str, ...]
    probes: tuple[tuple[float, ...], ...] | None

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> VectorsRecord:
        probes = value.get("probes")
        return cls(value["file"], value["dimension"], value["count"], tuple(value["sample"]),
                   None if probes is None else tuple(tuple(v) for v in probes))


@dataclass(frozen=True)
class Pin:
    """A model role's pin. ``identity`` is None for an informational model that could not be
    pinned (``reason`` says why); ``identity_fields`` is the identity as the lock stores it
    (what an attestation or a JSON report repeats, key for key)."""

    role: str
    name: str | None
    strict: bool
    repo_id: str | None
    revision: str | None
    identity: ModelIdentity | None
    reason: str | None
    vectors: VectorsRecord | None
    identity_fields: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    fields: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self, *, vectors: bool = True) -> dict[str, Any]:
        """The pin as the lock stores it, key for key (``vectors=False``: without its vectors
        record, as a private cube's public lock states it)."""
        return {key: copy.deepcopy(value) for key, value in self.fields.items()
                if vectors or key != "vectors"}

    @property
    def pinned(self) -> bool:
        """Has an identity (a strict pin always does)."""
        return self.identity is not None

    @property
    def where(self) -> str | None:
        """``repo_id@revision`` when the pin names both, else None."""
        return f"{self.repo_id}@{self.revision}" if self.repo_id and self.revision else None

    def vectors_locator(self, files: Mapping[str, Any]) -> Locator | None:
        """The vectors file's locator (``files``: the lock's typed files), or None."""
        if self.vectors is None or self.vectors.file not in files:
            return None
        return files[self.vectors.file].locator


def parse(value: dict[str, Any], version: int) -> Mapping[str, Pin]:
    """The typed section of a validated ``models`` value (``version``: the lock's; version 1
    identities have no compute config)."""
    pins = {}
    for role, pin in value.items():
        identity = pin.get("identity")
        pins[role] = Pin(
            role=role, name=pin.get("name"), strict=pin.get("strict", False) is True,
            repo_id=pin.get("repo_id"), revision=pin.get("revision"),
            identity=(None if identity is None
                      else ModelIdentity.from_dict(identity, legacy=version == 1)),
            reason=pin.get("reason"),
            vectors=VectorsRecord.of(pin["vectors"]) if "vectors" in pin else None,
            identity_fields=None if identity is None else MappingProxyType(identity),
            fields=MappingProxyType(pin))
    return MappingProxyType(pins)
