"""The cubepack KV file format, version 3, read without torch.

One KV cache per safetensors file (the layout is in README.md, "KV file format"):

- tensors ``layers.<i>.keys`` and ``layers.<i>.values``, contiguous, shape
  ``[batch, kv_heads, seq, head_dim]``, in the cache's dtype;
- metadata key ``cubepack``: one JSON string with ``format`` (``"cubepack.kv"``), ``version``
  (3), ``producer`` (the full :class:`~cubepack.identity.ModelIdentity` of the model that built
  the cache), ``num_layers``, ``layers`` (per layer ``type`` and ``cumulative_length``, which a
  sliding-window layer needs to be restored exactly), ``kv_dtype``, ``token_count``,
  ``token_ids`` (or null), free ``metadata`` and ``checksums``: ``{"algorithm": "xxh3-64",
  "header": "<16 hex digits>", "tensors": {"layers.0.keys": "<16 hex digits>", ...}}``, the
  XXH3-64 of this metadata (without ``header``) and of each tensor's stored bytes
  (:mod:`cubepack.kv._checksum`).

:func:`read_kv_header` validates all of it, and the structure against the producer, before any
tensor is touched; :func:`check_kv_file` also requires the producer to be a given identity.
Turning tensors into caches and back is :mod:`cubepack.kv._torch`'s job; every load of the
tensors (``load_kv_cache``, the MemOS hook, the MLX load, a recomputation, a conversion, ``pack``
and ``verify``) requires each tensor's bytes to match its checksum first, and refuses a file
whose bytes changed with an :class:`~cubepack.errors.IntegrityError` naming the tensor.

Older versions: a version-2 file (no ``checksums``) still loads; its tensors cannot be checked,
which :attr:`KVFileInfo.checksums` (None), ``cubepack inspect`` ("checksums: none") and a
warning at each load say (the MemOS hook's report lists such items in ``unchecksummed``);
``cubepack upgrade FILE --model MODEL`` adds them. Nothing else writes fresh checksums over a
version-2 file's bytes without checking them (:func:`require_checksums`: the conversions refuse
it; ``pack`` checks it against the cube's lock). A version-1 file is read (``inspect``,
``upgrade``) but never loaded. An unknown version is refused, naming the upgrade.
"""

from __future__ import annotations

import logging
import os
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .._util import canonical, constants
from .._util.safetensors_header import Header, TensorInfo, read_header
from ..errors import CubepackError, FormatError, IntegrityError, Mismatch
from ..identity._identity import ModelIdentity, compare_warnings, require_same
from . import _checksum

logger = logging.getLogger("cubepack")


FULL = "full_attention"


SLIDING = "sliding_attention"


@dataclass(frozen=True)
class KVLayerInfo:
    type: str
    cumulative_length: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class KVFileInfo:
    """What a KV file says about itself, validated (see :func:`read_kv_header`)."""

    path: Path
    version: int
    producer: ModelIdentity
    kv_dtype: str
    layers: list[KVLayerInfo]
    token_count: int
    token_ids: list[int] | None
    metadata: dict[str, Any] = field(default_factory=dict)
    header: Header | None = field(default=None, repr=False, compare=False)
    #: Each tensor's recorded checksum (name -> 16 hex digits, XXH3-64), validated against the
    #: tensors' names; None for a file older than version 3, whose bytes cannot be checked.
    checksums: dict[str, str] | None = field(default=None, repr=False)
    #: The file's bytes when it was read from memory (a decrypted private file), not ``path``;
    #: its tensors are then views of this buffer.
    data: Any = field(default=None, repr=False, compare=False)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def tensor_names(self) -> list[str]:
        return [f"layers.{i}.{part}" for i in range(self.num_layers)
                for part in ("keys", "values")]

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "format": constants.KV_FORMAT_NAME,
            "version": self.version,
            "producer": self.producer.to_dict(),
            "kv_dtype": self.kv_dtype,
            "num_layers": self.num_layers,
            "layers": [{"type": layer.type, "cumulative_length": layer.cumulative_length,
                        "shape": list(layer.shape)} for layer in self.layers],
            "token_count": self.token_count,
            "token_ids": self.token_ids,
            "metadata": self.metadata,
            "checksums": None if self.checksums is None else _checksum.record(self.checksums),
        }


def read_kv_header(path: str | os.PathLike[str], *, data: Any = None) -> KVFileInfo:
    """Read and validate a KV file's header and metadata, without loading any tensor.
    ``data``: the file's bytes already in memory (a decrypted private file): read from there
    and kept in the result, ``path`` only naming it.

    Raises:
        FormatError: not a cubepack KV file, an unknown format version, or a header whose
            tensors contradict its own metadata (count, dtype, shapes, lengths).

    Returns:
        a ``KVFileInfo``: the file's format version, producer, dtype, layers, token count
        and ids, metadata and checksums, read from its header alone (no tensor is read).

    Example:
        ```python
        info = cubepack.read_kv_header("my-cube/activations/item-1.kv.safetensors")
        print(info.producer, info.token_count)
        ```
    """
    path = Path(path)
    header = read_header(path, data=data)
    raw = header.metadata.get(constants.KV_METADATA_KEY)
    if raw is None:
        hint = (" It is laid out as an MLX-LM prompt cache: convert it with cubepack import mlx "
                f"{path} --model MODEL.") if "1.0" in header.metadata else ""
        raise FormatError(f"{path} is a safetensors file but not a cubepack KV file (no "
                          f"'{constants.KV_METADATA_KEY}' metadata).{hint}")
    info = kv_info(path, header, raw, header.tensors)
    return info if data is None else replace(info, data=data)


def kv_info(path: Path, header: Header, raw: str, tensors: dict[str, TensorInfo]) -> KVFileInfo:
    """Validate a KV file's metadata ``raw`` against ``tensors`` (named ``layers.<i>.keys`` /
    ``.values``): the one check for a KV file and for the same metadata carried by another
    layout (an MLX prompt cache written by cubepack, its tensors renamed)."""
    try:  # a repeated key: readers that keep the first and the last would see two files
        meta = canonical.loads_strict(raw, object_pairs_hook=canonical.unique_pairs)
    except ValueError as exc:
        raise FormatError(f"{path} has corrupt cubepack metadata ({exc}).") from exc
    if not isinstance(meta, dict) or meta.get("format") != constants.KV_FORMAT_NAME:
        raise FormatError(f"{path} is not a cubepack KV file (format is "
                          f"{meta.get('format') if isinstance(meta, dict) else None!r}).")
    version = meta.get("version")
    if type(version) is not int:  # not 2.0 or true, which Python compares equal to 2 and 1
        raise FormatError(f"{path}: the KV header's version must be an integer, found "
                          f"{version!r}.")
    if version not in constants.KV_READABLE_VERSIONS:
        raise FormatError(
            f"{path} is KV format version {version!r}; this cubepack reads versions "
            f"{', '.join(map(str, constants.KV_READABLE_VERSIONS))}. Upgrade cubepack, or "
            "re-create the file."
        )
    # First: a header that is not the one written is refused as such, before any field of it
    # is interpreted (version 3; an older file carries no record, and may carry none).
    checksums = _checksum.checksum_record(path, meta, version, tensors,
                                          constants.KV_CHECKSUM_VERSION)
    producer = ModelIdentity.from_dict(meta.get("producer"),
                                       legacy=version < constants.KV_CHECKABLE_VERSION)
    layers = _validate_layers(path, tensors, meta, producer)
    token_count = layers[0].cumulative_length if layers else 0
    if type(meta.get("token_count")) is not int or meta["token_count"] != token_count:
        raise FormatError(f"{path}: token_count {meta.get('token_count')!r} contradicts its "
                          f"layers, which hold {token_count} tokens.")
    token_ids = meta.get("token_ids")
    # set(map(type, ...)), min and max: the same checks at C speed (every load runs them)
    if token_ids is not None and (
        not isinstance(token_ids, list) or not set(map(type, token_ids)) <= {int}
        or len(token_ids) != token_count
    ):
        raise FormatError(f"{path}: token_ids must be a list of {token_count} integers.")
    vocab = producer.geometry.get("vocab_size")
    if token_ids and vocab and not (min(token_ids) >= 0 and max(token_ids) < vocab):
        outside = next(t for t in token_ids if not 0 <= t < vocab)
        raise FormatError(f"{path}: token id {outside} lies outside its producer's vocabulary "
                          f"(0..{vocab - 1}).")
    item_metadata = meta.get("metadata") or {}
    if not isinstance(item_metadata, dict):
        raise FormatError(f"{path}: item metadata must be a JSON object.")
    return KVFileInfo(path=path, version=version, producer=producer, kv_dtype=meta["kv_dtype"],
                      layers=layers, token_count=token_count, token_ids=token_ids,
                      metadata=item_metadata, header=header, checksums=checksums)


def _validate_layers(path: Path, tensors: dict[str, TensorInfo], meta: dict[str, Any],
                     producer: ModelIdentity) -> list[KVLayerInfo]:
    num_layers, entries, kv_dtype = meta.get("num_layers"), meta.get("layers"), meta.get("kv_dtype")
    if type(num_layers) is not int or not isinstance(entries, list) or len(entries) != num_layers:
        raise FormatError(f"{path}: num_layers and the layer list disagree.")
    if kv_dtype != producer.kv_dtype:
        raise FormatError(f"{path}: kv_dtype {kv_dtype!r} differs from its producer's "
                          f"{producer.kv_dtype!r}.")
    expected_names = {f"layers.{i}.{part}" for i in range(num_layers) for part in ("keys", "values")}
    if set(tensors) != expected_names:
        extra = sorted(set(tensors) - expected_names)[:3]
        missing = sorted(expected_names - set(tensors))[:3]
        raise FormatError(f"{path}: tensors do not match {num_layers} layers "
                          f"(missing {missing}, unexpected {extra}).")
    layers: list[StoredLayer] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or entry.get("type") not in (FULL, SLIDING) \
                or type(entry.get("cumulative_length")) is not int or entry["cumulative_length"] < 0:
            raise FormatError(f"{path}: layer {index} has malformed metadata {entry!r}.")
        keys = tensors[f"layers.{index}.keys"]
        values = tensors[f"layers.{index}.values"]
        for tensor in (keys, values):
            if tensor.dtype_name != kv_dtype:
                raise FormatError(f"{path}: {tensor.name} is {tensor.dtype_name}, but the file "
                                  f"declares kv_dtype {kv_dtype}.")
        layers.append(StoredLayer(entry["type"], entry["cumulative_length"], keys.shape,
                                  values.shape, keys.dtype_name, values.dtype_name))
    problems = structure_problems(layers, producer)
    if problems:
        raise FormatError(f"{path}: its tensors contradict its producer or themselves ("
                          + "; ".join(str(problem) for problem in problems[:4]) + ").")
    return [KVLayerInfo(layer.type, layer.cumulative_length, layer.keys_shape) for layer in layers]


@dataclass(frozen=True)
class StoredLayer:
    """What a cache layer is made of, from a file header or from live tensors (no data)."""

    type: str
    cumulative_length: int
    keys_shape: tuple[int, ...]
    values_shape: tuple[int, ...]
    keys_dtype: str
    values_dtype: str


def structure_problems(layers: list[StoredLayer], producer: ModelIdentity) -> list[Mismatch]:
    """Where a cache's layers contradict its producer's geometry and KV dtype (pure).

    One rule for both directions: a file header is refused with it, and a cache about to be
    written under a producer's name is refused with it. A contradiction of the producer's
    geometry or dtype is the producer's (``of_producer``: that model cannot have made it); a
    rank, a length or a batch its layers disagree on is the cache's own.
    """
    geometry = producer.geometry
    found: list[Mismatch] = []
    if geometry.get("num_layers") is not None and len(layers) != geometry["num_layers"]:
        return [Mismatch("geometry.num_layers", geometry["num_layers"], len(layers),
                         of_producer=True)]
    dtypes = sorted({dtype for layer in layers for dtype in (layer.keys_dtype, layer.values_dtype)})
    if dtypes and dtypes != [producer.kv_dtype]:  # one line, not one per layer
        found.append(Mismatch("kv_dtype", producer.kv_dtype, ", ".join(dtypes), of_producer=True))
    layer_types = geometry.get("layer_types") or []
    for index, layer in enumerate(layers):
        where = f"layers[{index}]"
        if index < len(layer_types) and layer_types[index] != layer.type:
            found.append(Mismatch(f"{where}.type", layer_types[index], layer.type,
                                  of_producer=True))
        if len(layer.keys_shape) != 4 or len(layer.values_shape) != 4:
            found.append(Mismatch(f"{where}.rank", 4, len(layer.keys_shape)))
            continue
        if layer.keys_shape[:3] != layer.values_shape[:3]:
            found.append(Mismatch(f"{where}.values_shape", list(layer.keys_shape[:3]),
                                  list(layer.values_shape[:3])))
        for key, axis in (("num_kv_heads", 1), ("head_dim", 3)):
            if geometry.get(key) is not None and layer.keys_shape[axis] != geometry[key]:
                found.append(Mismatch(f"{where}.{key}", geometry[key], layer.keys_shape[axis],
                                      of_producer=True))
        if geometry.get("head_dim") is not None and layer.values_shape[3] != geometry["head_dim"]:
            found.append(Mismatch(f"{where}.values_head_dim", geometry["head_dim"],
                                  layer.values_shape[3], of_producer=True))
        found.extend(_length_problems(where, layer, geometry))
    if not found:
        found.extend(_shared_shape_problems(layers))
    return found


def _length_problems(where: str, layer: StoredLayer, geometry: dict[str, Any]) -> list[Mismatch]:
    """A layer's stored positions must agree with the tokens it has seen.

    A full-attention layer stores every token. A sliding layer stores every token until its
    window fills, then the last ``window - 1`` (what transformers 4.56+ and 5.x keep), never
    more: a layer holding ``window`` positions makes the model's next step fail; its
    ``cumulative_length`` counts every token, and RoPE positions continue from it.
    """
    seq, cumulative = layer.keys_shape[2], layer.cumulative_length
    if layer.type == FULL:
        return [] if seq == cumulative else [Mismatch(f"{where}.cumulative_length", seq,
                                                      cumulative)]
    window = geometry.get("sliding_window")
    if seq > cumulative:
        return [Mismatch(f"{where}.cumulative_length", f">= {seq} (the positions it stores)",
                         cumulative)]
    if window is not None and seq > window - 1:
        return [Mismatch(f"{where}.stored_positions",
                         f"<= {window - 1} (the sliding window {window}, less the new token)", seq)]
    if seq < cumulative and (window is None or seq < window - 1):
        return [Mismatch(f"{where}.stored_positions",
                         f"{min(cumulative, (window or 1) - 1)} (all {cumulative} seen, up to "
                         "the window)", seq)]
    return []


def _shared_shape_problems(layers: list[StoredLayer]) -> list[Mismatch]:
    """Every layer belongs to one sequence: one batch size, one token count, and data behind
    every position (a batch of zero, or no heads, would claim positions it does not hold)."""
    found: list[Mismatch] = []
    first = layers[0] if layers else None
    for index, layer in enumerate(layers):
        where = f"layers[{index}]"
        if layer.keys_shape[0] < 1 or layer.keys_shape[1] < 1 or layer.keys_shape[3] < 1:
            found.append(Mismatch(f"{where}.shape", "batch, heads and head_dim >= 1",
                                  list(layer.keys_shape)))
        if first is not None and layer.keys_shape[0] != first.keys_shape[0]:
            found.append(Mismatch(f"{where}.batch", first.keys_shape[0], layer.keys_shape[0]))
        if first is not None and layer.cumulative_length != first.cumulative_length:
            found.append(Mismatch(f"{where}.cumulative_length", first.cumulative_length,
                                  layer.cumulative_length))
    return found


#: The runtime a KV file without a ``runtime`` record was made by: cubepack's own writer,
#: ``save_kv_cache``, takes transformers caches.
DEFAULT_RUNTIME = "transformers"


def producer_runtime(metadata: dict[str, Any]) -> str:
    """The runtime that computed a cache, by name (``"mlx-lm"`` for ``"mlx-lm 0.32.2"``), from
    a KV header's item metadata: a claim, used only to decide that loading it elsewhere needs
    a recomputation there, never to accept anything."""
    recorded = metadata.get("runtime")
    if not isinstance(recorded, str) or not recorded.split():
        return DEFAULT_RUNTIME
    return recorded.split()[0]


def check_kv_file(path: str | os.PathLike[str], live: ModelIdentity, *,
                  data: Any = None) -> KVFileInfo:
    """Validate the header and require its producer to be ``live``; return the header
    (``data``: the file's bytes already in memory, see :func:`read_kv_header`).

    Raises:
        IdentityMismatch: naming every differing strict field.
        FormatError: a malformed file.
    """
    return check_kv_info(read_kv_header(path, data=data), live)


def check_kv_info(info: KVFileInfo, live: ModelIdentity) -> KVFileInfo:
    """:func:`check_kv_file` for a header already read and validated (a KV file's, or the
    same metadata carried by another runtime's cache file)."""
    path = info.path
    if info.version < constants.KV_CHECKABLE_VERSION:
        raise FormatError(
            f"KV cache {Path(path).name} is KV format version {info.version}, whose producer "
            "identity does not pin the model's compute config or its tokenizer's behaviour, so "
            "it cannot be checked against a model. Upgrade it with its producer: cubepack "
            f"upgrade {path} --model MODEL")
    require_same(info.producer, live, f"KV cache {Path(path).name}")
    warn_if_prompt_format_differs(info.producer, live, f"KV cache {Path(path).name}")
    return info


def verify_checksums(info: KVFileInfo) -> None:
    """Require a KV file's tensors, as the file holds them now, to match their checksums (the
    file mapped read-only: no copy, no torch); a file older than version 3 passes unchecked.

    Raises:
        IntegrityError: a tensor's bytes differ from its checksum (the tensor named).
    """
    header = info.header or read_header(info.path, data=info.data)
    pieces = _checksum.kv_file_pieces(header, info.tensor_names)
    if info.data is not None:  # bytes in memory (a shard's range, a decrypted file)
        if info.checksums is None:
            return
        view = memoryview(info.data).cast("B")
        _checksum.verify_buffers(info.path, info.checksums, {
            name: [view[at:at + length] for at, length in ranges]
            for name, ranges in pieces.items()})
        return
    _checksum.verify_file(info.path, info.checksums, pieces)


def upgrade_command(target: str | os.PathLike[str], model: str = "MODEL",
                    revision: str | None = None) -> str:
    """The command that adds per-tensor checksums to the KV files of ``target`` (a file, or a
    cube: then its lock is checked first), as a user pastes it."""
    command = f"cubepack upgrade {shlex.quote(str(target))} --model {shlex.quote(model)}"
    return command + (f" --revision {shlex.quote(revision)}" if revision else "")


def require_checksums(info: KVFileInfo, step: str, fix: str | None = None) -> None:
    """The rule for a step that writes fresh checksums over a KV file's tensor bytes as they
    are (a format-3 header, a llama.cpp session's pin): a checksum never seals bytes nothing
    checked. A format-3 file's bytes are checked against its own checksums; a format-2 file's
    are vouched for only by its cube's lock, which such a step, given a file, does not hold:
    it is refused, naming the upgrade (``upgrade`` of a cube checks the lock first; of a lone
    file, it takes the user's word, as a command the user runs). ``pack`` checks format-2
    files against the cube's lock itself (:mod:`cubepack.ops._pack`). ``step``: what was
    asked, as the message names it (``cubepack export mlx``); ``fix``: how to add them, when
    the file is not itself a KV file (a prompt cache carrying one's metadata).

    Raises:
        FormatError: a file older than version 3.
    """
    if info.checksums is not None:
        return
    raise FormatError(
        f"KV cache {info.path} is KV format v{info.version}: its tensors carry no checksums, so "
        f"nothing has checked their bytes, and {step} would seal them with fresh checksums. "
        "Add them first, then run it again: " + (fix or (
            f"{upgrade_command('CUBE')} for the cube the file belongs to (its lock is checked "
            f"first), or {upgrade_command(info.path)} for a lone file you trust.")))


def unchecked_note(info: KVFileInfo, fix: str | None = None) -> str | None:
    """What to tell a user who loads a file whose tensors carry no checksums (format 2), or
    None for one whose tensors were checked; ``fix``: how to add them, when not an upgrade of
    the file itself."""
    if info.checksums is not None:
        return None
    if fix is None and str(info.path).endswith(".age"):
        # A private file is never upgraded in place (its plaintext is never written to a
        # file): its owner upgrades the clear source and encrypts it again, continuing it.
        fix = ("its owner upgrades the cube's clear source (cubepack upgrade SOURCE --model "
               "MODEL) and encrypts it again, continuing this one (cubepack encrypt SOURCE "
               "--to RECIPIENT --continue PRIVATE_CUBE --sign-key SIGNING_KEY)")
    fix = fix or upgrade_command(info.path)
    return (f"KV cache {info.path} has no per-tensor checksums (format v{info.version}): its "
            "tensor bytes were not checked at load (a cube's are checked against its lock by "
            f"verify). Add them: {fix}")


def checksum_verdict(info: KVFileInfo) -> tuple[bool | None, str]:
    """``verify``'s per-tensor check of a KV file: (True, what matched), (None, why there is
    nothing to check: a format-2 file) or (False, the IntegrityError's message naming the
    first tensor that differs)."""
    if info.checksums is None:
        return None, f"skipped: no per-tensor checksums (format v{info.version})"
    try:
        verify_checksums(info)
    except IntegrityError as exc:
        return False, str(exc)
    return True, (f"the {len(info.checksums)} tensors match their {_checksum.ALGORITHM} "
                  "checksums")


def kv_metadata(producer: ModelIdentity, entries: list[dict[str, Any]], token_ids: list[int] | None,
                metadata: dict[str, Any] | None, *, checksums: dict[str, str]) -> str:
    """The ``cubepack`` metadata string of a KV file whose layers are ``entries`` (``type``
    and ``cumulative_length`` each) and whose tensors have ``checksums`` (name -> XXH3-64 hex
    of the bytes written, :func:`cubepack.kv._checksum.compute`): the one definition for every
    writer.

    Raises:
        CubepackError: ``token_ids`` do not cover the cache, or metadata is not JSON.
    """
    token_count = max((entry["cumulative_length"] for entry in entries), default=0)
    if token_ids is not None and len(token_ids) != token_count:
        raise CubepackError(f"token_ids has {len(token_ids)} ids but the cache covers "
                            f"{token_count} tokens.")
    names = {f"layers.{i}.{part}" for i in range(len(entries)) for part in ("keys", "values")}
    if set(checksums) != names:  # a writer's bug: never write a record that cannot hold
        raise CubepackError(f"The checksums name {sorted(checksums)[:4]}, not the tensors of "
                            f"{len(entries)} layers.")
    try:
        return canonical.dumps(_checksum.seal({
            "format": constants.KV_FORMAT_NAME,
            "version": constants.KV_FORMAT_VERSION,
            "producer": producer.to_dict(),
            "num_layers": len(entries),
            "layers": entries,
            "kv_dtype": producer.kv_dtype,
            "token_count": token_count,
            "token_ids": token_ids,
            "metadata": metadata or {},
            "checksums": _checksum.record(checksums),
        }), compact=True)
    except (TypeError, ValueError) as exc:
        raise CubepackError(f"KV item metadata must be JSON-serialisable: {exc}") from exc


def warn_if_prompt_format_differs(expected: ModelIdentity, found: ModelIdentity,
                                  what: str) -> list[Mismatch]:
    """Log (and return) the fields that differ without invalidating the cache."""
    differences = compare_warnings(expected, found)
    for difference in differences:
        logger.warning("cubepack: %s: the chat template or special tokens differ from its "
                       "producer's (%s); the cache is valid, but prompts built on it may be "
                       "formatted differently.", what, difference.field)
    return differences
