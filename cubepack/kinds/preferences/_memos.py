"""The MemOS hook's load of a verified cube's preference memory into a live
``PreferenceTextMemory``: the items read once from the file the lock records, checked against
its locator (length and sha256) before they are parsed, strictly, and counted against the lock, their vectors re-embedded by the embedder MemOS built (the policy decides
what a mismatch does), then added to the memory's store collection by collection and counted
there again. MemOS's own ``load`` is never called: it validates each item as a ``VecDBItem``,
which refuses the ``memory`` and ``original_text`` its own dump writes, logs the error and
returns with nothing loaded.

No MemOS import: the memory's ``vector_db.add(collection, items)`` (MemOS builds its items from
the dicts) and ``get_by_ids(collection, ids)`` are all this uses.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ...errors import IdentityMismatch, IntegrityError, Mismatch, UsageError
from ...format.sections import Lock
from ...memos_format._layout import opened_path
from ...trust._policy import TrustPolicy
from ..vectors._vectors import COSINE_THRESHOLD
from . import _check, _dump

logger = logging.getLogger("cubepack.memos")


def load_preferences(memory: Any, cube_dir: Path, lock: Lock, report: Any,
                     policy: TrustPolicy) -> int:
    """Load the preferences of the verified cube at ``cube_dir`` (``lock``: its parsed lock)
    into ``memory`` (MemOS's preference memory); return how many items its store holds now
    from the cube. ``report`` (the hook's) records a drop or a rebuild.

    Raises:
        UsageError: the memory's ``memory_filename`` names another file than the cube's
            preferences.
        IntegrityError: the file holds other counts than the lock; the store does not hold
            every item afterwards.
        IdentityMismatch: the memory's embedder did not make the vectors (policy ``error``).
    """
    if not lock.preferences:
        return 0
    named = opened_path(getattr(memory.config, "memory_filename", None) or "")
    if named not in lock.preferences:
        raise UsageError(f"This preference memory reads {named!r}, but the cube's preferences "
                         f"are in {', '.join(sorted(lock.preferences))}; set its "
                         "memory_filename to that file.")
    entry = lock.preferences[named]
    # Read once and checked against the lock's locator before it is parsed: the file verify
    # hashed may have changed since, and only the bytes the lock records are loaded.
    path = cube_dir / named
    if path.is_symlink() or not path.is_file():
        raise IntegrityError(f"The preference memory {named} is not a regular file in the cube.")
    data = _dump.parse(entry.locator.check(path.read_bytes()), named)
    found = _dump.items(data, named)
    _check.require_agreement(found, entry)
    role = entry.embedder
    embedder = getattr(memory, "embedder", None)
    if embedder is None:
        raise IdentityMismatch(f"The preferences of {cube_dir}", [
            Mismatch("embedder", "the embedder that made the vectors", None)],
            "MemOS built this preference memory without an embedder, so its vectors cannot "
            "be checked; configure the embedder that made them.", finding="cannot be checked")
    draw = policy.reembedding()
    checks = _check.embedder_checks(cube_dir, entry, embedder.embed,
                                    label=type(embedder).__name__, seed=draw.seed,
                                    size=draw.sample, found=found)
    problems = [Mismatch(f"vectors[{c.subject}].dimension", c.expected, c.found)
                if c.expected is not None else
                Mismatch(f"vectors[{c.subject}].cosine", f">= {COSINE_THRESHOLD}",
                         c.detail.split(" with the stored")[0].removeprefix("cosine "))
                for c in checks if c.ok is False]
    if problems:
        fields = [problem.field for problem in problems]
        action = policy.mismatch_action()
        if action == "error":
            raise IdentityMismatch(
                f"The preferences of {cube_dir}", problems,
                "Their vectors were made by another embedder than the one MemOS loaded; load "
                "the cube with the embedder that made them, or pass on_mismatch='drop' or "
                "'rebuild'.", finding="were made by another embedder")
        if action == "drop":
            logger.warning("cubepack: dropped %d preferences: their vectors were made by "
                           "another embedder (%s)", len(found), ", ".join(fields))
            report.dropped[role] = fields
            return 0
        fresh = [vector for start in range(0, len(found), 256)
                 for vector in embedder.embed([item.memory for item in found[start:start + 256]])]
        data = _dump.with_vectors(data, {item.key: list(vector)
                                         for item, vector in zip(found, fresh)})
        logger.warning("cubepack: re-embedded %d preferences with the loaded embedder",
                       len(found))
        report.rebuilt[role] = fields
    for collection, items in data.items():
        if items:
            memory.vector_db.add(collection, [dict(item) for item in items])
    held = sum(len(memory.vector_db.get_by_ids(collection, [item["id"] for item in items]))
               for collection, items in data.items() if items)
    if held != entry.count:
        raise IntegrityError(f"MemOS's store holds {held} of the {entry.count} preferences "
                             f"the lock records for {named} after loading them.")
    report.loaded.append(f"{named} ({held} preferences)")
    return held
