"""The ``files`` section: every file of the cube but the lock, ``path -> {sha256, size}``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .locator import Locator


@dataclass(frozen=True)
class FileEntry:
    """One locked file: its path in the cube, sha256 and size."""

    path: str
    sha256: str
    size: int

    @property
    def locator(self) -> Locator:
        return Locator.whole(self.path, self.size, self.sha256)

    def to_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size}


def parse(value: dict[str, Any]) -> Mapping[str, FileEntry]:
    """The typed section of a validated ``files`` value."""
    return MappingProxyType({path: FileEntry(path, entry["sha256"], entry["size"])
                             for path, entry in value.items()})
