"""``cubepack diff A B``: what changed between two cubes (or two lock files). Pure comparison
of parsed locks: files added, removed and changed; pins and activations changed, field by
field; and the lock's own fields (cube id, versions). Every change that moves a digest is
named, so "the digests differ" always comes with why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._util import constants
from ..errors import UsageError
from ..identity._identity import ModelIdentity, compare
from . import _lock as lockfile

#: Lock fields outside files, models and activations (they move ``digest`` only).
_LOCK_FIELDS = ("lock_version", "cubepack_version", "cube_id")


def load_lock(path: str | Path) -> dict[str, Any]:
    """A validated lock from a cube folder or a ``cubepack.lock`` file.

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
    return lockfile.parse(path.read_bytes())


def _model_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    changes = {key: {"old": before.get(key), "new": after.get(key)}
               for key in ("repo_id", "revision", "strict", "name")
               if before.get(key) != after.get(key)}
    old_identity, new_identity = before.get("identity"), after.get("identity")
    if old_identity and new_identity:
        for mismatch in compare(ModelIdentity.from_dict(old_identity),
                                ModelIdentity.from_dict(new_identity)):
            changes[mismatch.field] = {"old": mismatch.expected, "new": mismatch.found}
        for key in sorted(set(old_identity) | set(new_identity)):  # informational fields
            if key not in changes and not any(field.startswith(key) for field in changes) \
                    and old_identity.get(key) != new_identity.get(key):
                changes[f"identity.{key}"] = {"old": old_identity.get(key),
                                              "new": new_identity.get(key)}
    elif old_identity != new_identity:
        changes["identity"] = {"old": old_identity, "new": new_identity}
    return changes


def diff_locks(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Differences from ``old`` to ``new`` (both parsed locks)."""
    old_files, new_files = old["files"], new["files"]
    models: dict[str, Any] = {}
    for role in sorted(set(old["models"]) | set(new["models"])):
        before, after = old["models"].get(role), new["models"].get(role)
        if before is None or after is None:
            models[role] = {"added" if before is None else "removed": True}
            continue
        changes = _model_changes(before, after)
        if changes:
            models[role] = changes
    old_adapters, new_adapters = old.get("adapters") or {}, new.get("adapters") or {}
    old_acts, new_acts = old["activations"], new["activations"]
    activations_changed = {
        item: {key: {"old": old_acts[item].get(key), "new": new_acts[item].get(key)}
               for key in sorted(set(old_acts[item]) | set(new_acts[item]))
               if old_acts[item].get(key) != new_acts[item].get(key)}
        for item in sorted(set(old_acts) & set(new_acts)) if old_acts[item] != new_acts[item]}
    return {
        "files": {
            "added": sorted(set(new_files) - set(old_files)),
            "removed": sorted(set(old_files) - set(new_files)),
            "changed": sorted(p for p in set(old_files) & set(new_files)
                              if old_files[p] != new_files[p]),
        },
        "models": models,
        "activations": {
            "added": sorted(set(new_acts) - set(old_acts)),
            "removed": sorted(set(old_acts) - set(new_acts)),
            "changed": sorted(activations_changed),
            "fields": activations_changed,
        },
        "adapters": {
            "added": sorted(set(new_adapters) - set(old_adapters)),
            "removed": sorted(set(old_adapters) - set(new_adapters)),
            "changed": sorted(name for name in set(old_adapters) & set(new_adapters)
                              if old_adapters[name] != new_adapters[name]),
        },
        "lock": {key: {"old": old.get(key), "new": new.get(key)} for key in _LOCK_FIELDS
                 if old.get(key) != new.get(key)},
        "content_digest": {"old": old["content_digest"], "new": new["content_digest"]},
        "same": old["digest"] == new["digest"],
    }


def diff(a: str | Path, b: str | Path) -> dict[str, Any]:
    """Compare two cubes or lock files."""
    return diff_locks(load_lock(a), load_lock(b))
