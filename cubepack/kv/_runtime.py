"""The runtime interface: what the proof asks of the thing that runs a model.

One set of comparisons and bounds (:mod:`cubepack.kv._recompute`) proves a cache for every
runtime, because each runtime supplies the same few things: what is proved is what the
*loading* runtime computes. transformers (:class:`~cubepack.kv._recompute.TorchRuntime`), MLX
(``cubepack.mlx``) and llama.cpp (``cubepack.llamacpp``) implement it; a new runtime implements
these protocols, and ``tests/kv/test_runtimes.py`` holds every runtime class to them.

- :class:`Runtime`: a prefill as ``(type, cumulative_length, keys, values)`` layers in
  transformers' layout, and the next-token logits of probe tokens fed after such layers. Enough
  for a runtime that checks a cache against its own prefill (llama.cpp's import).
- :class:`ProvingRuntime`: also its prefill's last logits and a float32 reference of the same
  model (None when it already computes in float32, or has no room: ``reference_skipped`` then
  says why), so the shared proof (``check_layers``) measures the dtype's noise against it.
- :class:`Incremental`: a greedy continuation a token a step (a runtime without it is asked
  for the prefix's probe logits again at each step, which costs more and proves the same).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Runtime(Protocol):
    #: the runtime's name, as a KV header records who computed a cache (``made_by``)
    name: str

    @property
    def vocab_size(self) -> int: ...

    def prefill_layers(self, ids: list[int]) -> list[tuple]:
        """The model's prefill of ``ids`` as ``(type, cumulative_length, keys, values)``."""

    def probe_logits(self, layers: list[tuple], probes: list[int], batch: int) -> Any:
        """float32 next-token logits ``[len(probes) * batch, vocab]`` of ``probes`` fed after
        ``layers``, without changing ``layers``."""


@runtime_checkable
class ProvingRuntime(Runtime, Protocol):
    def prefill(self, ids: list[int]) -> tuple[list[tuple], Any]:
        """(layers, ``[batch, vocab]`` float32 logits of the last position)."""

    def reference(self) -> "ProvingRuntime | None":
        """The same model computing in float32, or None (already float32, or no room: then
        the runtime's ``reference_skipped`` names why, and the weaker layer-wide rule is
        applied and said)."""


@runtime_checkable
class Incremental(Protocol):
    def greedy(self, layers: list[tuple], first: int, steps: int, batch: int) -> list[int]:
        """``first``, then ``steps - 1`` greedy tokens after ``layers``, a token a step."""
