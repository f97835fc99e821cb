"""The ``encryption`` section (version 5 on): a private cube's lock, whose files are age
ciphertexts (see ``ops/_encrypt.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Counts:
    """The public counts of a private cube (what anyone may know of it): its files, its
    recipients, and each memory kind's count under its lock section's key (``memories``:
    ``{"activations": 2, "adapters": 1}``, whatever kinds the writer counted)."""

    files: int
    recipients: int
    memories: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "memories", MappingProxyType(dict(self.memories)))

    def of(self, section: str) -> int:
        """The count of the memories in lock section ``section`` (0: none counted)."""
        return self.memories.get(section, 0)

    def to_dict(self) -> dict[str, int]:
        """The counts as the lock stores them (a memory kind's under its section's key)."""
        return {"files": self.files, **self.memories, "recipients": self.recipients}


@dataclass(frozen=True)
class Encryption:
    """``version`` of the section; ``manifest``: the encrypted clear lock's file;
    ``ciphertexts``: every other ciphertext, sorted; ``series`` and ``generation`` (section
    version 2 on, else None): which private cube this is and its write count."""

    version: int
    scheme: str
    manifest: str
    ciphertexts: tuple[str, ...]
    counts: Counts
    hidden_names: bool
    series: str | None
    generation: int | None

    def to_dict(self) -> dict[str, Any]:
        """The section as the lock stores it."""
        value: dict[str, Any] = {
            "version": self.version, "scheme": self.scheme, "manifest": self.manifest,
            "ciphertexts": list(self.ciphertexts), "hidden_names": self.hidden_names,
            "counts": self.counts.to_dict()}
        if self.version >= 2:
            value |= {"series": self.series, "generation": self.generation}
        return value


def parse(value: dict[str, Any]) -> Encryption:
    """The typed section of a validated ``encryption`` value."""
    counts = value["counts"]
    return Encryption(
        version=value["version"], scheme=value["scheme"], manifest=value["manifest"],
        ciphertexts=tuple(value["ciphertexts"]),
        counts=Counts(counts["files"], counts["recipients"],
                      {key: n for key, n in counts.items() if key not in ("files", "recipients")}),
        hidden_names=value["hidden_names"], series=value.get("series"),
        generation=value.get("generation"))
