"""The embedder check: a live embedder must reproduce a text memory's stored vectors.

Embedders are named by a spec: a local model folder (a transformers encoder, mean-pooled, as
sentence-transformers pools), ``openai:<base url>#<model>`` for any OpenAI-compatible server, or
``ollama:<base url>#<model>``. Each check makes one batched call.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ..._util.models import load_encoder
from ..._util.paths import resolve_inside
from ...errors import CubepackError, IntegrityError, UsageError
from ...format.sections import VectorsRecord
from ...memos_format._layout import memory_files
from ._vectors import PROBES, memory_vectors

#: Texts per embedding call when every memory is re-embedded.
BATCH = 256


def probe_vectors(spec: str) -> list[list[float]]:
    """The embedder's vectors for :data:`PROBES`, rounded for a stable lock (one call)."""
    return [[round(float(x), 6) for x in vector] for vector in embed(spec, list(PROBES))]


def vector_sources(cube: Path, config: dict[str, Any], lock_files: list[str],
                   record: VectorsRecord | None) -> list[tuple[str, list[tuple]]]:
    """The text memories MemOS loads that hold vectors: (file, memories) for each file the
    cube's ``config.json`` names (never a path from the lock), read through the path rule (a
    listed, verified regular file inside the cube). They must agree with the lock's record.

    Raises:
        IntegrityError: vectors without a record, a record for another file or for no vectors,
            or a count or dimension that differs from the record.
    """
    sources = []
    for name in memory_files(config, lock_files).get("textual", []):
        path = resolve_inside(cube, name)
        if path.is_symlink() or not path.is_file():
            raise IntegrityError(f"The text memory {name} is not a regular file in the cube.")
        memories = memory_vectors(path)
        if memories:
            sources.append((name, memories))
    named = [name for name, _ in sources]
    if record is None and sources:
        raise IntegrityError(f"{named[0]} holds {len(sources[0][1])} vectors but the lock records "
                             "no embedder for them (a packed cube always does: was the record "
                             "removed?); re-pack the cube with cubepack pack.")
    if record is not None and record.file not in named:
        raise IntegrityError(f"The lock records vectors for {record.file}, but the text "
                             f"memory config.json names ({', '.join(named) or 'none'}) holds "
                             "other or no vectors.")
    for name, memories in sources:
        dimensions = sorted({len(vector) for _, _, vector in memories})
        if record is not None and name == record.file and (
                len(memories) != record.count or dimensions != [record.dimension]):
            raise IntegrityError(f"{name} holds {len(memories)} vectors of dimension "
                                 f"{', '.join(map(str, dimensions))}; the lock records "
                                 f"{record.count} of dimension {record.dimension}.")
    return sources


def embed(spec: str, texts: list[str]) -> list[list[float]]:
    """Embed ``texts`` with the embedder ``spec``, in one batched call."""
    kind, _, rest = spec.partition(":")
    if kind in ("openai", "ollama") and "#" in rest:
        base, _, model = rest.rpartition("#")
        if kind == "openai":
            answer = _post(f"{base.rstrip('/')}/embeddings", {"model": model, "input": texts})
            return [item["embedding"] for item in sorted(answer["data"],
                                                         key=lambda item: item["index"])]
        return _post(f"{base.rstrip('/')}/api/embed", {"model": model, "input": texts})["embeddings"]
    folder = Path(spec).expanduser()
    if folder.is_dir():
        return embed_locally(folder, texts)
    raise UsageError(f"Unknown embedder {spec!r}: give a local model folder, "
                     "openai:<base url>#<model> or ollama:<base url>#<model>.")


def embed_locally(folder: Path, texts: list[str]) -> list[list[float]]:
    """Mean-pooled last hidden states of a transformers encoder, as sentence-transformers pools."""
    import torch

    tokenizer, model = _loaded_encoder(folder)
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
    return pooled.tolist()


#: Local encoders kept loaded (the last few), so that a migration's batches and the checks
#: after them load a folder's encoder once.
_ENCODERS: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()
_ENCODERS_KEPT = 2
_ENCODERS_LOCK = threading.Lock()


def _loaded_encoder(folder: Path) -> tuple[Any, Any]:
    """(tokenizer, model) of the encoder in ``folder``, reused while every file in it is the
    same (by inode, size, mtime and ctime: a rewrite in place is seen even if its mtime is set
    back)."""
    from transformers import AutoTokenizer

    resolved = folder.resolve()
    files = []
    for path in sorted(resolved.iterdir()):
        info = path.stat()
        files.append((path.name, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns))
    key = (str(resolved), tuple(files))
    with _ENCODERS_LOCK:
        if key in _ENCODERS:
            _ENCODERS.move_to_end(key)
            return _ENCODERS[key]
    loaded = (AutoTokenizer.from_pretrained(str(resolved)),
              load_encoder(resolved))
    with _ENCODERS_LOCK:
        _ENCODERS[key] = loaded
        while len(_ENCODERS) > _ENCODERS_KEPT:
            _ENCODERS.popitem(last=False)
    return loaded


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())
    except OSError as exc:
        raise CubepackError(f"The embedder at {url} cannot be reached: {exc}") from exc
