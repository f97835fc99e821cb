"""The ``lineage`` section (version 3 on): the cube this one was derived from, and what
changed (see ``trust/_lineage.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

#: A parent link: the parent lock's digests and id (what a deriving step read), then the Hub
#: repo and commit it was pulled from (a pull's origin record). The one definition; the
#: attestation's link and origin are its two parts (:meth:`Parent.link`, :meth:`Parent.origin`).
PARENT_LINK_KEYS = ("lock_digest", "content_digest", "cube_id")
PARENT_ORIGIN_KEYS = ("repo_id", "revision")


@dataclass(frozen=True)
class Parent:
    """The parent: its lock's digests and id (what a deriving step read), and the Hub repo and
    commit it was pulled from (both None when it was not pulled)."""

    lock_digest: str
    content_digest: str
    cube_id: str | None
    repo_id: str | None
    revision: str | None

    def link(self) -> dict[str, Any]:
        """What a deriving step read of its parent, by :data:`PARENT_LINK_KEYS`."""
        return {"lock_digest": self.lock_digest, "content_digest": self.content_digest,
                "cube_id": self.cube_id}

    def origin(self) -> dict[str, Any]:
        """Where the parent was pulled from, by :data:`PARENT_ORIGIN_KEYS` (both None: it
        was not pulled)."""
        return {"repo_id": self.repo_id, "revision": self.revision}

    @property
    def pulled(self) -> bool:
        return self.repo_id is not None or self.revision is not None


@dataclass(frozen=True)
class ModelChange:
    """A model role moved to another model (``from``/``to``: names; their weights digests)."""

    source: str
    target: str
    source_weights: str
    target_weights: str


@dataclass(frozen=True)
class Changes:
    models: Mapping[str, ModelChange]
    retokenized: tuple[str, ...]
    reembedded: int
    adapters_dropped: tuple[str, ...]
    #: (from, to) embedder names when the embedder changed, else None.
    embedder: tuple[str, str] | None


@dataclass(frozen=True)
class Lineage:
    parent: Parent
    changes: Changes
    tool: str
    cubepack_version: str
    fields: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The section as the lock stores it, key for key."""
        return _thaw(self.fields)

    def parent_fields(self) -> dict[str, Any]:
        """Its parent as the lock stores it (what ``cubepack lineage`` shows)."""
        return _thaw(self.fields["parent"])

    def changes_fields(self) -> dict[str, Any]:
        """What changed, as the lock stores it (what an attestation's lineage block and
        ``cubepack lineage`` repeat, key for key)."""
        return _thaw(self.fields["changes"])


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _thaw(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_thaw(item) for item in value]
    return value


def parse(value: dict[str, Any]) -> Lineage:
    """The typed section of a validated ``lineage`` value."""
    parent, changes = value["parent"], value["changes"]
    embedder = changes.get("embedder")
    return Lineage(
        parent=Parent(parent["lock_digest"], parent["content_digest"], parent["cube_id"],
                      parent["repo_id"], parent["revision"]),
        changes=Changes(
            models=MappingProxyType({role: ModelChange(c["from"], c["to"], c["from_weights"],
                                                       c["to_weights"])
                                     for role, c in changes["models"].items()}),
            retokenized=tuple(changes["retokenized"]), reembedded=changes["reembedded"],
            adapters_dropped=tuple(changes["adapters_dropped"]),
            embedder=None if embedder is None else (embedder["from"], embedder["to"])),
        tool=value["tool"], cubepack_version=value["cubepack_version"],
        fields=MappingProxyType(value))
