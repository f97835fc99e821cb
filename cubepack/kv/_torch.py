"""The torch side of the KV format: a transformers cache to tensors and back.

:func:`save_kv_cache` writes a ``DynamicCache`` (full and sliding-window layers) with its
producer, atomically; :func:`load_kv_cache` checks the header against the live model first
(:func:`cubepack.kv.check_kv_file`) and only then rebuilds a ``DynamicCache`` zero-copy from a
private (copy-on-write) mapping of the file.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._util import atomic, constants
from .._util.ramdir import holds_plaintext, inside_ram_folder
from .._util.safetensors_header import DTYPE_TAGS, FileBytes, read_header, write_safetensors
from ..errors import CubepackError, IdentityMismatch, UnsupportedError, UsageError
from ..identity._fingerprint import fingerprint
from ..identity._identity import ModelIdentity, dtype_name
from . import _checksum
from ._format import (
    FULL,
    SLIDING,
    KVFileInfo,
    StoredLayer,
    kv_metadata,
    read_kv_header,
    structure_problems,
    verify_checksums,
)

#: The transformers layer classes whose whole content is their keys and values (what a KV file
#: stores), by name; a layer is one of them only if it is that very class of
#: ``transformers.cache_utils`` (:func:`stored_kind`). Every other layer class may keep its
#: content elsewhere: a quantized layer in its quantized states beside an emptied residual, a
#: linear-attention layer in conv and recurrent states, a KV-sharing ``DummyLayer`` in another
#: layer, a static layer in a preallocated buffer, a modeling file's subclass in more state.
_SUPPORTED_LAYERS = {"DynamicLayer": FULL, "DynamicSlidingWindowLayer": SLIDING}


@functools.cache
def _stored_classes() -> dict[type, str]:
    from transformers import cache_utils

    return {getattr(cache_utils, name): kind for name, kind in _SUPPORTED_LAYERS.items()}


def stored_kind(layer: Any) -> str | None:
    """``full_attention`` / ``sliding_attention`` for a layer of exactly transformers'
    ``DynamicLayer`` / ``DynamicSlidingWindowLayer`` (not a subclass, not a class of that
    name elsewhere), else None: a layer whose content may not be its keys and values."""
    return _stored_classes().get(type(layer))


def _class_name(layer: Any) -> str:
    """A layer's class, qualified when it is not transformers' own (so a subclass named
    ``DynamicLayer`` is never mistaken for it in a message)."""
    cls = type(layer)
    own = cls.__module__ == "transformers.cache_utils"
    return cls.__qualname__ if own else f"{cls.__module__}.{cls.__qualname__}"


def layer_classes(cache: Any) -> str:
    """The classes of ``cache``'s layers, for a message (or the cache's own, with none)."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return type(cache).__qualname__
    return ", ".join(sorted({_class_name(layer) for layer in layers}))


def holds_nothing(cache: Any) -> bool:
    """True when no layer of ``cache`` holds a position. Only a layer whose whole content is
    its keys and values (:func:`stored_kind`) can show that; a layer of any other class may
    keep its content elsewhere (see ``_SUPPORTED_LAYERS``), so a cache holding one is never
    empty here, whatever its ``keys`` or ``get_seq_length()`` say."""
    if isinstance(cache, (tuple, list)):
        return all(pair[0] is None or pair[0].dim() < 2 or int(pair[0].shape[-2]) == 0
                   for pair in cache)
    layers = getattr(cache, "layers", None)
    if layers is None:
        return False
    for layer in layers:
        if stored_kind(layer) is None:
            return False
        keys = getattr(layer, "keys", None)
        if keys is not None and keys.dim() >= 2 and int(keys.shape[-2]) > 0:
            return False
        if int(getattr(layer, "cumulative_length", 0) or 0) > 0:  # positions seen, none kept
            return False
    return True


def cache_layers(cache: Any) -> list[tuple[str, int, Any, Any]]:
    """(type, cumulative_length, keys, values) per layer of a DynamicCache or legacy tuple.

    Raises:
        UnsupportedError: a quantized, static, linear-attention or empty layer: those cannot be
            stored losslessly as plain key/value tensors.
    """
    if isinstance(cache, (tuple, list)):
        layers = []
        for pair in cache:
            keys, values = pair[0], pair[1]
            layers.append((FULL, int(keys.shape[-2]), keys, values))
        return layers
    if "Quantized" in type(cache).__name__:
        raise UnsupportedError(f"A {type(cache).__name__} cannot be saved losslessly; "
                               "save the DynamicCache it was built from instead.")
    cache_layer_list = getattr(cache, "layers", None)
    if cache_layer_list is None:
        raise UnsupportedError(f"Cannot save a {type(cache).__name__}: expected a transformers "
                               "DynamicCache (transformers >= 4.56) or a tuple of (keys, values).")
    layers = []
    for index, layer in enumerate(cache_layer_list):
        kind = stored_kind(layer)
        if kind is None:
            raise UnsupportedError(
                f"Layer {index} of the cache is a {_class_name(layer)}; cubepack reads only "
                "transformers' DynamicLayer and DynamicSlidingWindowLayer, whose content is "
                "their keys and values (a quantized, static, linear-attention or KV-sharing "
                "layer keeps it elsewhere, and cannot be checked or stored losslessly as "
                "key/value tensors). Build the cache as a DynamicCache."
            )
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            raise UnsupportedError(f"Layer {index} of the cache is empty; run the model on the "
                                   "prompt before saving its cache.")
        cumulative = getattr(layer, "cumulative_length", None) if kind == SLIDING else None
        if cumulative is None:
            cumulative = int(layer.keys.shape[-2])
        layers.append((kind, int(cumulative), layer.keys, layer.values))
    return layers


def initialise_assigned_layers(cache: Any) -> Any:
    """Mark layers that were assigned tensors directly (never through ``update``) as holding
    them. transformers >= 4.56 treats such a layer as empty and its first ``update`` discards
    the assigned tensors: MemOS's ``_concat_caches`` builds its merges this way, so plain
    MemOS answers without the merged memories."""
    for layer in getattr(cache, "layers", None) or ():
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if getattr(layer, "is_initialized", True) or keys is None or values is None:
            continue
        layer.update(keys[..., :0, :], values[..., :0, :])  # initialises; appends nothing
        layer.keys, layer.values = keys, values
    return cache


def save_kv_cache(cache: Any, path: str | os.PathLike[str], *, producer: Any,
                  token_ids: list[int] | Any = None, metadata: dict[str, Any] | None = None) -> Path:
    """Write ``cache`` to ``path`` as a cubepack KV file, atomically.

    Args:
        cache: a ``DynamicCache`` (full and sliding-window layers) or a tuple of (keys, values).
        producer: the :class:`ModelIdentity` of the model that built it, or that model itself.
        token_ids: the token ids the cache covers (list or 1-D tensor), recorded for rebuilds.
        metadata: free JSON-serialisable item metadata (source text, ids, timestamps).

    Raises:
        UnsupportedError: quantized or otherwise non-dynamic caches.
        CubepackError: the cache contradicts the producer (layer count, dtype, heads).

    Returns:
        the path written.

    Example:
        ```python
        cache = cubepack.prefill(model, input_ids)
        cubepack.save_kv_cache(cache, "my-cube/activations/item-1.kv.safetensors",
                               producer=model, token_ids=input_ids[0])
        ```
    """
    layers = cache_layers(cache)
    refuse_private(cache, layers, path)
    identity = producer if isinstance(producer, ModelIdentity) else fingerprint(producer)
    return write_kv_layers(layers, path, producer=identity, token_ids=token_ids,
                           metadata=metadata)


#: Checks a higher part registers (the MemOS hook: a cache carrying a private cube's seal):
#: each takes a cache and returns why it is private, or None.
PRIVATE_CACHE_CHECKS: list[Callable[[Any], str | None]] = []


def refuse_private(cache: Any, layers: list[tuple[str, int, Any, Any]], path: Any) -> None:
    """A cache whose tensors are a private cube's plaintext (decrypted by cubepack into memory
    it owns: ``load_kv_cache(decrypt_with=)``, the MemOS hook's private loads), or that a
    registered check calls private, is never written to a file in clear.

    Raises:
        UsageError: naming the file and what to do.
    """
    import torch

    if inside_ram_folder(Path(path).parent):  # cubepack's own plaintext place (a sealed dump)
        return
    why = next((reason for check in PRIVATE_CACHE_CHECKS if (reason := check(cache))), None)
    if why is None:
        for _, _, keys, values in layers:
            if any(isinstance(t, torch.Tensor) and holds_plaintext(
                    t.untyped_storage().data_ptr()) for t in (keys, values)):
                why = "its tensors are a private cube's plaintext, decrypted in memory"
                break
    if why is not None:
        raise UsageError(
            f"Refusing to write {path}: this cache is a private cube's memory ({why}), and "
            "cubepack never writes a private memory's plaintext to a file. Keep it in memory; "
            "to share it, dump it through the MemOS hook (a private cube, to readers you "
            "name: cubepack.memos.install(recipients=[...])) or encrypt the cube it belongs "
            "to (cubepack encrypt / rekey).")


@dataclass(frozen=True)
class FileTensor:
    """A tensor left in another file (its dtype name, shape and bytes), which
    :func:`write_kv_layers` copies without reading it into memory."""

    dtype: str
    shape: tuple[int, ...]
    data: FileBytes


def write_kv_layers(layers: list[tuple[str, int, Any, Any]], path: str | os.PathLike[str], *,
                    producer: ModelIdentity, token_ids: Any = None,
                    metadata: dict[str, Any] | None = None,
                    before_rename: Callable[[KVFileInfo], None] | None = None) -> Path:
    """Write per-layer (type, cumulative_length, keys, values) as a KV file, atomically; keys
    and values are torch tensors or :class:`FileTensor` s.

    The layers are checked against the producer's geometry and dtype first: a cache that
    contradicts its declared producer is refused, never labelled with it. ``before_rename``
    gets the written file's validated header before it takes its name (a conversion checks its
    source and proves what was written there); what it raises leaves no file.
    """
    contradictions = structure_problems(live_layers(layers), producer)
    if contradictions:
        raise IdentityMismatch("This cache", contradictions).about(
            "This cache", "It was not built by the declared producer; name the model that "
                          "built it.")
    tensors: dict[str, Any] = {}
    entries = []
    for index, (kind, cumulative, keys, values) in enumerate(layers):
        tensors[f"layers.{index}.keys"] = _on_cpu(keys)
        tensors[f"layers.{index}.values"] = _on_cpu(values)
        entries.append({"type": kind, "cumulative_length": int(cumulative)})
    ids = _token_id_list(token_ids)
    path = Path(path)
    tags = {dtype_name(tensor.dtype) for tensor in tensors.values()} - set(DTYPE_TAGS)
    if tags:
        raise UnsupportedError(f"A {', '.join(sorted(tags))} cache cannot be stored in "
                               "safetensors.")
    stored = [(name, DTYPE_TAGS[dtype_name(tensor.dtype)], tuple(tensor.shape),
               _bytes_of(tensor)) for name, tensor in tensors.items()]
    # The checksums of the very bytes written: the tensors' memory, or a file's bytes mapped.
    checksums = _checksum.compute_sources({name: data for name, _, _, data in stored})
    meta_json = kv_metadata(producer, entries, ids, metadata, checksums=checksums)
    with atomic.atomic_path(path) as tmp:  # safetensors' own bytes, in 2 MiB-aligned writes
        write_safetensors(tmp, stored, {constants.KV_METADATA_KEY: meta_json})
        written = read_kv_header(tmp)  # what we wrote must be what we read back
        if any(isinstance(tensor, FileTensor) for tensor in tensors.values()):
            # Copied from another file, read twice (hashed, then copied): the copy must be
            # the bytes hashed, or that file changed in between.
            verify_checksums(written)
        if before_rename is not None:
            before_rename(written)
    return path


def _on_cpu(tensor: Any) -> Any:
    return tensor if isinstance(tensor, FileTensor) else tensor.detach().to("cpu").contiguous()


def _bytes_of(tensor: Any) -> Any:
    """A contiguous CPU tensor's bytes, as a flat uint8 array (no copy), or a file's."""
    import torch

    if isinstance(tensor, FileTensor):
        return tensor.data
    return tensor.view(torch.uint8).reshape(-1).numpy()


def live_layers(layers: list[tuple[str, int, Any, Any]]) -> list[StoredLayer]:
    """Describe live (type, cumulative_length, keys, values) layers without touching their data."""
    return [StoredLayer(kind, int(cumulative), tuple(keys.shape), tuple(values.shape),
                        dtype_name(keys.dtype), dtype_name(values.dtype))
            for kind, cumulative, keys, values in layers]


def content_digest(layers: list[tuple[str, int, Any, Any]]) -> str:
    """sha256 over live layers' types, lengths, shapes, dtypes and bytes: the same for a copy
    of a cache (``deepcopy``, a pickle round trip, a model_copy), different once a tensor
    changes."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    for kind, cumulative, keys, values in layers:
        digest.update(f"{kind}:{int(cumulative)}:{tuple(keys.shape)}:{tuple(values.shape)}:"
                      f"{keys.dtype}:{values.dtype};".encode())
        for tensor in (keys, values):
            flat = tensor.detach().to("cpu").contiguous().reshape(-1)
            digest.update(memoryview(flat.view(torch.uint8).numpy()))
    return digest.hexdigest()


def _token_id_list(token_ids: Any) -> list[int] | None:
    if token_ids is None:
        return None
    if hasattr(token_ids, "tolist"):
        token_ids = token_ids.tolist()
    if token_ids and isinstance(token_ids[0], list):  # a [1, seq] batch of one
        if len(token_ids) != 1:
            raise CubepackError("token_ids must be one sequence, not a batch.")
        token_ids = token_ids[0]
    return [int(t) for t in token_ids]


def build_dynamic_cache(info: KVFileInfo, config: Any, *, device: Any = None,
                        copy: bool = False) -> Any:
    """Rebuild a ``DynamicCache`` from a validated KV file (transformers 4.56+ and 5.x)."""
    return cache_from_layers(mapped_layers(info), config, device=device, copy=copy,
                             source=info.path.name)


def cache_from_layers(layers: list[tuple[str, int, Any, Any]], config: Any, *, device: Any = None,
                      copy: bool = False, source: str = "the cache") -> Any:
    """A ``DynamicCache`` for a model of ``config`` holding (type, cumulative_length, keys,
    values) layers, zero-copy unless ``copy`` or ``device`` asks otherwise.

    Raises:
        UnsupportedError: the model's cache has another layer count or layer types.
    """
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    if len(cache.layers) != len(layers):
        raise UnsupportedError(f"The model's cache has {len(cache.layers)} layers but {source} "
                               f"has {len(layers)}.")
    for index, (layer, (stored_type, cumulative, keys, values)) in enumerate(zip(cache.layers,
                                                                              layers)):
        kind = stored_kind(layer)
        if kind != stored_type:
            raise UnsupportedError(f"Layer {index} is {stored_type} in {source} but the model "
                                   f"builds a {_class_name(layer)}.")
        if device is not None:
            keys, values = keys.to(device), values.to(device)
        if copy:
            keys, values = keys.clone(), values.clone()
        # Initialise the layer as its own first update does (device, dtype and, for sliding
        # layers, the window tensor), then assign the stored tensors without copying them.
        _initialise(layer, keys, values)
        layer.keys, layer.values = keys, values
        if kind == SLIDING:
            layer.cumulative_length = cumulative
    return cache


def _initialise(layer: Any, keys: Any, values: Any) -> None:
    """What a layer's first ``update`` does before it appends: its ``lazy_initialization``
    (``(keys)`` in transformers 4.x, ``(keys, values)`` in 5.x), or, for a layer without one,
    an ``update`` that appends nothing."""
    takes = _lazy_initialization_arity(type(layer))
    if takes == 2:
        layer.lazy_initialization(keys, values)
    elif takes == 1:
        layer.lazy_initialization(keys)
    else:
        layer.update(keys[..., :0, :], values[..., :0, :])


@functools.cache
def _lazy_initialization_arity(layer_class: type) -> int:
    method = getattr(layer_class, "lazy_initialization", None)
    if method is None:
        return 0
    parameters = [p for p in inspect.signature(method).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(parameters) - 1 if len(parameters) - 1 in (1, 2) else 0


def mapped_layers(info: KVFileInfo, *, copy: bool = False) -> list[tuple[str, int, Any, Any]]:
    """(type, cumulative_length, keys, values) per layer of a validated file, as mapped (or,
    with ``copy``, cloned) tensors, each first required to match its checksum (a version-3
    file; the mapped bytes themselves are hashed, so the pages a later use reads are already
    in); no producer check (callers do their own).

    Raises:
        IntegrityError: a tensor's bytes differ from its checksum (the tensor named).
    """
    tensors = _mapped_tensors(info)
    verify_mapped(info, tensors)
    layers = []
    for index, stored in enumerate(info.layers):
        keys, values = tensors[f"layers.{index}.keys"], tensors[f"layers.{index}.values"]
        if copy:
            keys, values = keys.clone(), values.clone()
        layers.append((stored.type, stored.cumulative_length, keys, values))
    return layers


def verify_mapped(info: KVFileInfo, tensors: dict[str, Any]) -> None:
    """Require each of a file's mapped tensors (name -> tensor) to match its checksum; hashed
    in place (a flat byte view of each tensor's own memory, never a copy)."""
    import torch

    if info.checksums is None:
        return
    _checksum.verify_buffers(info.path, info.checksums, {
        name: [tensor.contiguous().view(torch.uint8).reshape(-1).numpy()]
        for name, tensor in tensors.items()})


def _mapped_tensors(info: KVFileInfo) -> dict[str, Any]:
    """The file's tensors as views of one private memory map (no bytes read up front), or of
    the buffer holding the file (``info.data``: a decrypted private file, private to this
    load, so writes to a tensor reach no one else).

    The map is copy-on-write (``shared=False``): writes to a tensor never reach the file. The
    header was validated (every tensor inside the file, of the KV dtype, aligned, no gaps or
    overlaps), so each view is exactly its tensor. We keep this mapper rather than safetensors'
    ``safe_open``, which maps per tensor: bench/kv_load.py measured 0.9 ms here against 2.8 ms
    through ``safe_open`` for a 64-tensor, 210 MB cache.
    """
    import torch

    header = info.header or read_header(info.path)
    # One view of the whole data section in the file's KV dtype (every tensor has it), split
    # at the tensors' boundaries in one call: they tile it, in order of their offsets.
    dtype = getattr(torch, info.kv_dtype)
    count = (header.file_size - header.data_offset) // dtype.itemsize
    if info.data is not None:  # a file already in memory (decrypted): its tensors view it
        data = torch.frombuffer(info.data, dtype=dtype, count=count, offset=header.data_offset) \
            if count else torch.empty(0, dtype=dtype)
    else:
        storage = torch.UntypedStorage.from_file(str(info.path), shared=False,
                                                 nbytes=header.file_size)
        data = torch.empty(0, dtype=dtype)
        data.set_(storage, header.data_offset // dtype.itemsize, (count,))
    in_order = sorted(header.tensors.values(), key=lambda tensor: tensor.begin)
    parts = data.split([(tensor.end - tensor.begin) // dtype.itemsize for tensor in in_order])
    return {tensor.name: part.view(tensor.shape) for tensor, part in zip(in_order, parts)}


# --- running a model with a cache ----------------------------------------------------------------

def forward(model: Any, input_ids: Any, cache: Any = None, **kwargs: Any) -> Any:
    """``model(input_ids, <cache>, use_cache=True)``, passing the cache the way the installed
    transformers asks: ``cache=`` from 5.24 (``past_key_values`` is deprecated there, removed in
    5.40), ``past_key_values=`` before."""
    kwargs["use_cache"] = True
    if cache is not None:
        kwargs[_cache_kwarg(type(model))] = cache
    return model(input_ids, **kwargs)


def prefill(model: Any, input_ids: Any) -> Any:
    """The KV cache ``model`` builds for ``input_ids`` (no gradients), with whichever keyword
    the installed transformers uses for caches.

    Returns:
        the cache (a ``DynamicCache``) the model built, for ``cubepack.save_kv_cache``.

    Example:
        ```python
        cache = cubepack.prefill(model, tokenizer("Hello", return_tensors="pt").input_ids)
        ```
    """
    import torch

    with torch.no_grad():
        return output_cache(forward(model, input_ids))


def output_cache(output: Any) -> Any:
    """The cache a forward returned (``cache`` in transformers 5.24+, ``past_key_values``
    before), without touching the deprecated name where the new one exists."""
    return output["cache"] if "cache" in output else output.past_key_values


@functools.cache
def _cache_kwarg(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"
