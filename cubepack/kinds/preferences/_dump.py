"""MemOS's preference memory as its dump writes it, read strictly. No MemOS import, no I/O
beyond the file it is given.

``PreferenceTextMemory.dump`` (MemOS 2.0.x, ``pref_mem``, backend ``pref_text``) writes one JSON
file: ``{collection: [item, ...]}`` for each collection of its vector store (MemOS's own
configuration names two, ``explicit_preference`` and ``implicit_preference``), each item a
``MilvusVecDBItem`` as ``to_dict()`` gives it: ``id`` (a UUID), ``memory`` (the preference's
context summary), ``original_text`` (the conversation it was extracted from), ``payload``
(its metadata: preference, preference_type, user, session, times...) and ``vector``, the dense
vector of ``memory`` made by the memory's embedder. That vector is what this kind pins: it is
meaningful only for its embedder.

Sparse vectors: MemOS's store (Milvus) also keeps a sparse vector per item, a BM25 function
of ``memory`` that the store computes when an item is inserted. A dump never carries it
(``MilvusVecDBItem`` has no such field and forbids unknown ones), so there is nothing of it to
pin: a preference cube holds dense vectors only, and an item that carries a sparse vector (or
any key MemOS's item does not define) is refused, never dropped: MemOS would refuse it too,
and a silently dropped key is a memory changed without anyone saying so.

The file's name is ``pref_mem.config.memory_filename``, whose default in MemOS 2.0.x is the
text memory's (``textual_memory.json``): two memories dumped at their defaults write one file,
the second overwriting the first. :func:`filename_collision` finds it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._util import canonical
from ...errors import FormatError
from ...memos_format._layout import DEFAULT_FILENAMES

#: The memory key of MemOS's cube config, and its model role for the embedder (as
#: ``memos_format._layout.roles`` names it).
MEMORY_KEY = "pref_mem"
EMBEDDER_ROLE = "pref_mem.embedder"
#: The collections MemOS's own preference memory configuration names.
COLLECTIONS = ("explicit_preference", "implicit_preference")
#: MemOS 2.0.x's default ``memory_filename`` of a preference memory: the text memory's.
DEFAULT_FILENAME = DEFAULT_FILENAMES[MEMORY_KEY]
#: The name a cube should give its preference memory (what the collision's fix sets).
SUGGESTED_FILENAME = "preference_memory.json"
#: An item's keys as MemOS's ``MilvusVecDBItem.to_dict()`` writes them: each required but
#: ``score`` (a search result's, absent from a dump's items).
ITEM_KEYS = frozenset({"id", "memory", "original_text", "payload", "vector"})
OPTIONAL_KEYS = frozenset({"score"})
#: What a sparse vector is called where a store or a hand keeps one beside the dense vector.
SPARSE_KEYS = frozenset({"sparse_vector", "sparse", "sparse_embedding"})


@dataclass(frozen=True)
class Item:
    """One preference: its collection, id, the text its vector embeds, and its vector."""

    collection: str
    id: str
    memory: str
    vector: tuple[float, ...]

    @property
    def key(self) -> str:
        """``collection/id``: an item's name in the lock's sample and in messages."""
        return f"{self.collection}/{self.id}"


def read(path: Path) -> dict[str, Any]:
    """The dump at ``path`` (see :func:`parse`)."""
    return parse(path.read_bytes(), path.name)


def parse(data: bytes, name: str) -> dict[str, Any]:
    """The dump ``data`` (the file ``name``) as strict JSON (``{collection: [item]}``), its
    shape checked by :func:`items`.

    Raises:
        FormatError: not strict JSON (a key named twice included), or not a preference
            memory's dump.
    """
    try:  # a key named twice is ambiguous (readers keep one or the other): refused
        parsed = canonical.loads_strict(data, object_pairs_hook=canonical.unique_pairs)
    except ValueError as exc:
        raise FormatError(f"{name} is not valid JSON: {exc}") from exc
    items(parsed, name)
    return parsed


def items(data: Any, name: str) -> list[Item]:
    """Every item of a parsed dump, in file order.

    Raises:
        FormatError: naming the item and what is wrong: not ``{collection: [item]}``, an item
            without one of :data:`ITEM_KEYS`, with a key MemOS's item does not define (a
            sparse vector among them), an id that is not a UUID or repeats, a vector that is
            not a non-empty list of numbers.
    """
    if not isinstance(data, dict):
        raise FormatError(f"{name} is not a preference memory's dump: MemOS writes "
                          "{collection: [item, ...]}, found " + type(data).__name__ + ".")
    found, seen = [], set()
    for collection, entries in data.items():
        if not collection or not isinstance(entries, list):
            raise FormatError(f"{name}: collection {collection!r} must be a list of items.")
        for index, entry in enumerate(entries):
            where = f"{name}: item {index} of {collection!r}"
            if not isinstance(entry, dict):
                raise FormatError(f"{where} is not an object.")
            sparse = sorted(SPARSE_KEYS & set(entry))
            if sparse:
                raise FormatError(
                    f"{where} carries a sparse vector ({sparse[0]!r}). A preference cube pins "
                    "dense vectors only: MemOS's store computes the sparse (BM25) vector from "
                    "the item's memory text when it inserts it, and its dump writes none. "
                    f"Remove {sparse[0]!r} from the items and pack again.")
            missing = sorted(ITEM_KEYS - set(entry))
            unknown = sorted(set(entry) - ITEM_KEYS - OPTIONAL_KEYS)
            if missing or unknown:
                raise FormatError(f"{where} must hold exactly the keys {sorted(ITEM_KEYS)} "
                                  f"(MemOS's preference item); "
                                  + (f"missing {missing}" if missing else f"found {unknown}")
                                  + ".")
            item_id, memory, vector = entry["id"], entry["memory"], entry["vector"]
            if not isinstance(item_id, str) or not _is_uuid(item_id):
                raise FormatError(f"{where}: its id {item_id!r} is not a UUID (MemOS's items "
                                  "are named by one).")
            if item_id in seen:
                raise FormatError(f"{name} holds two items with the id {item_id!r} (a check "
                                  "could read one and MemOS load the other).")
            seen.add(item_id)
            if not isinstance(memory, str) or not isinstance(entry["original_text"], str) \
                    or not isinstance(entry["payload"], dict):
                raise FormatError(f"{where}: memory and original_text must be text, payload "
                                  "an object.")
            if not isinstance(vector, list) or not vector \
                    or not all(type(x) in (int, float) for x in vector):
                raise FormatError(f"{where}: its vector is not a non-empty list of numbers.")
            found.append(Item(collection, item_id, memory, tuple(float(x) for x in vector)))
    return found


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


#: Items a check re-embeds (all, when the memory holds fewer), drawn by the verifier.
SAMPLE_SIZE = 16


def record(found: list[Item], name: str) -> dict[str, Any]:
    """The lock's ``preferences`` value for the dump ``name`` (without probes: pack adds them
    with ``--embedder``).

    Raises:
        FormatError: no item, or vectors of several dimensions (one embedder cannot have made
            them all).
    """
    if not found:
        raise FormatError(f"{name} holds no preference: nothing to pin.")
    dimensions = sorted({len(item.vector) for item in found})
    if len(dimensions) != 1:
        raise FormatError(f"{name} mixes vectors of dimensions {dimensions}: one embedder "
                          "cannot have made them all.")
    collections: dict[str, int] = {}
    for item in found:
        collections[item.collection] = collections.get(item.collection, 0) + 1
    return {"file": name, "embedder": EMBEDDER_ROLE, "collections": collections,
            "count": len(found), "dimension": dimensions[0],
            "sample": sorted(item.key for item in found)[:SAMPLE_SIZE]}


def with_vectors(data: dict[str, Any], fresh: Mapping[str, list[float]]) -> dict[str, Any]:
    """The parsed dump ``data`` with each item ``fresh`` names (by ``collection/id``) given its
    new vector, everything else as it was (``migrate --embedder``).

    Raises:
        FormatError: ``fresh`` names an item the dump does not hold.
    """
    replaced = set()
    out = {}
    for collection, entries in data.items():
        out[collection] = []
        for entry in entries:
            key = f"{collection}/{entry['id']}"
            if key in fresh:
                entry = {**entry, "vector": list(fresh[key])}
                replaced.add(key)
            out[collection].append(entry)
    missing = sorted(set(fresh) - replaced)
    if missing:
        raise FormatError(f"the preference memory holds no item {missing[0]!r}.")
    return out


# --- where MemOS writes it -----------------------------------------------------------------------

def _memory_config(config: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    """``config[key]``'s inner config when that memory is initialised, else None."""
    section = config.get(key)
    if not isinstance(section, dict) or section.get("backend") in (None, "uninitialized"):
        return None
    inner = section.get("config")
    return inner if isinstance(inner, dict) else {}


def filename(config: Mapping[str, Any], default: str = DEFAULT_FILENAME) -> str | None:
    """The file MemOS's preference memory reads and writes (its ``memory_filename``, or MemOS's
    default), as written in ``config``; None when the cube config has no preference memory."""
    inner = _memory_config(config, MEMORY_KEY)
    if inner is None:
        return None
    name = inner.get("memory_filename")
    return name if isinstance(name, str) and name else default


def filename_collision(config: Mapping[str, Any], opened: Any) -> str | None:
    """Why the cube config makes the preference memory and the text memory write one file, or
    None. ``opened(name)`` is the path MemOS opens for a name (``./x`` is ``x``): the one rule
    of ``memos_format``.

    MemOS 2.0.x gives both memories ``textual_memory.json`` by default, so a cube dumped with
    both at their defaults holds only the memory dumped last (the preference memory): the
    text memory was overwritten, and each memory's load reads the other's items."""
    pref = filename(config)
    text_inner = _memory_config(config, "text_mem")
    if pref is None or text_inner is None:
        return None
    text = text_inner.get("memory_filename")
    text = text if isinstance(text, str) and text else DEFAULT_FILENAMES["text_mem"]
    if opened(pref) is None or opened(pref) != opened(text):
        return None
    return (f"config.json gives the preference memory (pref_mem) and the text memory (text_mem) "
            f"one file, {opened(pref)!r} (MemOS's default for both), so the memory MemOS dumped "
            "last overwrote the other and each one's load would read the other's items. Set "
            f'"memory_filename": "{SUGGESTED_FILENAME}" in pref_mem.config of the MemOS config '
            "you dump the cube with, dump it again, then pack it.")
