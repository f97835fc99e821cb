"""Where MemOS *uses* a cache: the model that consumes it is checked, and MemOS gets a fresh
cache per use, so what is stored never grows.

MemOS hands activations to an LLM in one place, ``HFLLM.generate`` / ``generate_stream`` with
``past_key_values`` (``MOS.chat``, ``MOSCore.chat``, the CoT path and the scheduler's test MOS
all end there). The hook wraps both:

- the cache's producer is known when cubepack (or MemOS's own ``extract``, wrapped too) made or
  installed it: each such cache is registered here with its producer identity, item id, source
  and token ids. The consuming model must be that producer (its strict fields), else the policy
  applies, as on load: ``error`` raises :class:`IdentityMismatch` naming the item and fields,
  ``drop`` answers without the cache (one warning), ``rebuild`` re-extracts it with the
  consuming model from its source;
- a cache cubepack does not know is checked for shape against the consuming model (layers, KV
  heads, head dim, dtype), so another layer count is this refusal, never an ``IndexError`` deep
  in transformers;
- generation extends the cache it is given (MemOS #2301: a stored cache went 48 -> 315 -> 616
  tokens over two chats). It now gets a new ``DynamicCache`` over the same tensors (no copy:
  transformers' update concatenates into new tensors), so the stored cache is left as it was.
  Measured: ``bench/memos_use.py``.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from typing import Any

from ..cube._memos_layout import memos_prompt_ids
from ..errors import CubepackError, IdentityMismatch
from ..identity._fingerprint import fingerprint
from ..identity._identity import ModelIdentity, compare
from ..kv._format import structure_problems
from ..kv._torch import cache_from_layers, cache_layers, live_layers

logger = logging.getLogger("cubepack.memos")


@dataclass(frozen=True)
class Produced:
    """What cubepack knows of a cache it installed or saw made: who produced it, from what."""

    item_id: str
    producer: ModelIdentity
    metadata: dict[str, Any] = field(default_factory=dict)
    token_ids: tuple[int, ...] | None = None


_PRODUCED: "weakref.WeakKeyDictionary[Any, Produced]" = weakref.WeakKeyDictionary()


def register(cache: Any, item_id: str, producer: ModelIdentity, metadata: dict[str, Any],
             token_ids: Any = None) -> Any:
    """Remember ``cache``'s producer (for as long as the cache lives); return the cache."""
    ids = tuple(int(t) for t in token_ids) if token_ids is not None else None
    _PRODUCED[cache] = Produced(item_id, producer, dict(metadata or {}), ids)
    return cache


def produced(cache: Any) -> Produced | None:
    return _PRODUCED.get(cache)


def record_extraction(act_mem: Any, item: Any, source: Any) -> Any:
    """After MemOS's own ``extract``: register the new cache with the memory's model as its
    producer and the token ids MemOS prefilled (rebuilt through its chat template)."""
    model = getattr(act_mem.llm, "model", None)
    if model is None or item is None or getattr(item, "memory", None) is None:
        return item
    try:
        ids = memos_prompt_ids(act_mem.llm.tokenizer, source)
        ids = ids if len(ids) == item.memory.get_seq_length() else None
    except Exception:  # noqa: BLE001 - no chat template or an odd source: no ids, not a guess
        ids = None
    register(item.memory, item.id, fingerprint(model), item.metadata, ids)
    return item


def for_use(llm: Any, cache: Any, policy: str) -> Any | None:
    """The cache ``llm`` may generate from: a fresh ``DynamicCache`` over ``cache``'s tensors
    once its producer (or, for a cache cubepack never saw, its shape) matches the consuming
    model; None when the policy drops it; a rebuilt cache under ``rebuild``.

    Raises:
        IdentityMismatch: the consuming model is not the producer (policy ``error``), or a
            cache of unknown origin does not fit the consuming model.
    """
    model = llm.model
    live = fingerprint(model)
    record = _PRODUCED.get(cache)
    try:
        layers = cache_layers(cache)
    except CubepackError as exc:
        raise IdentityMismatch("A KV cache handed to HFLLM.generate", [],
                               f"It cannot be used by cubepack's guard: {exc}") from exc
    if record is not None:
        mismatches = compare(record.producer, live)
        what = f"Activation {record.item_id!r}, used by {getattr(model, 'name_or_path', 'the model')}"
    else:
        mismatches = structure_problems(live_layers(layers), live)
        what = "A KV cache of unknown origin handed to HFLLM.generate"
    if mismatches:
        if policy == "drop":
            logger.warning("cubepack: %s: not used (%s); answering without it", what,
                           ", ".join(m.field for m in mismatches))
            return None
        if policy == "rebuild" and record is not None and record.metadata.get("source_text"):
            logger.warning("cubepack: %s: rebuilt with the consuming model", what)
            fresh = llm.build_kv_cache(record.metadata["source_text"])
            register(fresh, record.item_id, live, record.metadata)
            return fresh_view(fresh, model)
        raise IdentityMismatch(
            what, mismatches,
            "The chat model is not the model that produced this cache; chat with the cube's "
            "pinned model (MOSConfig.chat_model), or install the hook with on_mismatch='drop' "
            "(answer without the cache) or 'rebuild' (re-extract it with the chat model).")
    return fresh_view(cache, model, layers)


def fresh_view(cache: Any, model: Any, layers: list | None = None) -> Any:
    """A new ``DynamicCache`` holding ``cache``'s tensors (views, no copy) on the model's device:
    whatever generation appends lands in it, not in ``cache``."""
    view = cache_from_layers(layers if layers is not None else cache_layers(cache), model.config,
                             device=model.device)
    record = _PRODUCED.get(cache)
    if record is not None:
        _PRODUCED[view] = record
    return view


def guarded_generate(original: Any, settings: Any) -> Any:
    """``HFLLM.generate`` / ``generate_stream`` under the hook (``settings()`` gives the policy
    in force when called)."""

    def generate(self: Any, messages: Any, past_key_values: Any = None, **kwargs: Any) -> Any:
        if past_key_values is not None and _is_empty(past_key_values):
            from transformers import DynamicCache

            past_key_values = DynamicCache()  # no tokens: nothing to check (MemOS accepts it)
        elif past_key_values is not None:
            past_key_values = for_use(self, past_key_values, settings().on_mismatch)
        if past_key_values is None:
            return original(self, messages, **kwargs)
        return original(self, messages, past_key_values=past_key_values, **kwargs)

    generate.__wrapped__ = original
    generate.__doc__ = original.__doc__
    return generate


def _is_empty(cache: Any) -> bool:
    try:
        return cache.get_seq_length() == 0
    except Exception:  # noqa: BLE001 - not a cache object: for_use reports it
        return False
