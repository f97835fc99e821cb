"""The embedder check pack, verify and the MemOS hook share: memories drawn at random by this
process re-embedded by the live embedder and compared with the vectors the cube stores (and
the probe vectors the lock records). Turns what :mod:`cubepack.kinds.vectors._embedder`
computes into report checks."""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..._util.checks import Catalogue
from ...format.sections import VectorsRecord
from ...trust._evidence import CLAIMED
from ...trust._policy import SAMPLE_SIZE
from ...trust._report import Check
from ._embedder import BATCH, vector_sources
from ._vectors import COSINE_THRESHOLD, EMBEDDER_ROLE, PROBES, cosine

#: The checks this module makes.
_CHECK = Catalogue.EMBEDDER


def embedder_checks(cube: Path, config: dict[str, Any], files: list[str],
                    record: VectorsRecord | None,
                    embed_texts: Callable[[list[str]], list[list[float]]], *, label: str,
                    seed: int | None = None, size: int | None = SAMPLE_SIZE,
                    alone: bool = True) -> list[Check]:
    """Re-embed memories drawn at random (by this process: ``seed``, reported) from each text
    memory that holds vectors (``size`` of them; 0 or None: all, in batches), in one batched
    call, and compare with the stored vectors; then
    the recorded probe vectors, if any, in a second call. ``embed_texts`` is the live embedder
    (``label`` names it in messages). One check per memory, and one per probe. A text memory
    without vectors fails the check when it is the only memory that could hold them
    (``alone``); beside a preference memory (which its own kind checks), it is no check.

    Raises:
        IntegrityError: see :func:`vector_sources`.
    """
    sources = vector_sources(cube, config, files, record)
    if not sources and not alone:
        return []
    if not sources:
        return [Check(_CHECK, "*", False, "the cube's text memory holds no vectors, so no "
                      "embedder can be checked against it (drop --embedder)", role=EMBEDDER_ROLE)]
    seed = secrets.randbits(32) if seed is None else seed
    rng = random.Random(seed)
    checks = []
    for name, memories in sources:
        every = not size or size >= len(memories)
        drawn = list(memories) if every else rng.sample(memories, size)
        fresh = [vector for start in range(0, len(drawn), BATCH)
                 for vector in embed_texts([text for _, text, _ in drawn[start:start + BATCH]])]
        scope = (f"all {len(drawn)} memories" if every else
                 f"{len(drawn)} of {len(memories)} memories drawn at random (seed {seed}); a "
                 "sample cannot find a few foreign vectors: --embedder-sample 0 checks all")
        checks += [_compare(f"{name} ({memory_id})", stored, vector, label, scope)
                   for (memory_id, _, stored), vector in zip(drawn, fresh)]
    if record is not None and record.probes:
        fresh = embed_texts(list(PROBES))
        for index, (expected, vector) in enumerate(zip(record.probes, fresh)):
            check = _compare(f"probe {index}", expected, vector, label, "the lock's probe vectors")
            check.basis = CLAIMED  # the expected vectors are the packer's word, not the memories
            checks.append(check)
    return checks


def _compare(subject: str, expected: list[float], vector: list[float], label: str,
             scope: str) -> Check:
    if len(vector) != len(expected):
        return Check(_CHECK, subject, False, f"{label} gives {len(vector)}-dimensional vectors; "
                     f"the cube's were made by a {len(expected)}-dimensional embedder",
                     len(expected), len(vector), role=EMBEDDER_ROLE)
    similarity = cosine(expected, vector)
    ok = similarity >= COSINE_THRESHOLD
    return Check(_CHECK, subject, ok, f"cosine {similarity:.6f} with the stored vector ({scope})"
                 + ("" if ok else f" < {COSINE_THRESHOLD}: another embedder made these vectors; "
                    "re-embed the cube's memories with this one or use the embedder that made "
                    "them"), role=EMBEDDER_ROLE)
