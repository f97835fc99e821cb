"""Where a memory's bytes are: a :class:`Locator` (file, offset, length, digest), never "its
file"; and the indexes a section may keep outside the lock, each fetched on its own.

Today every memory is a whole file (offset 0, length its size, digest its file's sha256).
A cube that stores many memories to one file (issue #40) gives each a range of it; readers
that address memories by locator read that range and check its digest, unchanged.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import FormatError

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Locator:
    """A memory's bytes: ``length`` bytes of ``path`` (relative to the cube) from ``offset``,
    whose sha256 is ``sha256``."""

    path: str
    offset: int
    length: int
    sha256: str

    @classmethod
    def whole(cls, path: str, size: int, sha256: str) -> Locator:
        """A memory that is a whole file (every memory of a cube today)."""
        return cls(path, 0, size, sha256)

    @property
    def end(self) -> int:
        return self.offset + self.length

    def check(self, data: bytes) -> bytes:
        """``data`` if it is this locator's bytes (its length and sha256); else a
        FormatError naming what differed."""
        if len(data) != self.length:
            raise FormatError(f"{self.path} [{self.offset}:{self.end}] is {len(data)} bytes, "
                              f"expected {self.length}.")
        found = hashlib.sha256(data).hexdigest()
        if found != self.sha256:
            raise FormatError(f"{self.path} [{self.offset}:{self.end}] hashes to {found}, "
                              f"expected {self.sha256}.")
        return data


@dataclass(frozen=True)
class Index:
    """A section kept outside the lock, in a file of its own that a reader fetches on its own
    (a shard's index, issue #40): the lock holds its :class:`Locator`, so the index is
    covered by the lock's digests without its entries being in it. ``parse(data, locator)``
    turns the index's bytes, checked against the locator first, into its frozen entries."""

    key: str
    parse: Callable[[bytes, Locator], Any]

    def load(self, locator: Locator, fetch: Callable[[Locator], bytes]) -> Any:
        """Fetch the index's bytes (``fetch`` reads the locator's range, locally or over
        HTTP), check them against the locator, then parse them: never parsed unchecked."""
        return self.parse(locator.check(fetch(locator)), locator)


#: The sections kept outside the lock, by key (none yet: each registers with
#: :func:`register_index` from its own section module).
INDEXES: dict[str, Index] = {}


def register_index(index: Index) -> Index:
    """Declare a section kept outside the lock; a key is declared once."""
    if index.key in INDEXES:
        raise ValueError(f"the index {index.key!r} is already declared")
    INDEXES[index.key] = index
    return index
