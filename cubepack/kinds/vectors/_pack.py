"""What ``pack`` does with a text memory's vectors: they are pinned to their embedder (the
embedder role's pin records their dimension, count and sample), and with ``--embedder`` the
embedder must reproduce them now, and its probe vectors are recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import IdentityMismatch, Mismatch
from ...format.sections import VectorsRecord
from ...memos_format import _layout as memos_layout
from .._kind import PackJob
from ._check import embedder_checks
from ._embedder import embed, probe_vectors
from ._vectors import EMBEDDER_ROLE, vector_record


def pin(job: PackJob) -> None:
    """The vectors record on the embedder's pin."""
    _record_vectors(job.cube, job.files, job.config, job.pins, job.options.embedder)


def _record_vectors(cube: Path, files: list[str], memos_config: dict[str, Any],
                    pins: dict[str, dict[str, Any]], embedder: str | None) -> None:
    """Pin a text memory's vectors to their embedder: dimension and count (a verifier draws
    its own sample to re-embed; see ``_vectors``, ``_embedder``). With ``embedder``, it must
    reproduce the vectors now, and its probe vectors are recorded."""
    for name in memos_layout.memory_files(memos_config, files).get("textual", []):
        record = vector_record(cube, name)
        if record is None:
            continue
        pins.setdefault(EMBEDDER_ROLE, {"name": None, "strict": False, "repo_id": None,
                                        "revision": None, "identity": None,
                                        "reason": "config.json names no embedder"})
        if embedder:
            failures = [c for c in embedder_checks(cube, memos_config, files,
                                                   VectorsRecord.of(record),
                                                   lambda texts: embed(embedder, texts),
                                                   label=embedder) if not c.ok]
            if failures:
                raise IdentityMismatch(f"The text memory {name}", [
                    Mismatch(f"embedder {c.subject}", "its stored vector", c.detail)
                    for c in failures], "--embedder did not make these vectors; give the "
                    "embedder that did.", finding="was made by another embedder")
            record["probes"] = probe_vectors(embedder)
        pins[EMBEDDER_ROLE]["vectors"] = record
