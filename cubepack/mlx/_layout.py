"""The MLX-LM prompt cache file, read and written without MLX or torch (pure but for file I/O).

``mlx_lm.models.cache.save_prompt_cache`` writes one safetensors file: per layer ``i`` the
state of its cache object, ``i.0`` (keys) and ``i.1`` (values), ``[batch, kv_heads, capacity,
head_dim]``, and ``i.2``, the offset (an int32 scalar: the positions in use; a ``KVCache``
grows in steps of 256, so positions past the offset are zeros). The metadata is a flattened
``[user metadata, class names, scalar records]``: ``0.<key>`` the user's strings (mlx_lm's
``cache_prompt`` writes ``model`` and ``tokenizer_config``), ``1.<i>`` each layer's class,
``2.0`` empty, then ``2.<j>.0`` / ``2.<j>.1`` the position and kind of each scalar
(``i.2``, ``scalar``). mlx_lm's loader instantiates each class *by name* from its module and
checks nothing else: no producer, no shapes.

:func:`read_prompt_cache` accepts only what cubepack can convert losslessly (every layer a
``KVCache``, one offset for all, keys and values of one float dtype), validated before any
tensor is touched. A file cubepack writes carries the KV file's own metadata under the user key
``cubepack`` (``0.cubepack``), which mlx_lm's loader hands back untouched.
"""

from __future__ import annotations

import os
import shlex
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util import atomic, constants
from .._util.safetensors_header import (
    DTYPE_SIZES,
    Header,
    TensorInfo,
    read_header,
    write_safetensors,
)
from ..errors import FormatError, UnsupportedError

#: The user-metadata key under which cubepack's KV metadata travels in a prompt cache.
CUBEPACK_KEY = "cubepack"
#: The only cache class cubepack converts (full attention, plain keys and values).
KV_CACHE = "KVCache"
#: Element dtypes a cache's keys and values may have.
FLOAT_TAGS = ("F32", "F16", "BF16")
OFFSET_FORMATS = {"I32": "<i", "I64": "<q"}


@dataclass(frozen=True)
class PromptCacheLayer:
    keys: TensorInfo
    values: TensorInfo
    offset: int


@dataclass(frozen=True)
class PromptCacheInfo:
    """What an MLX-LM prompt cache file holds, validated (see :func:`read_prompt_cache`)."""

    path: Path
    header: Header
    layers: list[PromptCacheLayer]
    metadata: dict[str, str] = field(default_factory=dict)  # the user's (``0.<key>``)

    @property
    def dtype_tag(self) -> str:
        return self.layers[0].keys.dtype

    @property
    def kv_dtype(self) -> str:
        return self.layers[0].keys.dtype_name

    @property
    def offset(self) -> int:
        return self.layers[0].offset

    @property
    def aligned(self) -> bool:
        """Every tensor starts on a multiple of its element size (cubepack's files do;
        mlx_lm's may not): only then can its bytes be viewed as its dtype in place."""
        return all((self.header.data_offset + t.begin) % DTYPE_SIZES[t.dtype] == 0
                   for t in self.header.tensors.values())

    def used_tensors(self) -> dict[str, TensorInfo]:
        """The tensors as a KV file names them, shaped to the positions in use (``offset``):
        what cubepack's KV metadata describes."""
        used = {}
        for index, layer in enumerate(self.layers):
            for part, tensor in (("keys", layer.keys), ("values", layer.values)):
                shape = (*tensor.shape[:2], layer.offset, *tensor.shape[3:])
                used[f"layers.{index}.{part}"] = TensorInfo(tensor.name, tensor.dtype, shape,
                                                            tensor.begin, tensor.end)
        return used


def read_prompt_cache(path: str | os.PathLike[str], header: Header | None = None
                      ) -> PromptCacheInfo:
    """Read and validate an MLX-LM prompt cache's header (``header``: the one a caller just
    read from ``path``, unaligned), metadata and offsets.

    Raises:
        FormatError: not a prompt cache, or one whose metadata and tensors disagree.
        UnsupportedError: a layer of another class than ``KVCache`` (rotating, quantized,
            state-space caches hold something else than plain keys and values).
    """
    path = Path(path)
    if header is None:
        header = read_header(path, aligned=False)  # mlx_lm's writer does not pad its header
    user, classes, scalars = _split_metadata(path, header.metadata)
    if not classes:
        raise FormatError(f"{path} is not an MLX-LM prompt cache (its metadata names no cache "
                          "classes).")
    for index, name in enumerate(classes):
        if name != KV_CACHE:
            raise UnsupportedError(
                f"{path}: layer {index} is a {name}; cubepack converts KVCache layers only (a "
                "RotatingKVCache, QuantizedKVCache or state-space cache holds something other "
                "than every position's keys and values).")
    expected = {(f"{i}.2", "scalar") for i in range(len(classes))}
    if set(scalars) != expected or len(scalars) != len(expected):
        raise FormatError(f"{path}: its scalar records {sorted(scalars)[:3]} are not one offset "
                          "per layer.")
    names = {f"{i}.{part}" for i in range(len(classes)) for part in (0, 1, 2)}
    if set(header.tensors) != names:
        odd = sorted(set(header.tensors) ^ names)[:3]
        raise FormatError(f"{path}: its tensors do not match {len(classes)} KVCache layers "
                          f"({odd}).")
    with open(path, "rb") as handle:  # one open for every layer's offset
        layers = [_layer(path, header, index, handle) for index in range(len(classes))]
    tags = sorted({t for layer in layers for t in (layer.keys.dtype, layer.values.dtype)})
    if len(tags) != 1:
        raise FormatError(f"{path}: its keys and values mix dtypes ({', '.join(tags)}).")
    offsets = sorted({layer.offset for layer in layers})
    if len(offsets) != 1:
        raise FormatError(f"{path}: its layers hold different numbers of positions "
                          f"({offsets}); one prompt cache is one sequence.")
    return PromptCacheInfo(path, header, layers, user)


def _split_metadata(path: Path, metadata: dict[str, str]
                    ) -> tuple[dict[str, str], list[str], list[tuple[str, str]]]:
    """(user metadata, class per layer, (position, kind) per scalar) from the flat keys."""
    user: dict[str, str] = {}
    classes: dict[int, str] = {}
    scalar_parts: dict[int, dict[str, str]] = {}
    for key, value in metadata.items():
        top, _, rest = key.partition(".")
        if top == "0" and rest:
            user[rest] = value
        elif top == "1" and rest.isdigit():
            classes[int(rest)] = value
        elif key == "2.0" and value == "":
            continue
        elif top == "2" and rest.count(".") == 1 and rest.split(".")[0].isdigit() \
                and rest.split(".")[1] in ("0", "1"):
            number, part = rest.split(".")
            scalar_parts.setdefault(int(number), {})[part] = value
        elif key == constants.KV_METADATA_KEY:  # a KV file given where a prompt cache goes
            raise FormatError(f"{path} is a cubepack KV file, not an MLX-LM prompt cache: "
                              "nothing to import. Load it as it is "
                              "(cubepack.mlx.load_prompt_cache), or write a prompt cache from "
                              f"it: cubepack export mlx {shlex.quote(str(path))} --out FILE.")
        else:
            raise FormatError(f"{path}: metadata key {key!r} is not part of an MLX-LM prompt "
                              "cache's layout.")
    if sorted(classes) != list(range(len(classes))):
        raise FormatError(f"{path}: its cache classes are not numbered 0..{len(classes) - 1}.")
    scalars = []
    for number in sorted(scalar_parts):
        parts = scalar_parts[number]
        if number < 1 or set(parts) != {"0", "1"}:
            raise FormatError(f"{path}: scalar record {number} is malformed.")
        scalars.append((parts["0"], parts["1"]))
    return user, [classes[i] for i in range(len(classes))], scalars


def _layer(path: Path, header: Header, index: int, handle: Any) -> PromptCacheLayer:
    keys, values = header.tensors[f"{index}.0"], header.tensors[f"{index}.1"]
    offset_tensor = header.tensors[f"{index}.2"]
    for tensor in (keys, values):
        if tensor.dtype not in FLOAT_TAGS or len(tensor.shape) != 4:
            raise FormatError(f"{path}: {tensor.name} must be a 4-D float tensor, found "
                              f"{tensor.dtype} {list(tensor.shape)}.")
    if keys.shape[:3] != values.shape[:3]:
        raise FormatError(f"{path}: layer {index}'s keys {list(keys.shape)} and values "
                          f"{list(values.shape)} disagree.")
    if offset_tensor.dtype not in OFFSET_FORMATS or offset_tensor.shape != ():
        raise FormatError(f"{path}: {offset_tensor.name} must be an integer scalar (the "
                          f"offset), found {offset_tensor.dtype} {list(offset_tensor.shape)}.")
    handle.seek(header.data_offset + offset_tensor.begin)
    (offset,) = struct.unpack(OFFSET_FORMATS[offset_tensor.dtype],
                              handle.read(offset_tensor.end - offset_tensor.begin))
    if not 0 < offset <= keys.shape[2]:
        raise FormatError(f"{path}: layer {index}'s offset {offset} lies outside its "
                          f"{keys.shape[2]} stored positions.")
    return PromptCacheLayer(keys, values, offset)


def flat_metadata(user: dict[str, str], num_layers: int) -> dict[str, str]:
    """The metadata mlx_lm's ``save_prompt_cache`` writes for ``num_layers`` KVCache layers."""
    flat = {f"0.{key}": value for key, value in user.items()}
    flat.update({f"1.{i}": KV_CACHE for i in range(num_layers)})
    flat["2.0"] = ""
    for i in range(num_layers):
        flat[f"2.{i + 1}.0"], flat[f"2.{i + 1}.1"] = f"{i}.2", "scalar"
    return flat


def write_prompt_cache(path: str | os.PathLike[str], layers: list[tuple[Any, Any, tuple]],
                       tag: str, offset: int, user: dict[str, str], *,
                       before_rename: Callable[[], None] | None = None) -> Path:
    """Write an MLX-LM prompt cache of ``layers`` ((keys bytes, values bytes, shape), of dtype
    ``tag``, every position in use; bytes-like or :class:`FileBytes`), atomically; read back
    before it is placed, after ``before_rename`` (what it raises leaves no file)."""
    tensors = []
    for index, (keys, values, shape) in enumerate(layers):
        tensors += [(f"{index}.0", tag, shape, keys), (f"{index}.1", tag, shape, values),
                    (f"{index}.2", "I32", (), struct.pack("<i", offset))]
    path = Path(path)
    with atomic.atomic_path(path) as tmp:
        write_safetensors(tmp, tensors, flat_metadata(user, len(layers)))
        read_prompt_cache(tmp)  # what we wrote must be what we read back
        if before_rename is not None:
            before_rename()
    return path
