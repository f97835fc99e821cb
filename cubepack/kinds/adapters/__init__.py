"""Adapters: parametric memory, LoRA adapters in PEFT's layout (``parametric/<name>/``),
pinned to their base model and its weight shapes, applied by ``load_adapter``.

- ``_kind``: the kind's phases (:class:`Adapters`);
- ``_lora``: PEFT's own rules, checked without PEFT (an allow-list, bounded).
"""

from ._kind import Adapters

KIND = Adapters()

__all__ = ["KIND", "Adapters"]
