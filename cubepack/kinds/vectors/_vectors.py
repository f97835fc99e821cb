"""Textual memories' vectors and what the lock records about them (no HTTP, no torch).

A vector is only meaningful for the embedder that made it: another embedder of the same
dimension silently garbles retrieval, another dimension crashes the vector store. ``pack``
records, for a text memory that holds vectors, its dimension, count and a sample of its
memories; the embedder check (:mod:`cubepack.kinds.vectors._embedder`) re-embeds them.
Cosine >= 0.999:
the same embedder elsewhere differs by rounding (~1e-6), another model falls far below.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..._util import canonical
from ...errors import CubepackError, FormatError
from ...format._lock import VECTOR_PROBES
from ...trust._policy import SAMPLE_SIZE

COSINE_THRESHOLD = 0.999


#: The lock's model role whose pin carries the vectors record.
EMBEDDER_ROLE = "text_mem.embedder"


#: A fixed probe set: with the embedder at pack time (``pack --embedder``), their vectors are
#: recorded too, a behavioural fingerprint of the embedder independent of the cube's contents.
PROBES = VECTOR_PROBES


def memory_vectors(path: Path) -> list[tuple[str, str, list[float]]]:
    """(id, text, vector) of every memory that holds a vector, in MemOS's two dump layouts: a
    list of ``{id, vector, payload: {memory}}`` (general text) or ``{nodes: [{id, memory,
    metadata: {embedding}}]}`` (tree text).

    Raises:
        FormatError: not strict JSON, a vector that is not a list of numbers, or two memories
            with one id (a sample could then check one and MemOS load the other).
    """
    try:
        data = canonical.loads_strict(path.read_bytes())
    except ValueError as exc:
        raise FormatError(f"{path.name} is not valid JSON: {exc}") from exc
    found = []
    if isinstance(data, list):
        for entry in data:
            if isinstance(entry, dict) and isinstance(entry.get("vector"), list):
                payload = entry.get("payload")
                memory = payload.get("memory", "") if isinstance(payload, dict) else ""
                found.append((str(entry.get("id")), str(memory), entry["vector"]))
    elif isinstance(data, dict) and isinstance(data.get("nodes"), list):
        for node in data["nodes"]:
            metadata = node.get("metadata") if isinstance(node, dict) else None
            embedding = metadata.get("embedding") if isinstance(metadata, dict) else None
            if isinstance(embedding, list) and embedding:
                found.append((str(node.get("id")), str(node.get("memory", "")), embedding))
    seen: set[str] = set()
    for memory_id, _, vector in found:
        if memory_id in seen:
            raise FormatError(f"{path.name} holds two memories with the id {memory_id!r}.")
        seen.add(memory_id)
        if not vector or not all(type(x) in (int, float) for x in vector):
            raise FormatError(f"{path.name}: the vector of memory {memory_id!r} is not a list of "
                              "numbers.")
    return found


def with_vectors(path: Path, fresh: dict[str, list[float]]) -> Any:
    """The text memory at ``path`` (either layout of :func:`memory_vectors`, which the caller
    read it with) with each vector ``fresh`` names replaced, everything else as it was
    (``migrate`` re-embeds with these).

    Raises:
        FormatError: not strict JSON, or ``fresh`` names a memory the file does not hold with a
            vector.
    """
    try:
        data = canonical.loads_strict(path.read_bytes())
    except ValueError as exc:
        raise FormatError(f"{path.name} is not valid JSON: {exc}") from exc
    replaced = set()
    if isinstance(data, list):
        for entry in data:
            if isinstance(entry, dict) and isinstance(entry.get("vector"), list) \
                    and str(entry.get("id")) in fresh:
                entry["vector"] = fresh[str(entry.get("id"))]
                replaced.add(str(entry.get("id")))
    elif isinstance(data, dict) and isinstance(data.get("nodes"), list):
        for node in data["nodes"]:
            metadata = node.get("metadata") if isinstance(node, dict) else None
            if isinstance(metadata, dict) and isinstance(metadata.get("embedding"), list) \
                    and metadata["embedding"] and str(node.get("id")) in fresh:
                metadata["embedding"] = fresh[str(node.get("id"))]
                replaced.add(str(node.get("id")))
    missing = sorted(set(fresh) - replaced)
    if missing:
        raise FormatError(f"{path.name} holds no vector for the memory {missing[0]!r}.")
    return data


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


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0
