"""Read legacy MemOS activation pickles without running code from them.

MemOS's ``KVCacheMemory.dump`` pickles ``{"kv_cache_memories": {id: KVCacheItem}}``. Plain
``pickle.load`` on such a file runs whatever callables it names. This module reads it with an
*allowlist* unpickler: every global is resolved through :data:`_ALLOWED`, mapped either to a
harmless stand-in that only records its state (the transformers and MemOS classes) or to a
function that cannot run foreign code (tensor rebuilding, datetime, dtypes). Anything else is
refused with :class:`UnsafeInputError` before it is called.

The trap: ``torch.storage._load_from_bytes`` calls ``torch.load(weights_only=False)``, so a pickle
nested in its bytes would run code. We map it to ``torch.load(..., weights_only=True)``.

Both layouts are read: current (DynamicCache ``layers``; items ``id``/``memory``) and early-2025
(``key_cache``/``value_cache``; items ``kv_cache_id``/``kv_cache``).
"""

from __future__ import annotations

import datetime
import io
import os
import pickle
import zipfile
from dataclasses import dataclass, field
from typing import Any

from .._util.canonical import LimitError, json_safe
from ..errors import FormatError, UnsafeInputError


class _StandIn:
    """Records the state pickle gives an object, and nothing else."""

    qualname = "object"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.state = args, {}

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        self.state = state if isinstance(state, dict) else {"__state__": state}

    def get(self, key: str, default: Any = None) -> Any:
        """A field, looking inside pydantic's ``__dict__`` wrapper when present."""
        inner = self.state.get("__dict__")
        if isinstance(inner, dict) and key in inner:
            return inner[key]
        return self.state.get(key, default)


def _stand_in(module: str, name: str) -> type:
    return type(name, (_StandIn,), {"qualname": f"{module}.{name}"})


def _torch_global(name: str) -> Any:
    import torch

    value = getattr(torch, name)
    if isinstance(value, torch.dtype) or value is torch.device or value is torch.Size:
        return value
    raise UnsafeInputError(f"torch.{name} is not an allowed global.")


def _tensor_rebuilder(name: str) -> Any:
    import torch._utils as torch_utils

    return getattr(torch_utils, name)


_STAND_INS = {
    ("transformers.cache_utils", "DynamicCache"),
    ("transformers.cache_utils", "DynamicLayer"),
    ("transformers.cache_utils", "DynamicSlidingWindowLayer"),
    ("memos.memories.activation.item", "KVCacheItem"),
    ("memos.memories.activation.item", "VLLMKVCacheItem"),
    ("memos.memories.activation.item", "KVCacheRecords"),
    ("memos.memories.activation.item", "ActivationMemoryItem"),
}
_DATETIME = {"datetime": datetime.datetime, "date": datetime.date, "timedelta": datetime.timedelta,
             "timezone": datetime.timezone}


def _declared_size(data: bytes) -> int:
    """What a nested ``torch.save`` payload will decode to: its zip entries' declared sizes
    (a zip may be deflated), or its own length for the legacy non-zip format (stored raw)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return sum(entry.file_size for entry in archive.infolist())
    except (zipfile.BadZipFile, ValueError):
        return len(data)


class AllowlistUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals MemOS activation pickles use.

    Nested storages (``torch.storage._load_from_bytes``) are decoded at most once each and
    within a byte budget: a pickle that reuses one compressed payload through its memo, or
    nests payloads that expand far beyond its own size, is refused instead of inflating.
    """

    def __init__(self, file: Any, *, budget: int):
        super().__init__(file)
        self._budget = budget
        self._decoded: dict[int, tuple[bytes, Any]] = {}

    def _load_from_bytes(self, data: Any) -> Any:
        if not isinstance(data, (bytes, bytearray)):
            raise UnsafeInputError("torch.storage._load_from_bytes received non-bytes data.")
        known = self._decoded.get(id(data))
        if known is not None and known[0] is data:  # the memo handed the same bytes again
            return known[1]
        declared = _declared_size(data)
        self._spend(declared)  # before decoding: a bomb never inflates
        storage = _LazyStorage(data, declared)
        self._decoded[id(data)] = (data, storage)
        return storage

    def _spend(self, size: int) -> None:
        self._budget -= size
        if self._budget < 0:
            raise UnsafeInputError("The activation pickle decodes to far more tensor bytes than "
                                   "it holds (a decompression bomb); refusing it.")

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _STAND_INS:
            return _stand_in(module, name)
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _lazy_rebuilder(_tensor_rebuilder(name))
        if module == "torch.storage" and name == "_load_from_bytes":
            return self._load_from_bytes
        if module == "torch" and not name.startswith("_"):
            return _torch_global(name)
        if module == "collections" and name == "OrderedDict":
            import collections

            return collections.OrderedDict
        if module == "datetime" and name in _DATETIME:
            return _DATETIME[name]
        raise UnsafeInputError(
            f"The pickle names the global {module}.{name}, which is not on cubepack's allowlist "
            "of MemOS activation classes; refusing to load it (it could run code)."
        )


class _LazyStorage:
    """A nested ``torch.save`` payload, decoded (``weights_only=True``) only when an item's
    tensors are asked for, then its bytes dropped: a pack converts one item at a time, so the
    pickle's tensors are never all decoded at once beside their own bytes."""

    def __init__(self, data: bytes, declared: int):
        self.data: bytes | None = data
        self.declared = declared  # the bytes the payload says its storage holds
        self.storage: Any = None

    def get(self) -> Any:
        import torch

        if self.storage is None:
            try:
                self.storage = torch.load(io.BytesIO(self.data), weights_only=True)
            except pickle.UnpicklingError as exc:
                raise UnsafeInputError(f"A nested tensor pickle names a forbidden global: "
                                       f"{exc}") from exc
            self.data = None
        return self.storage


class _LazyTensor:
    """A tensor the pickle describes (shape known), built from its storage when needed."""

    def __init__(self, rebuild: Any, storage: _LazyStorage, args: tuple):
        import torch

        self.rebuild, self.storage, self.args = rebuild, storage, args
        if len(args) < 3 or not isinstance(args[1], (tuple, list, torch.Size)):
            raise FormatError("a tensor in the pickle has no shape.")
        problem = layout_problem(args[0], args[1], args[2], storage.declared)
        if problem:
            raise UnsafeInputError(f"A tensor in the pickle {problem}; refusing it (a tensor "
                                   "that reuses its bytes inflates without bound when used).")
        self.shape = torch.Size(args[1])

    def dim(self) -> int:
        return len(self.shape)

    def materialize(self) -> Any:
        return self.rebuild(self.storage.get(), *self.args)


def layout_problem(offset: Any, size: Any, stride: Any, storage_bytes: int) -> str | None:
    """Why a tensor's (offset, size, stride) over a storage of ``storage_bytes`` is not the
    layout of stored data, or None. Each element must have its own bytes (no zero or
    overlapping strides, which ``expand`` writes and which let 20 KB stand for 256 MB) and the
    last one must lie inside the storage (counting one byte per element: the dtype is only
    known once decoded, which the tensor itself checks again)."""
    ints = [offset, *size, *stride] if isinstance(size, (tuple, list)) \
        and isinstance(stride, (tuple, list)) else None
    if ints is None or any(type(v) is not int or v < 0 for v in ints) or len(size) != len(stride):
        return "has a malformed offset, shape or stride"
    extent = 1
    for length, step in sorted(((n, st) for n, st in zip(size, stride) if n > 1),
                               key=lambda pair: pair[1]):
        if step < extent:
            return f"has overlapping strides {list(stride)} for shape {list(size)}"
        extent = step * length
    if 0 in size:
        return None
    last = offset + sum((n - 1) * st for n, st in zip(size, stride))
    if last >= storage_bytes:
        return f"reaches element {last} of a storage of {storage_bytes} bytes"
    return None


def _lazy_rebuilder(rebuild: Any) -> Any:
    def lazy(storage: Any, *args: Any) -> Any:
        if isinstance(storage, _LazyStorage):
            return _LazyTensor(rebuild, storage, args)
        raise UnsafeInputError("A tensor in the pickle is rebuilt from something other than a "
                               "torch.save'd storage; refusing it.")
    return lazy


def _real(tensor: Any) -> Any:
    return tensor.materialize() if isinstance(tensor, _LazyTensor) else tensor


@dataclass
class LegacyItem:
    """One activation read from a MemOS pickle, as plain values: KV layers, or (for a vLLM
    item, which holds no tensors) the prompt a vLLM server turns into its cache."""

    id: str
    raw_layers: list[tuple[str, int, Any, Any]]  # (type, cumulative_length, keys, values)
    metadata: dict[str, Any] = field(default_factory=dict)
    prompt: str | None = None
    records: dict[str, Any] | None = None  # a KVCacheItem's records, as plain values

    @property
    def layers(self) -> list[tuple[str, int, Any, Any]]:
        """The layers with real tensors (decoded now, once: the bytes are then dropped)."""
        self.raw_layers = [(kind, length, _real(keys), _real(values))
                           for kind, length, keys, values in self.raw_layers]
        return self.raw_layers

    def release(self) -> None:
        """Drop this item's tensors (a pack has written them)."""
        self.raw_layers = []

    @property
    def producer_record(self) -> dict[str, Any] | None:
        """MemOS PR #2305's per-item ``metadata.producer``, when the dump carries one."""
        record = self.metadata.get("producer")
        return record if isinstance(record, dict) else None


@dataclass
class LegacyDump:
    """A MemOS activation pickle, read: its items and, from MemOS PR #2302, the top-level
    ``model_identity`` record when present."""

    items: list[LegacyItem]
    model_identity: dict[str, Any] | None = None


#: Tensor bytes a pickle may decode to, per byte of pickle: torch.save'd storages are stored
#: uncompressed, so honest dumps decode to about their own size.
BUDGET_PER_PICKLE_BYTE = 2
BUDGET_SLACK = 1 << 20


def read_memos_pickle(data: Any, *, max_tensor_bytes: int | None = None,
                      name: str = "The activation pickle") -> LegacyDump:
    """Read a MemOS ``activation_memory.pickle`` (its bytes, or a file open for reading)
    through the allowlist unpickler. Tensors are decoded per item, when its ``layers`` are
    first asked for.

    Args:
        max_tensor_bytes: a tighter cap on decoded tensor bytes (e.g. from the pinned model's
            geometry); the default allows twice the pickle's size.
        name: the file, for messages.

    Raises:
        UnsafeInputError: the pickle names a global outside the allowlist, or decodes to more
            tensor bytes than the cap.
        FormatError: the pickle is readable but not a MemOS activation memory, or its decoded
            metadata goes beyond the strict limits (nesting, size; pickle's own reader is not
            recursive, so a 5000-deep structure loads and is refused here).
    """
    try:
        return _read(data, max_tensor_bytes)
    except (FormatError, LimitError) as exc:
        raise FormatError(f"{name}: {exc}") from exc


def _read(data: Any, max_tensor_bytes: int | None) -> LegacyDump:
    source = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    size = len(data) if isinstance(data, (bytes, bytearray)) else os.fstat(data.fileno()).st_size
    budget = BUDGET_PER_PICKLE_BYTE * size + BUDGET_SLACK
    if max_tensor_bytes is not None:
        budget = min(budget, max_tensor_bytes)
    try:
        document = AllowlistUnpickler(source, budget=budget).load()
    except UnsafeInputError:
        raise
    except Exception as exc:  # corrupt pickles raise anything from EOFError to struct.error
        raise FormatError(f"corrupt or not a MemOS dump: {type(exc).__name__}: {exc}") from exc
    # The layouts MemOS's own load accepts: {"kv_cache_memories": {id: item}} (current), the
    # same with a list of items, and a bare list of items (older dumps).
    memories = document.get("kv_cache_memories") if isinstance(document, dict) else document
    if isinstance(memories, list):
        memories = {_list_id(index, item): item for index, item in enumerate(memories)}
    if not isinstance(memories, dict):
        raise FormatError("not a MemOS KVCacheMemory dump (no 'kv_cache_memories' mapping or "
                          "list of items).")
    identity = document.get("model_identity") if isinstance(document, dict) else None
    if isinstance(identity, str):
        identity = {"model_name_or_path": identity}
    items = [_item(key, value) for key, value in memories.items()]
    if len({item.id for item in items}) != len(items):
        raise FormatError("two activations carry one id; MemOS would keep only the last.")
    return LegacyDump(items, _plain(identity) if isinstance(identity, dict) else None)


def _list_id(index: int, item: Any) -> Any:
    """An item's id in a list-format dump (MemOS keys them by ``item.id``)."""
    if isinstance(item, _StandIn) and (item.get("id") or item.get("kv_cache_id")):
        return item.get("id") or item.get("kv_cache_id")
    raise FormatError(f"Item {index} of the list-format dump has no id.")


def _item(key: Any, item: Any) -> LegacyItem:
    item_id = (item.get("id") or item.get("kv_cache_id") or key) if isinstance(item, _StandIn) \
        else key
    if type(item_id) not in (str, int):  # printing any other value may recurse without end
        raise FormatError(f"an activation id is a {type(item_id).__name__}, not a string.")
    if not isinstance(item, _StandIn):
        raise FormatError(f"Activation {item_id!r} is a {type(item).__name__}, not a KVCacheItem.")
    cache = item.get("memory") if item.get("memory") is not None else item.get("kv_cache")
    metadata = _plain(item.get("metadata") or {})
    if isinstance(cache, str):  # a VLLMKVCacheItem: a prompt string, no tensors
        return LegacyItem(id=str(item_id), raw_layers=[], prompt=cache,
                          metadata=metadata if isinstance(metadata, dict) else {})
    if not isinstance(cache, _StandIn):
        raise FormatError(f"Activation {item_id!r} holds no DynamicCache.")
    metadata = metadata if isinstance(metadata, dict) else {"metadata": metadata}
    records = item.get("records")
    records = _plain(records.get("__dict__") or records.state) \
        if isinstance(records, _StandIn) else None
    return LegacyItem(id=str(item_id), raw_layers=_cache_layers(str(item_id), cache),
                      metadata=metadata, records=records if isinstance(records, dict) else None)


def _cache_layers(item_id: str, cache: _StandIn) -> list[tuple[str, int, Any, Any]]:
    import torch

    layers = cache.get("layers")
    result = []
    if layers is not None:
        for index, layer in enumerate(layers):
            if not isinstance(layer, _StandIn):
                raise FormatError(f"Activation {item_id!r} layer {index} is not a cache layer.")
            keys, values = layer.get("keys"), layer.get("values")
            sliding = layer.qualname.endswith("DynamicSlidingWindowLayer")
            cumulative = layer.get("cumulative_length") if sliding else None
            result.append(("sliding_attention" if sliding else "full_attention", keys, values,
                           cumulative))
    else:
        keys_list, values_list = cache.get("key_cache"), cache.get("value_cache")
        if not isinstance(keys_list, list) or not isinstance(values_list, list) \
                or len(keys_list) != len(values_list):
            raise FormatError(f"Activation {item_id!r} has neither 'layers' nor matching "
                              "'key_cache'/'value_cache' lists.")
        result = [("full_attention", k, v, None) for k, v in zip(keys_list, values_list)]
    layers_out = []
    for index, (kind, keys, values, cumulative) in enumerate(result):
        if not (isinstance(keys, (torch.Tensor, _LazyTensor))
                and isinstance(values, (torch.Tensor, _LazyTensor))):
            raise FormatError(f"Activation {item_id!r} layer {index} holds no key/value tensors.")
        if keys.dim() != 4 or keys.shape[:3] != values.shape[:3]:
            raise FormatError(f"Activation {item_id!r} layer {index} has malformed shapes "
                              f"{list(keys.shape)} / {list(values.shape)}.")
        length = int(cumulative) if isinstance(cumulative, int) else int(keys.shape[-2])
        layers_out.append((kind, length, keys, values))
    return layers_out


def _plain(value: Any) -> Any:
    """Unpickled metadata as JSON-safe values (stand-ins become their recorded state)."""
    return json_safe(value, unwrap=lambda v: (v.get("__dict__") or v.state)
                     if isinstance(v, _StandIn) else v)
