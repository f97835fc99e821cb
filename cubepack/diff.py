"""``cubepack diff A B``: what changed between two cubes (or two lock files). Pure comparison
of parsed locks: files added, removed and changed; pins and activations changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import _constants as constants
from . import _lock as lockfile
from .identity import ModelIdentity, compare


def load_lock(path: str | Path) -> dict[str, Any]:
    """A validated lock from a cube folder or a ``cubepack.lock`` file."""
    path = Path(path)
    if path.is_dir():
        path = path / constants.LOCK_FILENAME
    return lockfile.parse(path.read_bytes())


def diff_locks(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Differences from ``old`` to ``new`` (both parsed locks)."""
    old_files, new_files = old["files"], new["files"]
    models: dict[str, Any] = {}
    for role in sorted(set(old["models"]) | set(new["models"])):
        before, after = old["models"].get(role), new["models"].get(role)
        if before is None or after is None:
            models[role] = {"added" if before is None else "removed": True}
            continue
        changes = {key: {"old": before.get(key), "new": after.get(key)}
                   for key in ("repo_id", "revision", "strict") if before.get(key) != after.get(key)}
        if before.get("identity") and after.get("identity"):
            for mismatch in compare(ModelIdentity.from_dict(before["identity"]),
                                    ModelIdentity.from_dict(after["identity"])):
                changes[mismatch.field] = {"old": mismatch.expected, "new": mismatch.found}
        if changes:
            models[role] = changes
    old_acts, new_acts = old["activations"], new["activations"]
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
            "changed": sorted(i for i in set(old_acts) & set(new_acts) if old_acts[i] != new_acts[i]),
        },
        "same": old["digest"] == new["digest"],
    }


def diff(a: str | Path, b: str | Path) -> dict[str, Any]:
    """Compare two cubes or lock files."""
    return diff_locks(load_lock(a), load_lock(b))
