"""Where MemOS makes, stores, merges and *uses* a cache: each cache carries its producer, and
the model that consumes it must be that producer.

Every MemOS 2.0.33 function that returns or stores a cache (swept from its source by
``tests/memos/test_memos_cache_paths.py``, not listed by hand) is covered here:

- made: ``HFLLM.build_kv_cache`` (what ``KVCacheMemory.extract`` and ``from_textual_memory``
  call) registers the new cache with the model that ran the prefill, its source text and the
  token ids MemOS prefilled; the two wrapped extractors then name it by its item id;
- stored: ``KVCacheMemory.add`` takes a cache only when its producer is known and is the
  memory's own model;
- merged: ``get_cache`` -> ``_concat_caches`` merges parts of one known producer (the merge
  carries it; parts of two producers are refused, naming both);
- used: ``HFLLM._generate_with_cache`` / ``_generate_with_cache_stream`` (where ``generate``,
  ``generate_stream``, ``MOS.chat``, ``MOSCore.chat``, the CoT path and the scheduler's test
  MOS all end, and any direct caller) take a cache only from its producer.

A cache whose producer is unknown (built by a raw forward pass, another process's cache loaded
without cubepack, a registered cache whose tensors were replaced since) or is another model
is never used silently: the hook's ``on_mismatch`` applies, wherever it is met: ``error``
raises :class:`IdentityMismatch` naming the item, the call and how to register the producer
(:func:`register`, or build it with ``HFLLM.build_kv_cache`` under the hook); ``drop`` goes on
without it (one warning; generation answers without a cache); ``rebuild`` re-extracts it with
the consuming model from the source text MemOS recorded, and refuses where there is none.

A copy (``deepcopy``, ``model_copy``, a pickle round trip, a move to another device) keeps its
producer (found by content). Generation gets a fresh ``DynamicCache`` over the stored tensors
(transformers' update concatenates into new tensors), so a stored cache never grows (MemOS
#2301). Out of reach, and said in SECURITY.md with a test each: a registered cache's tensors
written in place (the same tensor objects: the registry follows tensors, not their bytes); a
model whose weights are overwritten in memory after loading (a loaded model's fingerprint is
that of its files when cubepack first fingerprinted it: a folder rewritten after that keeps the
model's identity, one rewritten before cubepack first saw the model is read as it is now); and
vLLM (``VLLMLLM.build_vllm_kv_cache`` returns a
prompt: the cache lives on the vLLM server, whose model MemOS only names).
Measured: ``bench/memos_use.py``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import PurePath
from typing import Any

from ..errors import (
    CubepackError,
    IdentityMismatch,
    Mismatch,
    ModelNotFoundError,
    UnsupportedError,
)
from ..identity._fingerprint import fingerprint
from ..identity._identity import ModelIdentity, compare
from ..kv._format import structure_problems
from ..kv._torch import (
    cache_from_layers,
    cache_layers,
    content_digest,
    holds_nothing,
    initialise_assigned_layers,
    layer_classes,
    live_layers,
)
from ..kinds._seam import (  # noqa: F401  (the hook's names for them)
    UNKNOWN,
    UNKNOWN_FINDING,
    USE_ADVICE,
    USE_FINDING,
    use_problems,
)
from ..kinds._seam import reprefill
from ..memos_format._layout import memos_prompt_ids
from ..trust._evidence import ASSERTED, RECORDED, STRENGTH
from ._privacy import cube_memories, ever_sealed, forget_stores, note_sealed, seal, seals_of

logger = logging.getLogger("cubepack.memos")

EXTRACTED = {"kind": RECORDED, "detail": "extracted by this model in MemOS (KVCacheMemory."
                                         "extract / from_textual_memory), under the hook"}
#: The label of a producer the user named (:func:`register_cache`): their word, never more.
USER_ASSERTED = {"kind": ASSERTED, "detail": "registered by the user "
                                             "(cubepack.memos.register(cache, model))"}
#: The label a merge takes from a part with no record (the weakest; checked_parts refuses such
#: parts before a merge, so this is a floor, not a path).
NO_RECORD = {"kind": ASSERTED, "detail": "a part with no producer record"}
#: The strongest label a merge carries: each part is its producer's (recorded), but the merge is
#: no prefill of its tokens (its later parts' positions restart at 0 and never attended to the
#: earlier ones), so a part's ``recomputed`` never passes to it.
MERGED = {"kind": RECORDED, "detail": "a merge of activations (KVCacheMemory.get_cache): each "
                                      "part is its producer's; the merge is no prefill of "
                                      "their tokens"}


@dataclass(frozen=True)
class Produced:
    """What cubepack knows of a cache it installed or saw made: who produced it, from what,
    and the label a dump gives its producer (``provenance``)."""

    item_id: str
    producer: ModelIdentity
    metadata: dict[str, Any] = field(default_factory=dict)
    token_ids: tuple[int, ...] | None = None
    provenance: dict[str, Any] = field(default_factory=lambda: dict(EXTRACTED))
    #: the private cubes it came from (:class:`~._privacy.Seal`): a memory that takes it is
    #: sealed, so privacy travels with the cache as its producer does
    seals: frozenset[Any] = frozenset()


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
#: content digest -> record, for content a private cube brought: never forgotten (a copy
#: made after 4,096 other caches must stay private), and bounded by the private caches loaded.
_SEALED: dict[str, Produced] = {}
_LOCK = threading.Lock()


def register(cache: Any, item_id: str, producer: ModelIdentity, metadata: dict[str, Any],
             token_ids: Any = None, provenance: dict[str, Any] | None = None,
             seals: frozenset[Any] = frozenset()) -> Any:
    """Remember ``cache``'s producer (by the object while it lives, and by its content), and
    the private cubes it came from (``seals``); return the cache."""
    ids = tuple(int(t) for t in token_ids) if token_ids is not None else None
    record = Produced(item_id, producer, dict(metadata or {}), ids,
                      dict(provenance or EXTRACTED), frozenset(seals))
    if seals:
        note_sealed()
    _remember(cache, cache_layers(cache), record)
    return cache


def add_seals(cache: Any, seals: frozenset[Any]) -> None:
    """Add ``seals`` to the record of the registered ``cache`` (and of its content), without
    hashing it again: a cache rebuilt from a private cube's source text is private too."""
    if not seals:
        return
    with _LOCK:
        try:
            entry = _PRODUCED.get(cache)
        except TypeError:
            entry = None
        if entry is None:
            return
        old = entry.record
        entry.record = replace(old, seals=old.seals | seals)
        for digest, record in list(_BY_CONTENT.items()):
            if record is old:
                del _BY_CONTENT[digest]
                _SEALED[digest] = entry.record


def forget_sealed_content() -> None:
    """Forget the contents private cubes brought and that this process ever sealed anything
    (objects keep the marks they carry): for a test runner, whose test modules each stand for
    a fresh process. Never called by cubepack itself: a sealed content stays sealed."""
    with _LOCK:
        _SEALED.clear()
    forget_stores()


def memory_seals(memory: Any) -> frozenset[Any]:
    """What marks a memory: its own seals (:func:`~._privacy.seals_of`: the instance, its
    database) and, for an activation memory, those its caches carry (a cache copied from a
    private cube's memory keeps its seal, as it keeps its producer)."""
    if memory is None:
        return frozenset()
    items = getattr(memory, "kv_cache_memories", None) or {}
    # An on-demand memory (._ondemand) answers with what it holds: the memories it has not
    # fetched are a clear cube's (no seal), and reading them here would fetch them all.
    held = getattr(items, "held", None)
    caches = [cache for item in (held() if callable(held) else items.values())
              if (cache := getattr(item, "memory", None)) is not None
              and not isinstance(cache, str)]  # a vLLM memory holds prompt strings
    return seals_of(memory) | cache_seals(caches)


def cube_seals(cube: Any) -> frozenset[Any]:
    """What marks any memory of a MemOS cube."""
    return frozenset().union(*(memory_seals(memory) for memory in cube_memories(cube)))


def cache_seals(caches: Any) -> frozenset[Any]:
    """The seals the records of ``caches`` carry (unknown caches carry none)."""
    found: set[Any] = set()
    if not ever_sealed():  # nothing private was ever loaded here: no cache to hash
        return frozenset()
    for cache in caches:
        record = produced(cache) if cache is not None else None
        if record is not None:
            found |= record.seals
    return frozenset(found)


def _remember(cache: Any, layers: list[tuple], record: Produced) -> None:
    refs = tuple(weakref.ref(tensor) for _, _, keys, values in layers
                 for tensor in (keys, values))
    digest = content_digest(layers)
    with _LOCK:
        try:
            _PRODUCED[cache] = _Entry(record, refs)
        except TypeError:  # a legacy tuple cache cannot be weakly referenced: by content only
            pass
        # A content a private cube brought stays private whoever registers it again (an
        # identical cache is indistinguishable from a copy); the object keeps its own record.
        earlier = _SEALED.get(digest)
        if earlier is not None or record.seals:
            seals = record.seals | (earlier.seals if earlier is not None else frozenset())
            _SEALED[digest] = replace(record, seals=seals)
            _BY_CONTENT.pop(digest, None)
            return
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
    digest = content_digest(layers)
    with _LOCK:
        record = _SEALED.get(digest) or _BY_CONTENT.get(digest)
    if record is not None:
        return record, "copy"
    return (entry.record, "changed") if entry is not None else (None, "unknown")


def produced(cache: Any) -> Produced | None:
    """The record of ``cache`` (or of the cache it is a copy of), unless it changed since."""
    record, state = lookup(cache)
    return record if state in ("registered", "copy") else None


#: How a user tells cubepack a cache's producer, for the refusals that meet an unknown one.
REGISTER_ADVICE = ("Build the cache with HFLLM.build_kv_cache (or KVCacheMemory.extract) with "
                   "the hook installed, or register its producer: "
                   "cubepack.memos.register(cache, model); or install the hook with "
                   "on_mismatch='drop' (go on without it) or 'rebuild' (re-extract it from its "
                   "source text)")


def live_identity(model: Any, call: str) -> ModelIdentity:
    """The fingerprint of ``model``, the model ``call`` runs; a model cubepack cannot
    fingerprint (a test double, a model without weights) is a typed error naming the call."""
    try:
        return fingerprint(model)
    except ModelNotFoundError as exc:
        if isinstance(model, (str, PurePath)):  # (a test double claims os.PathLike too)
            raise  # a name that names no model: its own refusal says so
        failure: Exception = exc  # a live object that is no model cubepack can read
    except CubepackError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to read the model: one sentence
        failure = exc
    raise UnsupportedError(
        f"{call}: cubepack cannot fingerprint the model it runs ({type(model).__name__}: "
        f"{type(failure).__name__}: {str(failure)[:200]}), so a cache it builds or uses cannot "
        "be tied to its producer. Use a transformers model loaded from a folder or the Hub, "
        "or call cubepack.memos.uninstall() to run MemOS unguarded.") from failure


def register_cache(cache: Any, model: Any, *, item_id: str = "registered",
                   token_ids: Any = None, source_text: str | None = None) -> Any:
    """Tell the hook that ``model`` produced ``cache`` (built outside MemOS, e.g. by your own
    prefill): it is then accepted where that model uses it, refused elsewhere. The producer is
    ``model``'s fingerprint, taken now; return the cache.

    ``source_text`` lets ``on_mismatch='rebuild'`` re-extract it for another model.

    This is your word, so it is labelled ``asserted`` (never ``recorded``: a claim never gains
    strength), and it never overrides what cubepack recorded: a cache cubepack saw another
    model make is refused, naming both. Registering a cache with the model already on record
    keeps its record (and its stronger label).

    Raises:
        IdentityMismatch: the cache is on record as another model's.
    """
    live = live_identity(model, "cubepack.memos.register")
    metadata = {"source_text": source_text} if source_text is not None else {}
    existing, state = lookup(cache)
    if existing is not None and state in ("registered", "copy"):
        mismatches = compare(existing.producer, live)
        if mismatches:
            raise IdentityMismatch(
                f"cubepack.memos.register of activation {existing.item_id!r} (on record as "
                f"produced by {existing.producer.model_id or 'another model'}, weights "
                f"{existing.producer.weights_digest[:19]}) for "
                f"{getattr(model, 'name_or_path', None) or type(model).__name__} (weights "
                f"{live.weights_digest[:19]})",
                mismatches,
                "cubepack saw another model produce this cache, and a registration never "
                "overrides that record; use it with its producer, or build a cache with this "
                "model (HFLLM.build_kv_cache / KVCacheMemory.extract under the hook).",
                finding="is on record as another model's")
        return register(cache, existing.item_id, existing.producer,
                        {**existing.metadata, **metadata},
                        existing.token_ids if existing.token_ids else token_ids,
                        existing.provenance)
    return register(cache, item_id, live, metadata, token_ids, dict(USER_ASSERTED))


def record_build(llm: Any, messages: Any, cache: Any) -> Any:
    """After MemOS's ``HFLLM.build_kv_cache(messages)``: register the cache with the model that
    ran the prefill, the source text (when one string) and the token ids MemOS prefilled
    (rebuilt through its chat template)."""
    if cache is None:
        return cache
    live = live_identity(getattr(llm, "model", None), "HFLLM.build_kv_cache")
    source = messages if isinstance(messages, str) else None
    try:
        ids = memos_prompt_ids(llm.tokenizer, source) if source is not None else None
        ids = ids if ids is not None and len(ids) == cache.get_seq_length() else None
    except Exception:  # noqa: BLE001 - no chat template or an odd source: no ids, not a guess
        ids = None
    metadata = {"source_text": source} if source is not None else {}
    return register(cache, "built by HFLLM.build_kv_cache", live, metadata, ids)


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
    # A cache a sealed memory makes (the scheduler composes one of the cube's private texts)
    # is private as the memory is.
    register(item.memory, item.id, live_identity(model, "KVCacheMemory.extract"), metadata, ids,
             seals=seals_of(act_mem))
    return item


def checked_add(act_mem: Any, items: list[Any], policy: str) -> list[Any]:
    """Before MemOS's ``KVCacheMemory.add(items)``: the items it may store. Each cache's
    producer must be known and be the memory's own model (named by its item id from now on);
    otherwise ``policy``: ``error`` raises, ``drop`` leaves the item out, ``rebuild``
    re-extracts it with the memory's model from its ``source_text``.

    Raises:
        IdentityMismatch: a cache of unknown origin or of another model (policy ``error``, or
            ``rebuild`` with no source text).
    """
    kept, live = [], None
    for item in items:
        cache = getattr(item, "memory", None)
        if cache is None:
            kept.append(item)
            continue
        record, state = lookup(cache)
        if live is None:
            live = live_identity(getattr(act_mem.llm, "model", None), "KVCacheMemory.add")
        mismatches = [UNKNOWN] if state in ("unknown", "changed") else \
            compare(record.producer, live)
        if not mismatches:
            register(cache, item.id, record.producer,
                     {**record.metadata, **(getattr(item, "metadata", None) or {})},
                     record.token_ids, record.provenance, record.seals)
            seal(act_mem, record.seals)  # a private cube's cache makes the memory private
            kept.append(item)
            continue
        what = f"Activation {item.id!r} added to KVCacheMemory (KVCacheMemory.add)"
        source = (getattr(item, "metadata", None) or {}).get("source_text") or \
            (record.metadata.get("source_text") if record is not None else None)
        if policy == "drop":
            logger.warning("cubepack: %s: left out (%s)", what,
                           ", ".join(f"{m.field} {m.found}" for m in mismatches))
            continue
        if policy == "rebuild" and isinstance(source, str):
            rebuilt = act_mem.llm.build_kv_cache(source)  # hooked: registered with its model
            item = item.model_copy(update={"memory": rebuilt})
            seals = record.seals if record is not None else frozenset()
            register(rebuilt, item.id, live, {**(item.metadata or {}), "source_text": source},
                     seals=seals)
            seal(act_mem, seals)
            logger.warning("cubepack: %s: rebuilt with the memory's model", what)
            kept.append(item)
            continue
        advice = (REGISTER_ADVICE if state in ("unknown", "changed") else
                  "It was built by another model than this memory's; add it to that model's "
                  "memory, or re-extract it with this one.")
        raise IdentityMismatch(what, mismatches, advice + (
            "" if policy != "rebuild" else "; it records no source text to rebuild it from."),
            finding=UNKNOWN_FINDING if state in ("unknown", "changed")
            else "was produced by another model than this memory's")
    return kept


def checked_parts(caches: list[Any], policy: str) -> list[Any]:
    """Before MemOS's ``_concat_caches`` (``get_cache``'s merge): the parts it may merge. A
    part of unknown origin is never merged silently: ``drop`` leaves it out (one warning);
    ``error`` and ``rebuild`` (a part has no item to rebuild it from here) refuse.

    Raises:
        IdentityMismatch: naming the part.
    """
    kept = []
    for index, cache in enumerate(caches):
        record, state = lookup(cache)
        if state in ("registered", "copy"):
            kept.append(cache)
            continue
        what = f"Part {index + 1} of a KVCacheMemory.get_cache merge"
        if policy == "drop":
            logger.warning("cubepack: %s: left out (its producer is unknown)", what)
            continue
        raise IdentityMismatch(what, [UNKNOWN], REGISTER_ADVICE + (
            "" if policy != "rebuild" else "; a merge's part has no source to rebuild from"),
            finding=UNKNOWN_FINDING)
    return kept


def merged(caches: list[Any], result: Any) -> Any:
    """After MemOS's ``_concat_caches``: the merged cache holds its parts (MemOS's merge is
    empty to transformers >= 4.56 otherwise) and carries their producer, labelled as its
    weakest part, at most ``recorded`` (:data:`MERGED`).

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
    weakest = min((record.provenance if record else NO_RECORD for record, _ in found),
                  key=lambda label: STRENGTH.get(label.get("kind"), 0))
    if STRENGTH.get(weakest.get("kind"), 0) > STRENGTH[RECORDED]:
        weakest = MERGED
    record = Produced("+".join(record.item_id if record else "?" for record, _ in found),
                      first.producer, {}, ids, dict(weakest),
                      frozenset().union(*(record.seals for record, _ in known)))
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


def for_use(llm: Any, cache: Any, policy: str,
            call: str = "HFLLM.generate (_generate_with_cache)") -> Any | None:
    """The cache ``llm`` may generate from: a fresh ``DynamicCache`` over ``cache``'s tensors
    once its producer (or, for a cache cubepack never saw, its shape) matches the consuming
    model; None when the policy drops it; a rebuilt cache under ``rebuild``.

    Raises:
        IdentityMismatch: the consuming model is not the producer (policy ``error``), a
            registered cache changed since it was checked, or a cache of unknown origin does
            not fit the consuming model.
    """
    model = llm.model
    live = live_identity(model, call)  # a model cubepack cannot read: typed, naming the call
    try:
        layers = cache_layers(cache)
    except CubepackError as exc:  # a layer keeping its content elsewhere: never read as empty
        raise IdentityMismatch(
            "A KV cache handed to HFLLM.generate", [Mismatch(
                "layers", "transformers' DynamicLayer / DynamicSlidingWindowLayer",
                layer_classes(cache))], str(exc),
            finding="cannot be checked by cubepack's guard") from exc
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
        what = "A KV cache handed to HFLLM._generate_with_cache"
        mismatches = [UNKNOWN] + structure_problems(live_layers(layers), live)
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
        policies = ("install the hook with on_mismatch='drop' (answer without the cache) or "
                    "'rebuild' (re-extract it with the chat model).")
        if state == "changed":
            hint, finding = ("It was grown by a direct generation call, or its tensors were "
                             "replaced, so it is no longer the stored memory; reload the cube "
                             "or re-extract it."), "changed after cubepack checked it"
        elif record is None:
            hint, finding = REGISTER_ADVICE + ".", UNKNOWN_FINDING
        elif any(m.of_producer for m in mismatches):
            hint, finding = ("The chat model is not the model that produced this cache; chat "
                             "with the cube's pinned model (MOSConfig.chat_model), or "
                             + policies), None  # None: the producer's fields say so
        else:  # its producer is this model: the cache itself does not fit it
            hint, finding = USE_ADVICE + ", or " + policies, USE_FINDING
        raise IdentityMismatch(what, mismatches, hint, finding=finding)
    return fresh_view(cache, model, layers)


def _length(layers: list[tuple]) -> int:
    return max((int(cumulative) for _, cumulative, _, _ in layers), default=0)


def fresh_view(cache: Any, model: Any, layers: list | None = None) -> Any:
    """A new ``DynamicCache`` holding ``cache``'s tensors (views, no copy) on the model's device:
    whatever generation appends lands in it, not in ``cache``."""
    return cache_from_layers(layers if layers is not None else cache_layers(cache), model.config,
                             device=model.device)


def guarded_use(original: Any, unguarded: Any, settings: Any, *, stream: bool = False) -> Any:
    """``HFLLM._generate_with_cache`` / ``_generate_with_cache_stream`` under the hook (where
    ``generate``, ``generate_stream`` and every chat path hand MemOS's cache to the model, and
    any direct caller): the cache is checked (:func:`for_use`, the policy in force when
    called) and the model gets a fresh view of it; a dropped cache answers without one
    (``unguarded``: ``_generate_full`` / ``_generate_full_stream``). The stream's check runs at
    its first ``next()``, where MemOS's own errors surface."""
    call = ("HFLLM.generate_stream (_generate_with_cache_stream)" if stream
            else "HFLLM.generate (_generate_with_cache)")

    def checked(self: Any, kv: Any) -> Any:
        if kv is not None and _is_empty(kv):
            return kv  # no tokens: nothing to check (MemOS accepts it)
        return for_use(self, kv, settings().mismatch_action(), call) if kv is not None else None

    if stream:
        def use(self: Any, query: Any, kv: Any, **kwargs: Any) -> Any:
            cache = checked(self, kv)
            if cache is None:
                yield from unguarded(self, query, **kwargs)
            else:
                yield from original(self, query, cache, **kwargs)
    else:
        def use(self: Any, query: Any, kv: Any, **kwargs: Any) -> Any:
            cache = checked(self, kv)
            return unguarded(self, query, **kwargs) if cache is None else \
                original(self, query, cache, **kwargs)

    use.__wrapped__ = original
    use.__doc__ = original.__doc__
    return use


def _is_empty(cache: Any) -> bool:
    """True when *every* layer holds no position, judged on where each layer keeps its content
    (:func:`~cubepack.kv._torch.holds_nothing`). ``get_seq_length()`` reads layer 0 only, and a
    quantized, linear-attention or KV-sharing layer keeps its content beside empty ``keys``: a
    cache with such a layer, or an empty first layer and another model's tensors behind it, is
    not empty: it is checked like any other."""
    try:
        return holds_nothing(cache)
    except Exception:  # noqa: BLE001 - not a cache object: for_use reports it
        return False
