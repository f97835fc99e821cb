"""The lock's sections as frozen values, one module per section, and the :class:`Lock` they
make. ``format/_lock.py`` registers each section (its validation, digest, diff, description,
attestation rule and typed parse) and parses a lock once, after its bytes are checked; every
reader outside ``format/`` reads these values, never the lock's JSON by key.

- ``locator``: where a memory's bytes are (:class:`Locator`), and the indexes a section may
  keep outside the lock, each fetched on its own (:class:`Index`);
- ``files``, ``models``, ``activations``, ``adapters``, ``lineage``, ``encryption``,
  ``preferences``, ``shards``: each section's entries (``shards``: activation memories many
  to a file, each shard's index kept outside the lock).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .activations import Activation, Provenance
from .adapters import Adapter
from .encryption import Encryption
from .files import FileEntry
from .lineage import Lineage
from .locator import Index, Locator
from .models import Pin, VectorsRecord
from .preferences import Preferences
from .shards import Shard, ShardIndex

__all__ = ["Activation", "Adapter", "Encryption", "FileEntry", "Index", "Lineage", "Lock",
           "Locator", "Pin", "Preferences", "Provenance", "Shard", "ShardIndex", "VectorsRecord"]


#: The sections holding memories' entries, each a memory kind's (``Lock.entries``).
MEMORY_SECTIONS = ("activations", "adapters", "preferences")


@dataclass(frozen=True, eq=False)
class Lock:
    """A parsed, validated ``cubepack.lock``: its fields and its sections as frozen values.
    An optional section the lock does not hold is empty (``adapters``, ``preferences``,
    ``shards``) or None (``lineage``, ``encryption``); :meth:`holds` tells a section's absence
    from its emptiness.

    The lock document (its JSON, key for key) is :meth:`to_dict`'s, for writers and JSON
    outputs; a lock is not read by key outside ``format/`` (``tests/test_owners.py``): a
    section's keys are its module's.
    """

    version: int
    cubepack_version: str
    cube_id: str | None
    content_digest: str
    digest: str
    files: Mapping[str, FileEntry]
    models: Mapping[str, Pin]
    activations: Mapping[str, Activation]
    adapters: Mapping[str, Adapter]
    lineage: Lineage | None
    encryption: Encryption | None
    #: The shards holding activation memories (lock version 6), by shard path, in their ids'
    #: order; their memories are in their indexes, not in ``activations``, until the lock is
    #: :func:`~cubepack.format.sections.shards.resolved`.
    shards: Mapping[str, Shard]
    preferences: Mapping[str, Preferences]
    document: Mapping[str, Any] = field(repr=False)

    @property
    def private(self) -> bool:
        """A private cube's (public) lock: its files are age ciphertexts."""
        return self.encryption is not None

    def vectors_record(self, role: str) -> VectorsRecord | None:
        """The vectors record of the model ``role`` pins (an embedder's), or None."""
        pin = self.models.get(role)
        return None if pin is None else pin.vectors

    def entries(self, key: str) -> Mapping[str, Any]:
        """The entries of the memory section ``key`` (``activations``, ``adapters``...): what
        a memory kind names its section by (its ``section``)."""
        if key not in MEMORY_SECTIONS:
            raise KeyError(f"{key!r} is not a memory section of the lock")
        return getattr(self, key)

    def holds(self, key: str) -> bool:
        """Does the lock hold the section (or field) ``key``?"""
        return key in self.document

    def to_dict(self) -> dict[str, Any]:
        """The lock document, a copy of its JSON key for key (what ``dumps`` writes)."""
        return copy.deepcopy(dict(self.document))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Lock):
            return self.document == other.document
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]
