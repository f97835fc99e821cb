"""MLX-LM prompt caches to cubepack KV files and back, without MLX (torch maps the bytes).

- :func:`import_prompt_cache`: a prompt cache (mlx_lm's own, or one cubepack wrote) becomes a
  KV file whose producer is the fingerprint of the model folder MLX loaded, in the dtype the
  cache was computed in, with the runtime recorded (``runtime: mlx-lm X.Y``);
- :func:`export_prompt_cache`: a KV file becomes a prompt cache that mlx_lm's
  ``load_prompt_cache`` reads, carrying the KV file's metadata (producer, token ids) so
  :func:`cubepack.mlx.load_prompt_cache` can check it before MLX reads a tensor.

Neither runs a model: they move bytes (the positions in use) and check shapes and identities.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
import struct
from pathlib import Path
from typing import Any

from .._util import constants
from .._util.hashing import HashCache
from .._util.safetensors_header import (
    DTYPE_NAMES,
    DTYPE_SIZES,
    DTYPE_TAGS,
    FileBytes,
    file_state,
    header_differs,
    open_regular,
)
from ..errors import FormatError, IdentityMismatch, UnsupportedError, UsageError
from ..format._provenance import ASSERTED
from ..identity._fingerprint import (
    fingerprint,
    installed_versions,
    resolve_model_folder,
)
from ..identity._identity import ModelIdentity
from ..kinds.activations._shards import memory_file
from ..kv import _checksum
from ..kv._format import (
    FULL,
    KVFileInfo,
    check_kv_info,
    kv_info,
    read_kv_header,
    require_checksums,
    upgrade_command,
)
from ..kv._torch import FileTensor, mapped_layers, write_kv_layers
from ._layout import (
    CUBEPACK_KEY,
    OFFSET_FORMATS,
    PromptCacheInfo,
    read_prompt_cache,
    write_prompt_cache,
)

#: The runtime's name, as a KV header's ``runtime`` record starts.
RUNTIME = "mlx-lm"


def runtime_versions() -> dict[str, str]:
    """The installed MLX runtime's versions (informational, in a producer's ``versions``)."""
    return installed_versions("cubepack", "mlx", "mlx-lm")


def runtime_record() -> str:
    """``mlx-lm X.Y`` (the version installed here), or ``mlx-lm`` when it is not installed."""
    version = runtime_versions().get("mlx-lm")
    return f"{RUNTIME} {version}" if version else RUNTIME


#: Identities of model folders, reused while no file in the folder changed (by stat, as the
#: hash cache keys files): a fingerprint per load would otherwise dominate loading a cache.
_IDENTITIES: dict[tuple, ModelIdentity] = {}


def mlx_identity(model: str | os.PathLike[str], dtype: str, *,
                 revision: str | None = None) -> ModelIdentity:
    """The identity of the model folder (or Hub id) MLX loaded, running in ``dtype``: the
    same strict fields as transformers' fingerprint of that folder (MLX loads the same
    safetensors files and config), with MLX's versions recorded."""
    folder, _, resolved = resolve_model_folder(str(model), revision)
    if revision is not None and resolved is None:
        fingerprint(model, revision=revision)  # raises: a folder has no revision to pick
    key = (str(folder.resolve()), dtype, tuple(
        (entry.name, HashCache.key(entry)) for entry in sorted(folder.iterdir())
        if entry.is_file()))
    if key not in _IDENTITIES:
        identity = fingerprint(folder, dtype=dtype)
        _IDENTITIES.clear()  # one model at a time is the common case; never grows
        _IDENTITIES[key] = dataclasses.replace(identity, versions=runtime_versions())
    return _IDENTITIES[key]


def import_prompt_cache(path: str | os.PathLike[str], model: str | os.PathLike[str], *,
                        out: str | os.PathLike[str] | None = None,
                        token_ids: list[int] | None = None, revision: str | None = None,
                        metadata: dict[str, Any] | None = None,
                        proof: Any = None) -> Path:
    """Convert the MLX-LM prompt cache at ``path`` into a KV file (default: beside it,
    ``<stem>.kv.safetensors``); return its path.

    Args:
        model: the folder (or Hub id) MLX loaded the model from: its fingerprint, in the dtype
            of the cache, is the producer (a name in the file is never trusted).
        token_ids: the ids the cache covers (mlx_lm records none; without them the cache
            cannot be recomputed, so no other runtime will accept it).
        proof: a callable ``(layers, ids, kv_dtype) -> None`` that proves the cache (the MLX
            runtime's recomputation: :func:`cubepack.mlx.import_prompt_cache` passes one when
            asked); raises to refuse.

    Raises:
        IdentityMismatch: the cache's shapes contradict the model, or the cubepack metadata it
            carries names another producer.
        UnsupportedError: a layer other than ``KVCache``.
        FormatError: a malformed prompt cache.
    """
    info = read_prompt_cache(path)
    claim = claimed_header(info)
    if claim is not None:  # before any work: its metadata would be sealed anew (format 3)
        require_checksums(claim, "cubepack import mlx", fix=(
            f"upgrade the KV file it was exported from ({upgrade_command('FILE')}, or "
            f"{upgrade_command('CUBE')} for its cube, which checks the lock first), then "
            "export it again."))
    live = mlx_identity(model, info.kv_dtype, revision=revision)
    ids = _ids(token_ids, info.offset, live.geometry.get("vocab_size"))
    if claim is not None:
        check_kv_info(claim, live)
        if ids is not None and claim.token_ids is not None and ids != claim.token_ids:
            raise UsageError(f"--token-ids contradict the ids {info.path.name} records.")
        ids = ids if ids is not None else claim.token_ids
        item = dict(claim.metadata)
    else:
        item = {"runtime": runtime_record(),
                "converted_from": {"format": "mlx-lm prompt cache", "file": info.path.name,
                                   "metadata": dict(info.metadata)},
                "provenance": {"kind": ASSERTED, "detail": (
                    "cubepack import mlx: the model given names the producer; the prompt cache "
                    "records only a name")}}
    item.update(metadata or {})
    if proof is not None:
        item.pop("provenance", None)  # the file is placed only once the proof holds
    target = Path(out) if out is not None else _default_out(info.path)
    with open_regular(info.path) as handle:
        descriptor, state = handle.fileno(), file_state(handle.fileno())
        _require_as_checked(info, descriptor)
        if claim is not None:  # a cache cubepack wrote: its bytes must be the ones it records
            _checksum.verify_descriptor(info.path, descriptor, claim.checksums,
                                        prompt_cache_pieces(info))
        layers = _file_layers(info, descriptor)

        def check_and_prove(written: KVFileInfo) -> None:
            # The bytes were read from the file as it was during the copy: it must still
            # be the one checked. The proof then runs on the bytes written, which are placed.
            if file_state(descriptor) != state:
                raise _changed(info.path, "it was modified during the read")
            _require_as_checked(info, descriptor)
            if proof is not None:
                proof(mapped_layers(written), ids, info.kv_dtype)

        try:
            return write_kv_layers(layers, target, producer=live, token_ids=ids, metadata=item,
                                   before_rename=check_and_prove)
        except IdentityMismatch as exc:  # the shapes, checked before anything is written
            raise exc.about(f"The prompt cache {info.path.name}",
                            "Its shapes are not this model's: give the model folder MLX "
                            "loaded to make it.") from None


def claimed_header(info: PromptCacheInfo) -> KVFileInfo | None:
    """The cubepack KV metadata a prompt cache carries (written by cubepack), validated
    against the positions it holds, or None for mlx_lm's own files."""
    raw = info.metadata.get(CUBEPACK_KEY)
    if raw is None:
        return None
    return kv_info(info.path, info.header, raw, info.used_tensors())


def prompt_cache_pieces(info: PromptCacheInfo) -> dict[str, tuple[tuple[int, int], ...]]:
    """Each layer's keys and values in a prompt cache, as the KV file names them, by the byte
    ranges of their positions in use: what the checksums its KV metadata carries cover."""
    return {f"layers.{index}.{part}": _checksum.file_pieces(info.header, tensor, layer.offset)
            for index, layer in enumerate(info.layers)
            for part, tensor in (("keys", layer.keys), ("values", layer.values))}


def _ids(token_ids: Any, offset: int, vocab: Any = None) -> list[int] | None:
    if token_ids is None:
        return None
    given = token_ids.tolist() if hasattr(token_ids, "tolist") else list(token_ids)
    try:  # int() would truncate 1.7; numpy and torch integers pass operator.index
        if any(isinstance(t, bool) for t in given):
            raise TypeError
        ids = [operator.index(t) for t in given]
    except TypeError:
        raise UsageError("Token ids must be integers, e.g. [1, 17, 42].") from None
    if len(ids) != offset:
        raise UsageError(f"{len(ids)} token ids were given but the prompt cache holds {offset} "
                         "positions.")
    if ids and type(vocab) is int and not (min(ids) >= 0 and max(ids) < vocab):
        outside = next(t for t in ids if not 0 <= t < vocab)
        raise UsageError(f"Token id {outside} lies outside the model's vocabulary "
                         f"(0..{vocab - 1}): give the ids the cache was computed from.")
    return ids


def _default_out(path: Path) -> Path:
    stem = path.name.removesuffix(".safetensors")
    return path.with_name(stem + constants.KV_SUFFIX)


def _file_layers(info: PromptCacheInfo, descriptor: int) -> list[tuple[str, int, Any, Any]]:
    """(type, cumulative_length, keys, values) per layer, cut to the positions in use, as
    byte ranges of the open prompt cache (the writer copies them; none is read here)."""
    header, layers = info.header, []
    for layer in info.layers:
        parts = []
        for tensor in (layer.keys, layer.values):
            *lead, stored, last = tensor.shape
            row = stored * last * DTYPE_SIZES[tensor.dtype]
            used = layer.offset * last * DTYPE_SIZES[tensor.dtype]
            start = header.data_offset + tensor.begin
            rows = math.prod(lead)
            pieces = ((start, row * rows),) if used == row else tuple(
                (start + index * row, used) for index in range(rows))
            parts.append(FileTensor(DTYPE_NAMES[tensor.dtype], (*lead, layer.offset, last),
                                    FileBytes(descriptor, pieces, str(info.path))))
        layers.append((FULL, layer.offset, parts[0], parts[1]))
    return layers


def _require_as_checked(info: PromptCacheInfo, descriptor: int) -> None:
    """The open file holds the header and offsets ``info`` was validated from, read again."""
    header = info.header
    differed = header_differs(descriptor, header, str(info.path))
    for index, layer in enumerate(info.layers):
        if differed:
            break
        scalar = header.tensors[f"{index}.2"]
        stored = os.pread(descriptor, scalar.end - scalar.begin, header.data_offset + scalar.begin)
        (offset,) = struct.unpack(OFFSET_FORMATS[scalar.dtype], stored)
        if offset != layer.offset:
            differed = f"layer {index}'s offset: expected {layer.offset}, found {offset}"
    if differed:
        raise _changed(info.path, differed)


def _changed(path: Path, what: str) -> FormatError:
    return FormatError(f"{path} changed while cubepack read it ({what}); nothing was "
                       "written: convert it again once nothing writes it.")


def export_prompt_cache(path: str | os.PathLike[str], out: str | os.PathLike[str], *,
                        model: str | os.PathLike[str] | None = None,
                        item: str | None = None) -> Path:
    """Write the KV file at ``path`` as an MLX-LM prompt cache at ``out`` (atomically), which
    mlx_lm's ``load_prompt_cache`` reads; its metadata carries the KV file's (``cubepack``) and
    the producer's Hub id (``model``, as mlx_lm's ``cache_prompt`` records).

    Args:
        model: when given, the KV file's producer must be this model (refused otherwise).
        item: ``path`` is a cube folder and the memory is its item ``item`` (a shard's range
            or its own file), checked against the cube's lock and its shard's index first.

    Raises:
        IdentityMismatch: ``model`` is not the producer.
        UnsupportedError: a sliding-window layer (MLX keeps those in a RotatingKVCache).
        UsageError, IntegrityError: ``item`` is not a memory of the cube, or not its bytes.
    """
    if item is not None:
        with memory_file(Path(path), item) as memory:
            return export_prompt_cache(memory, out, model=model)
    info = read_kv_header(path)
    # The prompt cache is the first half of a round trip whose import writes format 3.
    require_checksums(info, "cubepack export mlx (whose import writes format 3)")
    if model is not None:
        check_kv_info(info, fingerprint(model, dtype=info.producer.dtype))
    sliding = [i for i, layer in enumerate(info.layers) if layer.type != FULL]
    if sliding:
        raise UnsupportedError(f"{info.path.name}: layer {sliding[0]} is a sliding-window layer; "
                               "cubepack exports full-attention caches to MLX only.")
    if info.num_layers == 0:
        raise UnsupportedError(f"{info.path.name} holds no layers.")
    user = {CUBEPACK_KEY: info.header.metadata[constants.KV_METADATA_KEY],
            "model": info.producer.model_id or ""}
    header = info.header
    with open_regular(info.path) as handle:  # the writer copies each tensor
        descriptor, state = handle.fileno(), file_state(handle.fileno())

        def as_checked() -> None:
            differed = "it was modified during the read" if file_state(descriptor) != state \
                else header_differs(descriptor, header, str(info.path))
            if differed:
                raise _changed(info.path, differed)

        as_checked()
        # The bytes copied must be the ones the KV file records; the prompt cache then
        # carries the same record (its metadata is the KV file's), valid for the same bytes.
        _checksum.verify_descriptor(info.path, descriptor, info.checksums,
                                    _checksum.kv_file_pieces(header, info.tensor_names))
        layers = []
        for index in range(info.num_layers):
            keys, values = (header.tensors[f"layers.{index}.{part}"] for part in ("keys", "values"))
            layers.append((*(FileBytes(descriptor, ((header.data_offset + t.begin, t.end - t.begin),),
                                       str(info.path)) for t in (keys, values)), keys.shape))
        return write_prompt_cache(out, layers, DTYPE_TAGS[info.kv_dtype], info.token_count, user,
                                  before_rename=as_checked)
