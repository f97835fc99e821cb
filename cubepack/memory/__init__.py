"""The memory kinds a cube holds, and what each is valid for. No decisions about trust.

- ``_adapters``: parametric memory, LoRA adapters in PEFT's layout, checked against PEFT's
  own rules (an allow-list, bounded) and pinned to their base's weight shapes;
- ``_vectors`` and ``_embedder``: textual memories' vectors and the embedder that makes them;
- ``_reprefill``: activations computed again by a new producer (migrate).
"""
