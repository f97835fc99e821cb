"""The embedder check: a live embedder must reproduce a text memory's stored vectors.

Embedders are named by a spec: a local model folder (a transformers encoder, mean-pooled, as
sentence-transformers pools), ``openai:<base url>#<model>`` for any OpenAI-compatible server, or
``ollama:<base url>#<model>``. Each check makes one batched call.
"""

from __future__ import annotations

import json
import random
import secrets
import threading
import urllib.request
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._util.models import load_encoder
from .._util.paths import resolve_inside
from ..errors import CubepackError, IntegrityError, UsageError
from ._memos_layout import memory_files
from ..trust._evidence import CLAIMED
from ._report import Check
from ._vectors import COSINE_THRESHOLD, EMBEDDER_ROLE, PROBES, SAMPLE_SIZE, cosine, memory_vectors

CHECK = "embedder"
#: Texts per embedding call when every memory is re-embedded.
BATCH = 256


def probe_vectors(spec: str) -> list[list[float]]:
    """The embedder's vectors for :data:`PROBES`, rounded for a stable lock (one call)."""
    return [[round(float(x), 6) for x in vector] for vector in embed(spec, list(PROBES))]


def vector_sources(cube: Path, config: dict[str, Any], lock_files: list[str],
                   record: dict[str, Any] | None) -> list[tuple[str, list[tuple]]]:
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
    if record is not None and record["file"] not in named:
        raise IntegrityError(f"The lock records vectors for {record['file']}, but the text "
                             f"memory config.json names ({', '.join(named) or 'none'}) holds "
                             "other or no vectors.")
    for name, memories in sources:
        dimensions = sorted({len(vector) for _, _, vector in memories})
        if record is not None and name == record["file"] and (
                len(memories) != record["count"] or dimensions != [record["dimension"]]):
            raise IntegrityError(f"{name} holds {len(memories)} vectors of dimension "
                                 f"{', '.join(map(str, dimensions))}; the lock records "
                                 f"{record['count']} of dimension {record['dimension']}.")
    return sources


def embedder_checks(cube: Path, config: dict[str, Any], lock: dict[str, Any],
                    embed_texts: Callable[[list[str]], list[list[float]]], *, label: str,
                    seed: int | None = None, size: int | None = SAMPLE_SIZE) -> list[Check]:
    """Re-embed memories drawn at random (by this process: ``seed``, reported) from each text
    memory that holds vectors (``size`` of them; 0 or None: all, in batches), in one batched
    call, and compare with the stored vectors; then
    the recorded probe vectors, if any, in a second call. ``embed_texts`` is the live embedder
    (``label`` names it in messages). One check per memory, and one per probe.

    Raises:
        IntegrityError: see :func:`vector_sources`.
    """
    record = (lock["models"].get(EMBEDDER_ROLE) or {}).get("vectors")
    sources = vector_sources(cube, config, list(lock["files"]), record)
    if not sources:
        return [Check(CHECK, "*", False, "the cube's text memory holds no vectors, so no "
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
    if record.get("probes"):
        fresh = embed_texts(list(PROBES))
        for index, (expected, vector) in enumerate(zip(record["probes"], fresh)):
            check = _compare(f"probe {index}", expected, vector, label, "the lock's probe vectors")
            check.basis = CLAIMED  # the expected vectors are the packer's word, not the memories
            checks.append(check)
    return checks


def _compare(subject: str, expected: list[float], vector: list[float], label: str,
             scope: str) -> Check:
    if len(vector) != len(expected):
        return Check(CHECK, subject, False, f"{label} gives {len(vector)}-dimensional vectors; "
                     f"the cube's were made by a {len(expected)}-dimensional embedder",
                     len(expected), len(vector), role=EMBEDDER_ROLE)
    similarity = cosine(expected, vector)
    ok = similarity >= COSINE_THRESHOLD
    return Check(CHECK, subject, ok, f"cosine {similarity:.6f} with the stored vector ({scope})"
                 + ("" if ok else f" < {COSINE_THRESHOLD}: another embedder made these vectors; "
                    "re-embed the cube's memories with this one or use the embedder that made "
                    "them"), role=EMBEDDER_ROLE)


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
