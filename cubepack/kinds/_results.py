"""What ``pack`` and ``migrate`` return: the cube they wrote, its digests, and each memory
kind's fields (filled by the kind's ``finish`` and ``migrate`` phases)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..format import _lock as lockfile


@dataclass
class PackResult:
    """What ``pack`` did: where, the lock's digests, the pins and the activations."""

    cube_dir: Path
    digest: str
    content_digest: str
    files: int
    models: dict[str, dict[str, Any]]
    activations: list[str] = field(default_factory=list)
    converted: list[str] = field(default_factory=list)
    #: item -> what ``pack --recompute`` proved (positions, errors, the behavioural check)
    recomputed: dict[str, str] = field(default_factory=dict)
    changed: bool = True
    #: role -> the pin the cube's last pack recorded, for each pin this pack moved
    moved_from: dict[str, str] = field(default_factory=dict)
    #: adapter name -> its digest, its base's role and how pack found the base
    adapters: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: item -> the command that adds per-tensor checksums, for each KV file of format 2 this
    #: pack sealed (its bytes checked against the cube's last lock)
    unchecksummed: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cube_dir": str(self.cube_dir), "digest": self.digest,
            "content_digest": self.content_digest, "files": self.files,
            "models": {role: {"repo_id": made.repo_id, "revision": made.revision,
                              "strict": made.strict, "name": made.name, "reason": made.reason,
                              "pinned": made.pinned}
                       for role in self.models
                       if (made := lockfile.typed_pin(role, self.models[role]))},
            "activations": self.activations, "converted": self.converted,
            "recomputed": self.recomputed, "changed": self.changed,
            "moved_from": self.moved_from, "adapters": self.adapters,
            "unchecksummed": self.unchecksummed,
        }


@dataclass
class MigrateResult:
    """What ``migrate`` built: the new cube, its lock digests, and what changed."""

    cube_dir: Path
    parent_dir: Path
    digest: str
    content_digest: str
    #: item -> {"tokens": n, "retokenized": why, or None when its stored ids were prefilled}
    activations: dict[str, dict[str, Any]] = field(default_factory=dict)
    reembedded: int = 0
    #: adapter name -> the files left out of the new cube
    adapters_dropped: dict[str, list[str]] = field(default_factory=dict)
    lineage: dict[str, Any] = field(default_factory=dict)

    @property
    def retokenized(self) -> list[str]:
        return sorted(item for item, entry in self.activations.items() if entry["retokenized"])

    def to_dict(self) -> dict[str, Any]:
        return {"cube_dir": str(self.cube_dir), "parent_dir": str(self.parent_dir),
                "digest": self.digest, "content_digest": self.content_digest,
                "activations": self.activations, "retokenized": self.retokenized,
                "reembedded": self.reembedded, "adapters_dropped": self.adapters_dropped,
                "lineage": self.lineage}
