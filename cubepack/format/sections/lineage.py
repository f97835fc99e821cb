"""The ``lineage`` section (version 3 on): the cube this one was derived from, and what
changed (see ``trust/_lineage.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
class ChangeKey:
    """A key of the lineage's ``changes``: what one memory kind's migrate states changed.
    Declared once (:func:`register_change`) by the section module of the kind that writes it,
    so a new kind's changes need no edit of the lineage's format: the lock version that
    added the key (``since``) decides whether a lock may hold it (a lock stating it is of that
    version at least: ``build_lock``), and, unless ``optional``, must. A kind added after
    lineage declares its changes optional (stated when it changed something), so the locks
    written before it stay what they were."""

    key: str
    #: the lock version that added it: required from it on (unless optional), refused before
    since: int
    #: None when ``value`` is well-formed, else what it must be ("must be ...", or
    #: ".inner.path must be ..." for a part of it)
    check: Callable[[Any], str | None]
    #: what a lineage states when the kind changed nothing (None: optional, then left out)
    default: Any = None
    #: there only when something changed (``embedder``)
    optional: bool = False
    #: how a writer normalises it (a list of names sorted)
    normal: Callable[[Any], Any] = lambda value: value


#: Every key a lineage's ``changes`` may hold, by name, in the order they were declared.
CHANGES: dict[str, ChangeKey] = {}


def register_change(change: ChangeKey) -> ChangeKey:
    """Declare a key of the lineage's changes (a kind's section module does, once)."""
    if change.key in CHANGES:
        raise ValueError(f"the lineage change {change.key!r} is declared twice")
    CHANGES[change.key] = change
    return change


def _names(value: Any) -> str | None:
    if isinstance(value, list) and all(isinstance(n, str) and n for n in value) \
            and len(set(value)) == len(value):
        return None
    return "must be a list of distinct non-empty strings"


def _count(value: Any) -> str | None:
    return None if type(value) is int and value >= 0 else "must be a non-negative integer"


def _texts(value: Any, keys: tuple[str, ...]) -> bool:
    return isinstance(value, dict) and set(value) == set(keys) and all(
        isinstance(value[key], str) and value[key] for key in keys)


#: A model change's keys (``changes.models.<role>``).
MODEL_CHANGE_KEYS = ("from", "to", "from_weights", "to_weights")


def _models(value: Any) -> str | None:
    if not isinstance(value, dict):
        return "must be an object"
    for role, change in value.items():
        if not isinstance(change, dict) or set(change) != set(MODEL_CHANGE_KEYS):
            return (f".{role} must hold the keys {sorted(MODEL_CHANGE_KEYS)}, found "
                    f"{sorted(change) if isinstance(change, dict) else type(change).__name__}")
        for key in MODEL_CHANGE_KEYS:
            if not (isinstance(change[key], str) and change[key]):
                return f".{role}.{key} must be a non-empty string"
    return None


# The keys of lock version 3, when lineage came (the activations', adapters' and vectors'
# kinds write them; the kinds without a section of their own are declared here).
MODELS = register_change(ChangeKey("models", 3, _models, {}))
RETOKENIZED = register_change(ChangeKey("retokenized", 3, _names, [], normal=sorted))
REEMBEDDED = register_change(ChangeKey("reembedded", 3, _count, 0))
ADAPTERS_DROPPED = register_change(ChangeKey("adapters_dropped", 3, _names, [],
                                             normal=sorted))
EMBEDDER = register_change(ChangeKey(
    "embedder", 3, lambda value: None if _texts(value, ("from", "to"))
    else "must hold exactly 'from' and 'to', non-empty strings", optional=True))


def change_problem(version: int, changes: Any) -> str | None:
    """What is wrong with a lineage's ``changes`` in a lock of ``version`` (None: nothing):
    exactly the keys declared for that version (the optional ones if present), each
    well-formed."""
    known = {key: change for key, change in CHANGES.items() if change.since <= version}
    required = {key for key, change in known.items() if not change.optional}
    if not isinstance(changes, dict):
        return "changes must be an object"
    if not required <= set(changes) <= set(known):
        optional = sorted(set(known) - required)
        return (f"changes must hold the keys {sorted(required)}"
                + (f" (and optionally {optional})" if optional else "")
                + f", found {sorted(changes)}")
    for key in sorted(changes):
        problem = known[key].check(changes[key])
        if problem:
            return f"changes.{key}{'' if problem.startswith('.') else ' '}{problem}"
    return None


def stated_changes(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """The ``changes`` a new lineage states, from what the kinds ``recorded`` (key -> value):
    every required key (its default where nothing was recorded) and every optional one
    recorded, each normalised.

    Raises:
        ValueError: a recorded key no section declared.
    """
    # An optional change recorded as None did not happen (the embedder kept): left out.
    recorded = {key: value for key, value in recorded.items()
                if value is not None or key not in CHANGES or not CHANGES[key].optional}
    unknown = sorted(key for key in recorded if key not in CHANGES)
    if unknown:
        raise ValueError(f"no lock section declares the lineage changes {unknown}")
    return {key: change.normal(recorded[key] if key in recorded else change.default)
            for key, change in CHANGES.items() if key in recorded or not change.optional}


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
    #: every other declared change (a later kind's), key -> value as stored
    others: Mapping[str, Any] = field(default_factory=dict)


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


_CORE = frozenset({"models", "retokenized", "reembedded", "adapters_dropped", "embedder"})


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
            embedder=None if embedder is None else (embedder["from"], embedder["to"]),
            others=MappingProxyType({key: _thaw(item) for key, item in changes.items()
                                     if key not in _CORE})),
        tool=value["tool"], cubepack_version=value["cubepack_version"],
        fields=MappingProxyType(value))
