"""The ``encryption`` section (version 5 on): a private cube's lock, whose files are age
ciphertexts (see ``ops/_encrypt.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Counts:
    """The public counts of a private cube (what anyone may know of it)."""

    files: int
    activations: int
    adapters: int
    recipients: int

    def to_dict(self) -> dict[str, int]:
        """The counts as the lock stores them (a memory kind's under its section's key)."""
        return {"files": self.files, "activations": self.activations,
                "adapters": self.adapters, "recipients": self.recipients}


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
        counts=Counts(counts["files"], counts["activations"], counts["adapters"],
                      counts["recipients"]),
        hidden_names=value["hidden_names"], series=value.get("series"),
        generation=value.get("generation"))
