"""What ``migrate`` does with a text memory's vectors: every memory that holds a vector is
re-embedded by the new embedder, in batches (``pack`` then records the new vectors and the
embedder's probe vectors); config.json names the new embedder."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..._util import atomic, constants
from ..._util.paths import resolve_inside
from ...errors import FormatError
from ...format.sections import Lock
from ...identity._fingerprint import hub_origin
from ...memos_format import _layout as memos_layout
from ...trust import _lineage as lineage
from .._kind import MigrateJob
from ._embedder import BATCH, embed
from ._vectors import EMBEDDER_ROLE, memory_vectors, with_vectors

NAME = "vectors"


def rewrites(job: MigrateJob) -> set[str]:
    """With a new embedder, the text memories holding vectors are written anew."""
    textual = _vector_files(job.cube, job.config, job.lock) if job.embedder else []
    job.state[NAME] = textual
    return set(textual)


def migrate(job: MigrateJob) -> None:
    """Re-embed every text memory holding vectors; name the new embedder in config.json."""
    spec = job.embedder
    reembedded = sum(_reembed(job.cube, job.staging, name, spec, job.progress)
                     for name in job.state[NAME]) if spec else 0
    if spec is not None and job.config is not None:
        rename_embedder(job.config, spec)
    job.lineage["embedder"] = _embedder_change(job.lock, spec)
    job.lineage["reembedded"] = reembedded
    job.result["reembedded"] = reembedded


def rename_embedder(config: dict[str, Any], embedder: str, role: str = EMBEDDER_ROLE) -> None:
    """config.json naming the new embedder for ``role`` (by Hub id when it has one; an
    OpenAI-compatible or Ollama spec by its model, its URL as the base). The preference kind
    names its own embedder (``pref_mem.embedder``) through this too."""
    inner = memos_layout.llm_config(config, role)
    kind, _, rest = embedder.partition(":")
    if kind in ("openai", "ollama") and "#" in rest:
        base, _, name = rest.rpartition("#")
        for key in ("base_url", "api_base"):
            if inner is not None and key in inner:
                inner[key] = base
    else:
        repo_id, _ = hub_origin(Path(embedder).expanduser())
        name = repo_id or embedder
    memos_layout.rename_model(inner, name)


def _vector_files(cube: Path, config: dict[str, Any] | None, lock: Lock) -> list[str]:
    """The text memories (named by config.json, or MemOS's default name) holding vectors."""
    names = memos_layout.memory_files(config or {}, list(lock.files)).get("textual", [])
    return [name for name in names if memory_vectors(resolve_inside(cube, name))]


def _reembed(cube: Path, staging: Path, name: str, spec: str, progress: bool | None) -> int:
    """Re-embed every memory of the text memory ``name`` that holds a vector, in batches (a
    progress bar on a terminal); write the file with the new vectors into ``staging``."""
    memories = memory_vectors(resolve_inside(cube, name))
    texts = [text for _, text, _ in memories]
    bar = _progress_bar(len(texts), f"re-embedding {name}", progress)
    fresh: list[list[float]] = []
    try:
        for start in range(0, len(texts), BATCH):
            asked = texts[start:start + BATCH]
            batch = embed(spec, asked)
            # Per batch: one too many here and one too few in the next would put every later
            # vector beside the wrong memory.
            if not isinstance(batch, list) or len(batch) != len(asked):
                raise FormatError(f"The embedder {spec} returned "
                                  f"{len(batch) if isinstance(batch, list) else 'no list of'} "
                                  f"vectors for {len(asked)} memories ({name}, memories "
                                  f"{start + 1}-{start + len(asked)}); nothing was written.")
            fresh += [_vector(spec, vector) for vector in batch]
            if bar is not None:
                bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
    dimensions = sorted({len(vector) for vector in fresh})
    if len(dimensions) > 1:
        raise FormatError(f"The embedder {spec} returned vectors of dimensions "
                          f"{', '.join(map(str, dimensions))} for {name}: one store holds one "
                          "dimension; nothing was written.")
    document = with_vectors(resolve_inside(cube, name),
                            {memory_id: vector for (memory_id, _, _), vector
                             in zip(memories, fresh)})
    atomic.write_text(resolve_inside(staging, name),
                      json.dumps(document, ensure_ascii=False, indent=2) + "\n")
    return len(fresh)


def _vector(spec: str, vector: Any) -> list[float]:
    """One embedder answer as floats: a non-empty list of finite numbers (not booleans, not
    strings), else a FormatError."""
    if not (isinstance(vector, list) and vector and all(
            type(x) in (int, float) and math.isfinite(x) for x in vector)):
        raise FormatError(f"The embedder {spec} returned a vector that is not a non-empty list "
                          f"of finite numbers ({str(vector)[:80]}); nothing was written.")
    return [float(x) for x in vector]


def _progress_bar(total: int, description: str, progress: bool | None) -> Any:
    if not (constants.progress_enabled() if progress is None else progress) or not total:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="memory", desc=description, leave=False)


def embedder_label(spec: str) -> str:
    """How the lineage names an embedder: its spec, a Hub-cache snapshot by its Hub id."""
    folder = Path(spec).expanduser()
    if folder.is_dir():
        repo_id, commit = hub_origin(folder)
        return f"{repo_id}@{commit}" if repo_id else spec
    return spec


def _embedder_change(lock: Lock, spec: str | None) -> dict[str, str] | None:
    if spec is None:
        return None
    old = lock.models.get(EMBEDDER_ROLE)
    return {"from": lineage.pin_label(old) if old is not None and old.name else
            "unnamed (config.json names no embedder)", "to": embedder_label(spec)}
