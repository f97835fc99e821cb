"""The vectors kind's load check: a MemOS text memory's vectors against the embedder MemOS
loaded, once MemOS loaded the memory (``Vectors.load_memos``).

The same test as ``verify --embedder`` (see :mod:`cubepack.kinds.vectors._embedder`), run
with the live embedder of the cube MemOS built: it re-embeds memories it draws at random
from the file MemOS loaded, in one batched call. On a mismatch the policy decides: ``error``
raises, ``drop`` removes the textual memories (a vector store holds no memory without its
vector), ``rebuild`` re-embeds every textual memory with the live embedder (MemOS's own
``add`` embeds them).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ..._util import constants
from ...errors import IdentityMismatch, Mismatch
from ...format.sections import Lock
from ...trust._policy import TrustPolicy
from ._check import embedder_checks
from ._embedder import vector_sources
from ._vectors import COSINE_THRESHOLD, EMBEDDER_ROLE

logger = logging.getLogger("cubepack.memos")
ROLE = EMBEDDER_ROLE


def check_text_vectors(text_mem: Any, cube_dir: Path, lock: Lock, report: Any,
                       policy: TrustPolicy) -> None:
    """Re-embed memories drawn at random from the text memory MemOS loaded (the file its
    config.json names) with MemOS's own embedder; on a mismatch apply the policy. A cube whose
    vectors and record disagree (or whose record was removed) is refused whatever the policy."""
    embedder = getattr(text_mem, "embedder", None)
    config_path = cube_dir / constants.MEMOS_CONFIG
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    record = lock.vectors_record(ROLE)
    if not vector_sources(cube_dir, config, list(lock.files), record):
        return  # no vectors: nothing an embedder could be checked against
    if embedder is None:
        raise IdentityMismatch(f"The textual memories of {cube_dir}", [
            Mismatch("embedder", "the embedder that made the vectors", None)],
            "MemOS built this text memory without an embedder, so its vectors cannot be "
            "checked; configure the embedder that made them.", finding="cannot be checked")
    draw = policy.reembedding()  # the embedder is MemOS's; how many memories, the policy's
    checks = embedder_checks(cube_dir, config, list(lock.files), record, embedder.embed,
                             label=type(embedder).__name__, seed=draw.seed, size=draw.sample)
    problems = [Mismatch(f"vectors[{c.subject}].dimension", c.expected, c.found)
                if c.expected is not None else
                Mismatch(f"vectors[{c.subject}].cosine", f">= {COSINE_THRESHOLD}",
                         c.detail.split(" with the stored")[0].removeprefix("cosine "))
                for c in checks if c.ok is False]
    if not problems:
        report.embedder_verified = True
        return
    fields = [problem.field for problem in problems]
    if policy.mismatch_action() == "error":
        raise IdentityMismatch(
            f"The textual memories of {cube_dir}", problems,
            "Their vectors were made by another embedder than the one MemOS loaded; load the "
            "cube with the embedder that made them, or pass on_mismatch='drop' or 'rebuild'.",
            finding="were made by another embedder")
    items = text_mem.get_all()
    text_mem.delete_all()
    if policy.mismatch_action() == "drop":
        logger.warning("cubepack: dropped %d textual memories: their vectors were made by "
                       "another embedder (%s)", len(items), ", ".join(fields))
        report.dropped[ROLE] = fields
        return
    text_mem.add(items)  # MemOS embeds them again, with the live embedder
    logger.warning("cubepack: re-embedded %d textual memories with the loaded embedder",
                   len(items))
    report.rebuilt[ROLE] = fields
