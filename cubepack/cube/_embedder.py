"""The embedder check: a live embedder must reproduce a text memory's stored vectors.

Embedders are named by a spec: a local model folder (a transformers encoder, mean-pooled, as
sentence-transformers pools), ``openai:<base url>#<model>`` for any OpenAI-compatible server, or
``ollama:<base url>#<model>``. Each check makes one batched call.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from ..errors import CubepackError, UsageError
from ._report import Check
from ._vectors import COSINE_THRESHOLD, PROBES, cosine, memory_vectors

CHECK = "embedder"


def probe_vectors(spec: str) -> list[list[float]]:
    """The embedder's vectors for :data:`PROBES`, rounded for a stable lock (one call)."""
    return [[round(float(x), 6) for x in vector] for vector in embed(spec, list(PROBES))]


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
