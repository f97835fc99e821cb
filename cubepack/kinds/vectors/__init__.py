"""Vectors: a text memory's embedding vectors, pinned to the embedder that made them (its
pin's vectors record), proved by re-embedding.

- ``_kind``: the kind's phases (:class:`Vectors`);
- ``_vectors``: the vectors a text memory holds, and what the lock records of them;
- ``_embedder``: the embedders (local, OpenAI-compatible, Ollama) and what they are asked;
- ``_check``: the re-embedding check pack, verify and the MemOS hook share.
"""

from ._kind import Vectors

KIND = Vectors()

__all__ = ["KIND", "Vectors"]
