"""The embedder check: a live embedder must reproduce a text memory's stored vectors.

Embedders are named by a spec: a local model folder (a transformers encoder, mean-pooled, as
sentence-transformers pools), ``openai:<base url>#<model>`` for any OpenAI-compatible server, or
``ollama:<base url>#<model>``. Each check makes one batched call.
"""

from __future__ import annotations

import json
import math
import threading
import urllib.request
from collections import OrderedDict
from collections.abc import Callable
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
    """Embed ``texts`` with the embedder ``spec``, in one batched call: one vector per text, in
    order, each a non-empty list of finite floats (:func:`vectors_of`), whatever the embedder
    answered.

    Raises:
        CubepackError: the embedder cannot be reached, or answered something else than that
            (naming it and what it answered).
        UsageError: ``spec`` names no embedder.
    """
    kind, _, rest = spec.partition(":")
    if kind in ("openai", "ollama") and "#" in rest:
        base, _, model = rest.rpartition("#")
        if kind == "openai":
            url = f"{base.rstrip('/')}/embeddings"
            answer = _post(url, {"model": model, "input": texts})
            try:  # OpenAI's answer: {"data": [{"index": i, "embedding": [...]}, ...]}
                indexes = sorted(item["index"] for item in answer["data"])
                if indexes != list(range(len(indexes))):  # a text twice, another never
                    raise ValueError(f"indexes {indexes[:8]}, not 0 to n-1 once each")
                vectors = [item["embedding"] for item in sorted(
                    answer["data"], key=lambda item: item["index"])]
            except (KeyError, TypeError, ValueError) as exc:
                raise CubepackError(f"The embedder at {url} answered no OpenAI embeddings list "
                                    f"({_problem(exc)}): {_shown(answer)}. Check the embedder "
                                    "spec (openai:<base url>#<model>).") from exc
            return vectors_of(url, vectors, len(texts))
        url = f"{base.rstrip('/')}/api/embed"
        answer = _post(url, {"model": model, "input": texts})
        try:
            vectors = answer["embeddings"]
        except (KeyError, TypeError) as exc:
            raise CubepackError(f"The embedder at {url} answered no Ollama embeddings list "
                                f"({_problem(exc)}): {_shown(answer)}. Check the embedder spec "
                                "(ollama:<base url>#<model>).") from exc
        return vectors_of(url, vectors, len(texts))
    folder = Path(spec).expanduser()
    if folder.is_dir():
        return vectors_of(str(folder), embed_locally(folder, texts), len(texts))
    raise UsageError(f"Unknown embedder {spec!r}: give a local model folder, "
                     "openai:<base url>#<model> or ollama:<base url>#<model>.")


def vectors_of(embedder: str, vectors: Any, count: int) -> list[list[float]]:
    """``vectors``, the answer of ``embedder`` for ``count`` texts, as lists of floats: the one
    rule of what an embedder's answer must be (a vector short of its texts would leave items
    unchecked by a check that zips them; a NaN or a string compares as nothing).

    Raises:
        CubepackError: not ``count`` non-empty lists of finite numbers of one dimension.
    """
    def refuse(what: str) -> CubepackError:
        return CubepackError(f"The embedder {embedder} answered {what} for {count} texts; "
                             "an embedder answers one vector (a non-empty list of finite "
                             "numbers) per text. Nothing was checked or written with it.")

    if not isinstance(vectors, list) or len(vectors) != count:
        raise refuse(f"{len(vectors)} vectors" if isinstance(vectors, list) else
                     f"{type(vectors).__name__}, not a list of vectors")
    for index, vector in enumerate(vectors):
        if not (isinstance(vector, list) and vector and all(
                type(x) in (int, float) and math.isfinite(x) for x in vector)):
            raise refuse(f"{_shown(vector)} as vector {index}")
    if len({len(vector) for vector in vectors}) > 1:
        raise refuse(f"vectors of dimensions {sorted({len(v) for v in vectors})}")
    return [[float(x) for x in vector] for vector in vectors]


def answered(embed_texts: Callable[[list[str]], Any], texts: list[str],
             label: str) -> list[list[float]]:
    """A live embedder's vectors for ``texts`` (``embed_texts``: MemOS's ``embedder.embed``,
    or :func:`embed` of a spec; ``label`` names it), one a text (:func:`vectors_of`): a check
    zips them with the memories it drew, so a short answer would leave some unchecked and
    the check pass.

    Raises:
        CubepackError: any other answer.
    """
    return vectors_of(label, embed_texts(texts), len(texts))


def _problem(exc: Exception) -> str:
    return f"no key {exc}" if isinstance(exc, KeyError) else str(exc)


def _shown(value: Any) -> str:
    """A value an embedder sent, short enough for a message."""
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


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
            body = response.read()
    except OSError as exc:
        raise CubepackError(f"The embedder at {url} cannot be reached: {exc}") from exc
    try:
        return json.loads(body)
    except ValueError as exc:  # an HTML error page from a proxy, a truncated body...
        raise CubepackError(f"The embedder at {url} answered what is not JSON ({exc}): "
                            f"{_shown(body.decode('utf-8', 'replace'))}. Check the embedder "
                            "spec (openai:<base url>#<model> or ollama:<base url>#<model>) "
                            "and that the server is an embeddings API.") from exc
