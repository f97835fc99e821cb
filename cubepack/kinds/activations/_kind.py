"""The activations kind's phases."""

from __future__ import annotations

from typing import ClassVar

from .._kind import Kind


class Activations(Kind):
    """KV caches and a vLLM cube's prompts: the ``activations`` section."""

    name: ClassVar[str] = "activations"
    section: ClassVar[str | None] = "activations"
    memory: ClassVar[str | None] = "activation"
    serves: ClassVar[str | None] = "load_kv_cache"
