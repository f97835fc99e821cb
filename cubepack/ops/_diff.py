"""``cubepack diff A B``: every change between two cubes (or lock files) that moves a digest
(:func:`cubepack.format._diff.diff_locks`), with what backs each changed pin: a lock is its
writer's claim, and comparing two claims proves neither."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..format import _lock as lockfile
from ..format._diff import diff_locks, load_lock, memory_diff
from ..trust._evidence import CLAIMED


def diff(a: str | Path, b: str | Path) -> dict[str, Any]:
    """Compare two cubes or lock files, section by section; each pin added or changed is
    marked ``claimed`` (its evidence is the lock's word until verified against a model).

    Returns:
        a dict whose ``sections`` hold the differences, section by section (files, models,
        activations, adapters, lineage, encryption), each pin change marked ``claimed``;
        ``memories``: two cube folders' KV memories added, removed and changed by digest,
        however they are stored (read from the shard indexes, never the shards; None for a
        lock file).

    Example:
        ```python
        changes = cubepack.diff("cube-v1", "cube-v2")
        print(changes["sections"].get("activations"))
        ```
    """
    result = diff_locks(load_lock(a), load_lock(b))
    result["memories"] = memory_diff(a, b)
    for section in lockfile.SECTIONS:
        entry = result["sections"].get(section.key)
        if entry is not None and section.attest == "producers":
            entry["basis"] = {name: CLAIMED for name in (*entry["added"], *entry["changed"])}
    return result
