"""Textual memories and the embedder whose space their vectors live in.

A textual memory's vector is only meaningful for the embedder that made it: another embedder
of the same dimension silently garbles retrieval, another dimension crashes the vector store.
``pack`` records, for a text memory that holds vectors, its dimension, its count and a sample
of its own memories (ids); ``verify --embedder E`` has the live embedder re-embed the sample
texts in one batched call, and each vector must match the stored one (cosine >= 0.999: the
same embedder on another machine or library version differs by rounding only, about 1e-6 in
cosine; another model, even of the same family and dimension, falls far below).

Embedders are named by a spec: a local model folder (a transformers encoder, mean-pooled, as
sentence-transformers pools), ``openai:<base url>#<model>`` for any OpenAI-compatible server,
or ``ollama:<base url>#<model>``.
"""

from __future__ import annotations

import json
import math
import urllib.request
from pathlib import Path
from typing import Any

from ._report import Check
from .errors import CubepackError, UsageError

COSINE_THRESHOLD = 0.999
SAMPLE_SIZE = 8
CHECK = "embedder"
#: A fixed probe set: with the embedder at pack time (``pack --embedder``), their vectors are
#: recorded too, a behavioural fingerprint of the embedder independent of the cube's contents.
PROBES = ("The user likes green tea.", "Paris is the capital of France.",
          "def add(a, b): return a + b", "Numbers: 3.14159, 2024, -7.")


def memory_vectors(path: Path) -> list[tuple[str, str, list[float]]]:
    """(id, text, vector) of every memory that holds a vector, in MemOS's two dump layouts: a
    list of ``{id, vector, payload: {memory}}`` (general text) or ``{nodes: [{id, memory,
    metadata: {embedding}}]}`` (tree text)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    found = []
    if isinstance(data, list):
        for entry in data:
            if isinstance(entry, dict) and isinstance(entry.get("vector"), list):
                payload = entry.get("payload") or {}
                found.append((str(entry.get("id")), str(payload.get("memory", "")),
                              entry["vector"]))
    elif isinstance(data, dict) and isinstance(data.get("nodes"), list):
        for node in data["nodes"]:
            embedding = (node.get("metadata") or {}).get("embedding") if isinstance(node, dict) \
                else None
            if isinstance(embedding, list) and embedding:
                found.append((str(node.get("id")), str(node.get("memory", "")), embedding))
    return found


def vector_record(cube: Path, name: str) -> dict[str, Any] | None:
    """What the lock records about a text memory's vectors, or None when it holds none."""
    memories = memory_vectors(cube / name)
    if not memories:
        return None
    dimensions = sorted({len(vector) for _, _, vector in memories})
    if len(dimensions) != 1:
        raise CubepackError(f"{name} mixes vectors of dimensions {dimensions}: one embedder "
                            "cannot have made them all.")
    sample = sorted(memory_id for memory_id, _, _ in memories)[:SAMPLE_SIZE]
    return {"file": name, "dimension": dimensions[0], "count": len(memories), "sample": sample}


def probe_vectors(spec: str) -> list[list[float]]:
    """The embedder's vectors for :data:`PROBES`, rounded for a stable lock (one call)."""
    return [[round(float(x), 6) for x in vector] for vector in embed(spec, list(PROBES))]


def check_record(record: Any) -> bool:
    probes = record.get("probes") if isinstance(record, dict) else None
    return (isinstance(record, dict) and isinstance(record.get("file"), str)
            and type(record.get("dimension")) is int and type(record.get("count")) is int
            and isinstance(record.get("sample"), list)
            and all(isinstance(i, str) for i in record["sample"])
            and (probes is None or (isinstance(probes, list) and len(probes) == len(PROBES)
                                    and all(isinstance(v, list) for v in probes))))


def embedder_checks(cube: Path, record: dict[str, Any], spec: str, role: str) -> list[Check]:
    """Re-embed the recorded sample with the embedder ``spec``; one check per memory."""
    stored = {memory_id: (text, vector) for memory_id, text, vector in
              memory_vectors(cube / record["file"])}
    sample = [memory_id for memory_id in record["sample"] if memory_id in stored]
    if not sample:
        return [Check(CHECK, record["file"], False, "none of the recorded sample memories is in "
                      "the file", role=role)]
    fresh = embed(spec, [stored[memory_id][0] for memory_id in sample])
    pairs = [(f"{record['file']} ({memory_id})", stored[memory_id][1], vector)
             for memory_id, vector in zip(sample, fresh)]
    if record.get("probes"):  # the second (and last) batched call
        pairs += [(f"probe {index}", expected, vector) for index, (expected, vector) in
                  enumerate(zip(record["probes"], embed(spec, list(PROBES))))]
    checks = []
    for subject, expected, vector in pairs:
        if len(vector) != len(expected):
            checks.append(Check(CHECK, subject, False, f"{spec} gives {len(vector)}-dimensional "
                                "vectors; the cube's were made by a "
                                f"{len(expected)}-dimensional embedder", len(expected),
                                len(vector), role=role))
            continue
        similarity = cosine(expected, vector)
        ok = similarity >= COSINE_THRESHOLD
        checks.append(Check(CHECK, subject, ok, f"cosine {similarity:.6f} with the stored vector"
                            + ("" if ok else f" < {COSINE_THRESHOLD}: another embedder made "
                               "these vectors; re-embed the cube's memories with this one or "
                               "use the embedder that made them"), role=role))
    return checks


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


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
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
    return pooled.tolist()


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())
    except OSError as exc:
        raise CubepackError(f"The embedder at {url} cannot be reached: {exc}") from exc
