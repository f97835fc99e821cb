"""Where MemOS *uses* a cache: the model that consumes it is checked, and MemOS gets a fresh
cache per use, so what is stored never grows.

MemOS hands activations to an LLM in one place, ``HFLLM.generate`` / ``generate_stream`` with
``past_key_values`` (``MOS.chat``, ``MOSCore.chat``, the CoT path and the scheduler's test MOS
all end there). The hook wraps both:

- the cache's producer is known when cubepack (or MemOS's own ``extract`` and
  ``from_textual_memory``, wrapped too) made or installed it: each such cache is registered
  here with its producer identity, item id, source, token ids and producer label. A copy
  (``deepcopy``, ``model_copy``, a pickle round trip) is found by its content digest, and
  MemOS's merge of several caches (``get_cache`` -> ``_concat_caches``) carries their common
  producer (caches of different producers are refused). A registered cache whose tensors were
  replaced since (grown by a direct ``_generate_with_cache``, swapped) is no longer the memory
  cubepack checked: it is a mismatch, handled by the policy. The consuming model must be that producer (its strict fields), else the policy
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
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import CubepackError, IdentityMismatch, Mismatch
from ..identity._fingerprint import fingerprint
from ..identity._identity import ModelIdentity, compare
from ..kv._format import structure_problems
from ..kv._torch import (
    cache_from_layers,
    cache_layers,
    content_digest,
    initialise_assigned_layers,
    live_layers,
)
from ..memory._reprefill import reprefill
from ..memos_format._layout import memos_prompt_ids
from ..trust._evidence import ASSERTED, RECORDED, STRENGTH

logger = logging.getLogger("cubepack.memos")

EXTRACTED = {"kind": RECORDED, "detail": "extracted by this model in MemOS (KVCacheMemory."
                                         "extract / from_textual_memory), under the hook"}
SHAPE_ONLY = {"kind": ASSERTED, "detail": "no producer record: only its shape was checked "
                                          "against the model that loaded it"}


@dataclass(frozen=True)
class Produced:
    """What cubepack knows of a cache it installed or saw made: who produced it, from what,
    and the label a dump gives its producer (``provenance``)."""

    item_id: str
    producer: ModelIdentity
    metadata: dict[str, Any] = field(default_factory=dict)
    token_ids: tuple[int, ...] | None = None
    provenance: dict[str, Any] = field(default_factory=lambda: dict(EXTRACTED))


@dataclass
class _Entry:
    record: Produced
    tensors: tuple[Any, ...]  # weak references to the layer tensors it was registered with

    def holds(self, layers: list[tuple]) -> bool:
        current = [tensor for _, _, keys, values in layers for tensor in (keys, values)]
        return len(current) == len(self.tensors) and all(
            ref() is tensor for ref, tensor in zip(self.tensors, current))


_PRODUCED: weakref.WeakKeyDictionary[Any, _Entry] = weakref.WeakKeyDictionary()
#: content digest -> record, so a copy of a registered cache keeps its producer (bounded: the
#: oldest are forgotten first, and a forgotten copy is only shape-checked).
_BY_CONTENT: OrderedDict[str, Produced] = OrderedDict()
MAX_REMEMBERED = 4096
_LOCK = threading.Lock()


def register(cache: Any, item_id: str, producer: ModelIdentity, metadata: dict[str, Any],
             token_ids: Any = None, provenance: dict[str, Any] | None = None) -> Any:
    """Remember ``cache``'s producer (by the object while it lives, and by its content);
    return the cache."""
    ids = tuple(int(t) for t in token_ids) if token_ids is not None else None
    record = Produced(item_id, producer, dict(metadata or {}), ids,
                      dict(provenance or EXTRACTED))
    _remember(cache, cache_layers(cache), record)
    return cache


def _remember(cache: Any, layers: list[tuple], record: Produced) -> None:
    refs = tuple(weakref.ref(tensor) for _, _, keys, values in layers
                 for tensor in (keys, values))
    digest = content_digest(layers)
    with _LOCK:
        try:
            _PRODUCED[cache] = _Entry(record, refs)
        except TypeError:  # a legacy tuple cache cannot be weakly referenced: by content only
            pass
        _BY_CONTENT[digest] = record
        _BY_CONTENT.move_to_end(digest)
        while len(_BY_CONTENT) > MAX_REMEMBERED:
            _BY_CONTENT.popitem(last=False)


def lookup(cache: Any, layers: list[tuple] | None = None) -> tuple[Produced | None, str]:
    """(record, state): ``registered`` (the object, with the tensors it was registered with),
    ``copy`` (another object with a registered cache's content), ``changed`` (a registered
    object whose tensors were replaced since) or ``unknown`` (record None)."""
    layers = cache_layers(cache) if layers is None else layers
    try:
        entry = _PRODUCED.get(cache)
    except TypeError:  # not weakly referenceable (a tuple or list of layers)
        entry = None
    if entry is not None and entry.holds(layers):
        return entry.record, "registered"
    with _LOCK:
        record = _BY_CONTENT.get(content_digest(layers))
    if record is not None:
        return record, "copy"
    return (entry.record, "changed") if entry is not None else (None, "unknown")


def produced(cache: Any) -> Produced | None:
    """The record of ``cache`` (or of the cache it is a copy of), unless it changed since."""
    record, state = lookup(cache)
    return record if state in ("registered", "copy") else None


def record_extraction(act_mem: Any, item: Any, source: Any) -> Any:
    """After MemOS's own ``extract`` / ``from_textual_memory``: register the new cache with
    the memory's model as its producer and the token ids MemOS prefilled (rebuilt through its
    chat template)."""
    model = getattr(act_mem.llm, "model", None)
    if model is None or item is None or getattr(item, "memory", None) is None:
        return item
    try:
        ids = memos_prompt_ids(act_mem.llm.tokenizer, source)
        ids = ids if len(ids) == item.memory.get_seq_length() else None
    except Exception:  # noqa: BLE001 - no chat template or an odd source: no ids, not a guess
        ids = None
    metadata = {**(item.metadata or {}), "source_text": source} \
        if "source_text" not in (item.metadata or {}) and isinstance(source, str) else item.metadata
    register(item.memory, item.id, fingerprint(model), metadata, ids)
    return item


def merged(caches: list[Any], result: Any) -> Any:
    """After MemOS's ``_concat_caches``: the merged cache holds its parts (MemOS's merge is
    empty to transformers >= 4.56 otherwise) and carries their producer.

    Raises:
        IdentityMismatch: the parts were produced by different models (no model's cache).
    """
    if result is None or len(caches) < 2:
        return result
    initialise_assigned_layers(result)
    found = [lookup(cache) for cache in caches]
    known = [(record, state) for record, state in found if record is not None]
    if not known:
        return result
    first = known[0][0]
    for record, _ in known[1:]:
        mismatches = compare(first.producer, record.producer)
        if mismatches:
            raise IdentityMismatch(
                f"MemOS merged activations {first.item_id!r} and {record.item_id!r}", mismatches,
                "They were produced by different models, so their merge is no model's cache; "
                "merge only activations of one model.")
    ids = None
    if all(record is not None and record.token_ids for record, _ in found):
        ids = tuple(token for record, _ in found for token in record.token_ids)
    weakest = min((record.provenance if record else SHAPE_ONLY for record, _ in found),
                  key=lambda label: STRENGTH.get(label.get("kind"), 0))
    record = Produced("+".join(record.item_id if record else "?" for record, _ in found),
                      first.producer, {}, ids, dict(weakest))
    if any(state == "changed" for _, state in known):
        record = replace(record, item_id=record.item_id + " (changed since cubepack checked it)")
        _remember_changed(result, record)
        return result
    _remember(result, cache_layers(result), record)
    return result


def _remember_changed(cache: Any, record: Produced) -> None:
    """Mark ``cache`` as made from a changed one: it matches no content, so it stays changed."""
    with _LOCK:
        try:
            _PRODUCED[cache] = _Entry(record, ())
        except TypeError:
            pass


def use_problems(layers: list[tuple], model: Any) -> list[Mismatch]:
    """What no stored cache may be for a model that generates from it: a batch other than
    one sequence (MemOS's prompt is one), or more positions than the model was built for."""
    found = []
    batch = {int(keys.shape[0]) for _, _, keys, _ in layers if keys.dim() == 4}
    if batch and batch != {1}:
        found.append(Mismatch("batch", 1, max(batch)))
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    longest = max((int(cumulative) for _, cumulative, _, _ in layers), default=0)
    if type(limit) is int and longest > limit:
        found.append(Mismatch("seq_length", f"<= {limit} (max_position_embeddings)", longest))
    return found


def for_use(llm: Any, cache: Any, policy: str) -> Any | None:
    """The cache ``llm`` may generate from: a fresh ``DynamicCache`` over ``cache``'s tensors
    once its producer (or, for a cache cubepack never saw, its shape) matches the consuming
    model; None when the policy drops it; a rebuilt cache under ``rebuild``.

    Raises:
        IdentityMismatch: the consuming model is not the producer (policy ``error``), a
            registered cache changed since it was checked, or a cache of unknown origin does
            not fit the consuming model.
    """
    model = llm.model
    live = fingerprint(model)
    try:
        layers = cache_layers(cache)
    except CubepackError as exc:
        raise IdentityMismatch("A KV cache handed to HFLLM.generate", [],
                               f"It cannot be used by cubepack's guard: {exc}") from exc
    record, state = lookup(cache, layers)
    name = getattr(model, "name_or_path", "the model")
    if state == "changed":
        what = f"Activation {record.item_id!r}, used by {name}"
        mismatches = [Mismatch("content", "the tensors cubepack checked",
                               f"other tensors ({_length(layers)} positions)")]
    elif record is not None:
        what = f"Activation {record.item_id!r}, used by {name}"
        mismatches = compare(record.producer, live)
    else:
        what = "A KV cache of unknown origin handed to HFLLM.generate"
        mismatches = structure_problems(live_layers(layers), live)
    mismatches = mismatches or use_problems(layers, model)
    if mismatches:
        if policy == "drop":
            logger.warning("cubepack: %s: not used (%s); answering without it", what,
                           ", ".join(m.field for m in mismatches))
            return None
        if policy == "rebuild" and record is not None and (
                record.token_ids or record.metadata.get("source_text") is not None):
            try:  # the one re-prefill (memory/_reprefill.py), as on load and in migrate
                done = reprefill(model, record.item_id, token_ids=list(record.token_ids or ()),
                                 metadata=record.metadata, producer=record.producer,
                                 identity=live, tokenizer=lambda: llm.tokenizer)
            except CubepackError as exc:
                raise IdentityMismatch(what, mismatches, f"It cannot be rebuilt: {exc}") from exc
            logger.warning("cubepack: %s: rebuilt with the consuming model", what)
            register(done.cache, record.item_id, live, record.metadata, done.token_ids)
            return fresh_view(done.cache, model)
        hint = ("It changed after cubepack checked it (grown by a direct generation call, or "
                "its tensors replaced), so it is no longer the stored memory; reload the cube "
                "or re-extract it." if state == "changed" else
                "The chat model is not the model that produced this cache; chat with the cube's "
                "pinned model (MOSConfig.chat_model), or install the hook with "
                "on_mismatch='drop' (answer without the cache) or 'rebuild' (re-extract it with "
                "the chat model).")
        raise IdentityMismatch(what, mismatches, hint)
    return fresh_view(cache, model, layers)


def _length(layers: list[tuple]) -> int:
    return max((int(cumulative) for _, cumulative, _, _ in layers), default=0)


def fresh_view(cache: Any, model: Any, layers: list | None = None) -> Any:
    """A new ``DynamicCache`` holding ``cache``'s tensors (views, no copy) on the model's device:
    whatever generation appends lands in it, not in ``cache``."""
    return cache_from_layers(layers if layers is not None else cache_layers(cache), model.config,
                             device=model.device)


def guarded_generate(original: Any, settings: Any, *, stream: bool = False) -> Any:
    """``HFLLM.generate`` / ``generate_stream`` under the hook (``settings()`` gives the policy
    in force when called). The stream's check runs at its first ``next()``, where MemOS's own
    errors surface."""

    def checked(self: Any, past_key_values: Any) -> Any:
        if past_key_values is not None and _is_empty(past_key_values):
            from transformers import DynamicCache

            return DynamicCache()  # no tokens: nothing to check (MemOS accepts it)
        if past_key_values is not None:
            return for_use(self, past_key_values, settings().on_mismatch)
        return None

    def call(self: Any, messages: Any, past_key_values: Any, kwargs: dict[str, Any]) -> Any:
        cache = checked(self, past_key_values)
        if cache is None:
            return original(self, messages, **kwargs)
        return original(self, messages, past_key_values=cache, **kwargs)

    if stream:
        def generate(self: Any, messages: Any, past_key_values: Any = None, **kwargs: Any) -> Any:
            yield from call(self, messages, past_key_values, kwargs)
    else:
        def generate(self: Any, messages: Any, past_key_values: Any = None, **kwargs: Any) -> Any:
            return call(self, messages, past_key_values, kwargs)

    generate.__wrapped__ = original
    generate.__doc__ = original.__doc__
    return generate


def _is_empty(cache: Any) -> bool:
    try:
        return cache.get_seq_length() == 0
    except Exception:  # noqa: BLE001 - not a cache object: for_use reports it
        return False
