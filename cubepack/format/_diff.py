"""``cubepack diff A B``: what changed between two cubes (or two lock files). Pure comparison
of parsed locks, derived from the lock's section registry (:data:`._lock.SECTIONS`): every
section, every entry, every leaf that differs, and the lock's own fields, so every change that
moves a digest is named, including sections added or removed (a pull request that adds a
lineage) and keys no section of this cubepack knows.

What backs a changed pin is not this module's to say (``cubepack.diff`` adds it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._util import canonical, constants
from ..errors import UsageError
from . import _lock as lockfile


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
