"""``cubepack diff A B``: what changed between two cubes (or two lock files). Pure comparison
of parsed locks, derived from the lock's section registry (:data:`._lock.SECTIONS`): every
section, every entry, every leaf that differs, and the lock's own fields, so every change that
moves a digest is named, including sections added or removed (a pull request that adds a
lineage) and keys no section of this cubepack knows.

Per memory (:func:`memory_diff`): two cube folders' activation memories compared by digest,
wherever they are stored (one file each, or ranges of shards), read from the lock and the shard
indexes: an index both cubes hold (by its sha256) holds the same memories and is not read, and
no shard's bytes are ever read (each memory's sha256 is its index's).

What backs a changed pin is not this module's to say (``cubepack.diff`` adds it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._util import canonical, constants
from ..errors import UsageError
from . import _lock as lockfile
from .sections import Activation, Lock
from .sections import shards as shardformat


def load_lock(path: str | Path) -> dict[str, Any]:
    """A validated lock's document (diff compares the JSON the registry's sections describe)
    from a cube folder or a ``cubepack.lock`` file.

    Raises:
        UsageError: the path is neither a packed cube nor a lock file.
    """
    path = Path(path)
    if path.is_dir():
        path = path / constants.LOCK_FILENAME
    if not path.is_file():
        raise UsageError(f"{path.parent if path.name == constants.LOCK_FILENAME else path} is not "
                         "a packed cube (it has no cubepack.lock) nor a lock file; pack it "
                         "first (cubepack pack).")
    return lockfile.parse(path.read_bytes()).to_dict()


def leaves(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """Every leaf that differs from ``old`` to ``new``, by dotted path (objects are descended;
    lists and scalars compared whole). A key on one side only is a leaf too."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in old or key not in new:
                found.append({"field": where, "old": old.get(key), "new": new.get(key)})
            else:
                found += leaves(old[key], new[key], where)
        return found
    # Equal as the digests see them: canonical JSON (Python's == takes 1 for 1.0 and True).
    same = canonical.dumps(old, compact=True) == canonical.dumps(new, compact=True)
    return [] if same else [{"field": path, "old": old, "new": new}]


def diff_locks(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Differences from ``old`` to ``new`` (both parsed locks): per section of the registry,
    the entries added, removed and changed (with every changed leaf), then the lock's fields
    and any other key."""
    sections: dict[str, Any] = {}
    for section in lockfile.SECTIONS:
        before = section.entries(old[section.key]) if section.key in old else {}
        after = section.entries(new[section.key]) if section.key in new else {}
        changed = {name: found for name in sorted(set(before) & set(after))
                   if (found := leaves(before[name], after[name]))}
        entry = {"added": sorted(set(after) - set(before)),
                 "removed": sorted(set(before) - set(after)),
                 "changed": changed,
                 "describe": {name: section.describe(name, after.get(name, before.get(name)))
                              for name in sorted(set(before) | set(after))
                              if name not in before or name not in after or name in changed}}
        if entry["added"] or entry["removed"] or changed:
            sections[section.key] = entry
    known = set(lockfile.FIELDS) | set(lockfile.SECTION_KEYS)
    fields = [change for key in sorted((set(old) | set(new)) - set(lockfile.SECTION_KEYS))
              for change in leaves({key: old.get(key)}, {key: new.get(key)})
              if key not in ("digest", "content_digest")]
    return {
        "sections": sections,
        "lock": fields,
        "unknown_keys": sorted((set(old) | set(new)) - known),
        "content_digest": {"old": old["content_digest"], "new": new["content_digest"]},
        "digest": {"old": old["digest"], "new": new["digest"]},
        "same": old["digest"] == new["digest"],
    }


def memory_diff(a: str | Path, b: str | Path) -> dict[str, Any] | None:
    """The activation memories added, removed and changed (by sha256, and the facts recorded
    beside it) from cube folder ``a`` to ``b``, or None when either is a lock file (its
    indexes are not there). Each index read is checked against its lock first.

    Returns:
        ``{"added": [ids], "removed": [ids], "changed": {id: [leaves]}, "unchanged": n,
        "indexes_read": n}``.
    """
    folders = [Path(a), Path(b)]
    if not all(folder.is_dir() for folder in folders):
        return None
    old, new = (lockfile.parse((folder / constants.LOCK_FILENAME).read_bytes())
                for folder in folders)
    shared = _index_digests(old) & _index_digests(new)
    (before, read_old), (after, read_new) = (_memories(lock, folder, shared)
                                             for lock, folder in ((old, folders[0]),
                                                                  (new, folders[1])))
    changed = {item: found for item in sorted(set(before) & set(after))
               if (found := leaves(before[item], after[item]))}
    skipped = sum(shard.memories for shard in new.shards.values()
                  if new.files[shard.index].sha256 in shared)
    return {"added": sorted(set(after) - set(before)),
            "removed": sorted(set(before) - set(after)),
            "changed": changed,
            "unchanged": len(set(before) & set(after)) - len(changed) + skipped,
            "indexes_read": read_old + read_new}


def _index_digests(lock: Lock) -> set[str]:
    return {lock.files[shard.index].sha256 for shard in lock.shards.values()}


def _memories(lock: Lock, folder: Path, shared: set[str]) -> tuple[dict[str, Any], int]:
    """(id -> what diff compares of it, indexes read): the lock's own memories and those of
    each shard whose index is not in ``shared``."""
    held = {item: _compared(entry) for item, entry in lock.activations.items()}
    read = 0
    fetch = shardformat.local_fetch(folder)
    for shard in lock.shards.values():
        if lock.files[shard.index].sha256 in shared:
            continue
        index = shardformat.load_index(shard, fetch, lock.models)
        read += 1
        held.update({item: _compared(entry) for item, entry in index.memories.items()})
    return held, read


def _compared(entry: Activation) -> dict[str, Any]:
    """A memory as diff compares it: its bytes' digest and the facts recorded beside it, not
    where it is stored (a file, a shard's range)."""
    return {"sha256": entry.locator.sha256, "model_role": entry.model_role,
            "token_count": entry.token_count, "kv_dtype": entry.kv_dtype,
            "num_layers": entry.num_layers,
            "provenance": entry.provenance.to_dict() if entry.provenance is not None else None}
