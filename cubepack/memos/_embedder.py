"""Checking a MemOS text memory's vectors against the embedder MemOS loaded, at load time.

The same test as ``verify --embedder`` (see :mod:`cubepack.cube._embedder`), run with the live
embedder of the cube MemOS built: it re-embeds the recorded sample in one batched call. On a
mismatch the policy decides: ``error`` raises, ``drop`` removes the textual memories (a vector
store holds no memory without its vector), ``rebuild`` re-embeds every textual memory with the
live embedder (MemOS's own ``add`` embeds them).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..cube._vectors import COSINE_THRESHOLD, PROBES, cosine, memory_vectors
from ..errors import IdentityMismatch, Mismatch
from ._activations import HookReport

logger = logging.getLogger("cubepack.memos")
ROLE = "text_mem.embedder"


def check_text_vectors(text_mem: Any, cube_dir: Path, lock: dict[str, Any], report: HookReport,
                       on_mismatch: str) -> None:
    record = (lock["models"].get(ROLE) or {}).get("vectors")
    embedder = getattr(text_mem, "embedder", None)
    if not record or embedder is None:
        return
    stored = {memory_id: (text, vector)
              for memory_id, text, vector in memory_vectors(cube_dir / record["file"])}
    sample = [memory_id for memory_id in record["sample"] if memory_id in stored]
    fresh = embedder.embed([stored[memory_id][0] for memory_id in sample]) if sample else []
    pairs = [(memory_id, stored[memory_id][1], vector) for memory_id, vector in zip(sample, fresh)]
    if record.get("probes"):
        pairs += [(f"probe {index}", expected, vector) for index, (expected, vector) in
                  enumerate(zip(record["probes"], embedder.embed(list(PROBES))))]
    problems = []
    for name, expected, vector in pairs:
        if len(vector) != len(expected):
            problems.append(Mismatch(f"vectors[{name}].dimension", len(expected), len(vector)))
        elif cosine(expected, vector) < COSINE_THRESHOLD:
            problems.append(Mismatch(f"vectors[{name}].cosine", f">= {COSINE_THRESHOLD}",
                                     round(cosine(expected, vector), 6)))
    if not problems:
        report.embedder_verified = True
        return
    fields = [problem.field for problem in problems]
    if on_mismatch == "error":
        raise IdentityMismatch(
            f"The textual memories of {cube_dir}", problems,
            "Their vectors were made by another embedder than the one MemOS loaded; load the "
            "cube with the embedder that made them, or pass on_mismatch='drop' or 'rebuild'.")
    items = text_mem.get_all()
    text_mem.delete_all()
    if on_mismatch == "drop":
        logger.warning("cubepack: dropped %d textual memories: their vectors were made by "
                       "another embedder (%s)", len(items), ", ".join(fields))
        report.dropped[ROLE] = fields
        return
    text_mem.add(items)  # MemOS embeds them again, with the live embedder
    logger.warning("cubepack: re-embedded %d textual memories with the loaded embedder",
                   len(items))
    report.rebuilt[ROLE] = fields
