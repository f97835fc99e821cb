"""Activations: KV caches (``activations/<id>.kv.safetensors``, or a vLLM cube's prompts),
pinned to the producer that computed them, proved by its own prefill.

- ``_kind``: the kind's phases (:class:`Activations`);
- ``_reprefill``: activations computed again by a new producer (migrate, the MemOS hook).
"""

from ._kind import Activations

KIND = Activations()

__all__ = ["KIND", "Activations"]
