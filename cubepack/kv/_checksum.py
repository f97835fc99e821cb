"""Per-tensor checksums of a KV file (format 3): the record, what it covers, and the check every
load runs before a cache is returned. Torch-free (MLX and ``verify`` use it as they are).

**Record.** The ``cubepack`` metadata JSON holds ``checksums``::

    "checksums": {"algorithm": "xxh3-64", "header": "<16 lowercase hex digits>",
                  "tensors": {"layers.0.keys": "<16 lowercase hex digits>", ...}}

``header`` is the XXH3-64 of the metadata itself without ``header`` (:func:`header_digest`), so
a changed header byte is refused as such; ``tensors`` holds one entry per tensor of the file,
no more, no fewer. Each value is the XXH3-64 (seed 0) of that
tensor's bytes exactly as the KV file stores them: the tensor C-contiguous in its dtype,
little-endian, of the shape its header declares, i.e. the file bytes ``[begin, end)`` of its
``data_offsets``. The same metadata travels in an MLX prompt cache cubepack writes (see
:mod:`cubepack.mlx._layout`): there each value covers the positions in use (``[..., :offset,
:]``), the same bytes a KV file of those tensors holds, so the record survives an export and an
import unchanged. Version 1 and 2 files carry no record (a version-2 file that does was altered,
and is refused); a version-3 file without one, or with one that names other tensors, another
algorithm or a value that is not 16 hex digits, is refused (:func:`checksum_record`).

**Algorithm.** XXH3-64 from the ``xxhash`` package (BSD-2-Clause; wheels for CPython 3.10+ on
Linux, macOS and Windows, x86-64 and arm64): its C implementation hashes at memory speed (SSE2 /
AVX2 / NEON; 13-17 GB/s on one core here, more than torch sums a bf16 tensor), takes any buffer
(a memoryview of mapped bytes, so nothing is copied), and releases the GIL, so the tensors of a
large cache are hashed on a pool of threads. CRC32C would do as well as a checksum, but its
packages either hold the GIL and refuse memoryviews (``google-crc32c``: bytes only, a copy) or
are LGPL (``crc32c``), and measured slower. A checksum proves bytes against accidental change
(bit rot, a bad copy, a truncated or hand-edited file), not against an adversary, who can
recompute it: a cube's lock (sha256) and signature are that proof.

**Check.** :func:`verify_buffers` hashes the bytes a load is about to hand over (the mapped
tensors' own memory for torch, the evaluated arrays for MLX; a file's mapped bytes for ``pack``,
``verify`` and the conversions) and raises :class:`~cubepack.errors.IntegrityError` naming the
first tensor that differs (layer, keys/values, expected and found) and what to do.
"""

from __future__ import annotations

import concurrent.futures
import math
import mmap
import os
import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import xxhash

from .._util import canonical
from .._util.safetensors_header import DTYPE_SIZES, FileBytes, Header, TensorInfo, open_regular
from ..errors import FormatError, IntegrityError, Mismatch

#: The algorithm's name in the record: the only one this cubepack writes and reads.
ALGORITHM = "xxh3-64"
#: The record's key in the ``cubepack`` metadata.
RECORD_KEY = "checksums"
_HEX = re.compile(r"[0-9a-f]{16}")
#: Below this many bytes a load hashes on its own thread: a pool costs more than it saves.
PARALLEL_BYTES = 8 * 1024 * 1024
#: Threads hashing one load's tensors (the hash releases the GIL).
WORKERS = max(1, min(4, os.cpu_count() or 1))

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=WORKERS, thread_name_prefix="cubepack-checksum")
        return _pool


def _forget_pool() -> None:
    """In a forked child the pool's threads do not exist: start a new one when needed."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def digest(pieces: Sequence[Any]) -> str:
    """XXH3-64 of ``pieces`` (C-contiguous buffers: memoryviews, numpy arrays, bytes) back to
    back, as 16 hex digits."""
    if len(pieces) == 1:
        return xxhash.xxh3_64_hexdigest(pieces[0])
    state = xxhash.xxh3_64()
    for piece in pieces:
        state.update(piece)
    return state.hexdigest()


def contiguous_pieces(array: Any) -> list[Any]:
    """A numpy array's bytes in C order, as C-contiguous sub-arrays (itself when it is one; a
    slice of the sequence axis, MLX's ``[..., :offset, :]``, gives one piece per row block).

    Never hand a strided buffer to the hash directly: some exporters (MLX arrays) ignore the
    request for a contiguous buffer, and the hash would cover the bytes from the first element
    on, not the tensor's."""
    if array.flags.c_contiguous:
        return [array]
    if array.ndim == 0:
        return [array.copy()]
    return [piece for row in array for piece in contiguous_pieces(row)]


def checksum_record(path: Path | str, meta: dict[str, Any], version: int, names: Iterable[str],
                    first_version: int) -> dict[str, str] | None:
    """The validated ``{tensor name: hex}`` record of a KV header, or None for a version that
    predates checksums (``first_version``).

    Raises:
        FormatError: a version-3 file without a record, or with one that names other tensors,
            another algorithm, or values that are not 16 lowercase hex digits; an older file
            that carries one (its header was altered, e.g. its version lowered).
    """
    record = meta.get(RECORD_KEY)
    if version < first_version:
        if RECORD_KEY in meta:
            raise FormatError(f"{path} is KV format version {version}, which carries no "
                              f"checksums, yet its header holds a '{RECORD_KEY}' record: the "
                              "header was altered. Pull or re-pack the cube.")
        return None
    if not isinstance(record, dict):
        raise FormatError(f"{path}: KV format version {version} requires a '{RECORD_KEY}' "
                          f"record, found {record!r}. The header was altered or the file is "
                          "damaged; pull or re-pack the cube.")
    if set(record) != {"algorithm", "header", "tensors"}:
        raise FormatError(f"{path}: the '{RECORD_KEY}' record must hold 'algorithm', 'header' "
                          f"and 'tensors' only, found {sorted(record)}.")
    if record["algorithm"] != ALGORITHM:
        raise FormatError(f"{path}: its tensors' checksums use {record['algorithm']!r}; this "
                          f"cubepack checks {ALGORITHM!r}. Upgrade cubepack, or re-create the "
                          "file.")
    tensors = record["tensors"]
    if not isinstance(tensors, dict):
        raise FormatError(f"{path}: '{RECORD_KEY}.tensors' must map tensor names to "
                          f"checksums, found {type(tensors).__name__}.")
    expected = set(names)
    if set(tensors) != expected:
        missing = sorted(expected - set(tensors))[:3]
        extra = sorted(set(tensors) - expected)[:3]
        raise FormatError(f"{path}: its checksums do not cover its tensors one for one "
                          f"(no checksum for {missing}, checksums of no tensor {extra}).")
    for name, value in [*tensors.items(), ("the header", record["header"])]:
        if not isinstance(value, str) or not _HEX.fullmatch(value):
            raise FormatError(f"{path}: the checksum of {name} must be 16 lowercase hex digits "
                              f"({ALGORITHM}), found {value!r}.")
    found = header_digest(meta)
    if found != record["header"]:
        error = IntegrityError(
            f"KV cache {path}: its header does not match the checksum it records ({ALGORITHM}: "
            f"expected {record['header']}, found {found}): the header changed after it was "
            "written (bit rot, a bad copy or an edit); nothing was loaded. Pull the cube again, "
            "or re-pack it from its source.")
        error.path, error.tensor = str(path), None  # type: ignore[attr-defined]
        raise error
    return dict(tensors)


def record(checksums: dict[str, str]) -> dict[str, Any]:
    """The ``checksums`` record of a header, from ``{tensor name: hex}``, without its
    ``header`` digest (:func:`seal` adds it)."""
    return {"algorithm": ALGORITHM, "tensors": dict(sorted(checksums.items()))}


def header_digest(meta: dict[str, Any]) -> str:
    """XXH3-64 of the ``cubepack`` metadata as canonical compact JSON, without the digest
    itself (``checksums.header``): what a header's own checksum covers. The tensor table
    (dtype, shape, offsets) is not covered: the format's structural checks pin each of its
    fields (dtype to ``kv_dtype``, shape to the producer and ``layers``, offsets contiguous to
    the file's end), and an MLX prompt cache carries the same metadata at other offsets."""
    unsealed = dict(meta)
    if isinstance(unsealed.get(RECORD_KEY), dict):
        unsealed[RECORD_KEY] = {k: v for k, v in unsealed[RECORD_KEY].items() if k != "header"}
    return xxhash.xxh3_64_hexdigest(canonical.dumps(unsealed, compact=True).encode("ascii"))


def seal(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` (holding a :func:`record`) with its header digest recorded."""
    sealed = {**meta, RECORD_KEY: dict(meta[RECORD_KEY])}
    sealed[RECORD_KEY]["header"] = header_digest(meta)
    return sealed


def compute(tensors: dict[str, Sequence[Any]]) -> dict[str, str]:
    """``{name: hex}`` for tensors given as C-contiguous pieces, hashed on the pool when they
    are large."""
    names = list(tensors)
    total = sum(memoryview(piece).nbytes for pieces in tensors.values() for piece in pieces)
    if WORKERS > 1 and total >= PARALLEL_BYTES and len(names) > 1:
        found = list(_executor().map(digest, (tensors[name] for name in names)))
    else:
        found = [digest(tensors[name]) for name in names]
    return dict(zip(names, found))


def compute_sources(tensors: dict[str, Any]) -> dict[str, str]:
    """:func:`compute` for a writer's tensors: each a C-contiguous buffer, or a
    :class:`~cubepack._util.safetensors_header.FileBytes` (bytes left in an open file, read
    through a read-only mapping of it: nothing is copied)."""
    maps: dict[int, tuple[mmap.mmap, memoryview]] = {}
    views: list[memoryview] = []
    try:
        pieces: dict[str, list[Any]] = {}
        for name, data in tensors.items():
            if not isinstance(data, FileBytes):
                pieces[name] = [data]
                continue
            if data.descriptor not in maps and data.nbytes:
                mapped = mmap.mmap(data.descriptor, 0, access=mmap.ACCESS_READ)
                maps[data.descriptor] = (mapped, memoryview(mapped))
            whole = maps[data.descriptor][1] if data.nbytes else memoryview(b"")
            parts = [whole[at:at + length] for at, length in data.pieces if length]
            if sum(part.nbytes for part in parts) != data.nbytes:
                raise FormatError(f"{data.name} changed while cubepack read it (it ended "
                                  "early); nothing was written: convert it again once nothing "
                                  "writes it.")
            views.extend(parts)
            pieces[name] = parts or [b""]
        return compute(pieces)
    finally:
        for view in views:
            view.release()
        for mapped, whole in maps.values():
            whole.release()
            mapped.close()


def verify_buffers(path: Path | str, expected: dict[str, str] | None,
                   tensors: dict[str, Sequence[Any]]) -> None:
    """Require each tensor's bytes (``tensors``: name -> C-contiguous pieces) to have its
    recorded checksum; nothing to do for a file without a record (``expected`` None).

    Raises:
        IntegrityError: naming the first tensor (in layer order) whose bytes differ, with the
            expected and found checksums, and how many others differ.
    """
    if expected is None:
        return
    found = compute(tensors)
    differing = [name for name in sorted(expected, key=_layer_order)
                 if found.get(name) != expected[name]]
    if differing:
        raise _mismatch(path, differing, expected, found)


def _layer_order(name: str) -> tuple[int, str]:
    index = name.split(".")[1] if name.count(".") == 2 else ""
    return (int(index) if index.isdigit() else -1, name)


def _mismatch(path: Path | str, differing: list[str], expected: dict[str, str],
              found: dict[str, str]) -> IntegrityError:
    name = differing[0]
    where = name
    parts = name.split(".")
    if len(parts) == 3 and parts[1].isdigit():
        where = f"{name} (layer {parts[1]}, {parts[2]})"
    others = len(differing) - 1
    more = f"; {others} other tensor{'s' if others != 1 else ''} differ too" if others else ""
    error = IntegrityError(
        f"KV cache {path}: the bytes of tensor {where} do not match the checksum its header "
        f"records ({ALGORITHM}: expected {expected[name]}, found {found.get(name)}){more}. The "
        "file changed after it was written (bit rot, a bad copy or an edit); nothing was "
        "loaded. Pull the cube again, or re-pack it from its source.")
    error.path, error.tensor = str(path), name  # type: ignore[attr-defined]
    error.mismatches = [Mismatch(f"checksums.{n}", expected[n], found.get(n))  # type: ignore[attr-defined]
                        for n in differing]
    return error


def file_pieces(header: Header, tensor: TensorInfo, positions: int | None = None
                ) -> tuple[tuple[int, int], ...]:
    """The file's byte ranges ``(offset, length)`` holding ``tensor`` (``[..., seq, dim]``), or
    only its first ``positions`` along the sequence axis (an MLX prompt cache's offset), in C
    order: what its checksum covers."""
    start, size = header.data_offset + tensor.begin, tensor.end - tensor.begin
    if positions is None or len(tensor.shape) < 2 or positions == tensor.shape[-2]:
        return ((start, size),) if size else ()
    *lead, stored, last = tensor.shape
    if not 0 <= positions <= stored:
        raise FormatError(f"{tensor.name} holds {stored} positions, not the {positions} in use.")
    rows = math.prod(lead)
    row = stored * last * DTYPE_SIZES[tensor.dtype]
    used = positions * last * DTYPE_SIZES[tensor.dtype]
    if not used:
        return ()
    return tuple((start + index * row, used) for index in range(rows))


def verify_file(path: Path | str, expected: dict[str, str] | None,
                pieces: dict[str, Sequence[tuple[int, int]]]) -> None:
    """:func:`verify_buffers` over a file's own bytes, mapped read-only (no copy, no torch):
    ``pieces`` gives each tensor's byte ranges (:func:`file_pieces`)."""
    if expected is None:
        return
    with open_regular(path) as handle:
        verify_descriptor(path, handle.fileno(), expected, pieces)


def verify_descriptor(path: Path | str, descriptor: int, expected: dict[str, str] | None,
                      pieces: dict[str, Sequence[tuple[int, int]]]) -> None:
    """:func:`verify_file` for a file already open (``descriptor``): the bytes a caller holds
    open are the bytes checked, whatever its path names now."""
    if expected is None:
        return
    size = os.fstat(descriptor).st_size
    if any(at + length > size for ranges in pieces.values() for at, length in ranges):
        raise FormatError(f"{path} is shorter than its header says.")
    if size == 0 or not any(length for ranges in pieces.values() for _, length in ranges):
        verify_buffers(path, expected, {name: [b""] for name in pieces})
        return
    mapped = mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ)
    try:
        whole = memoryview(mapped)
        views = {name: [whole[at:at + length] for at, length in ranges] or [b""]
                 for name, ranges in pieces.items()}
        try:
            verify_buffers(path, expected, views)
        finally:  # every view released before the map closes (else: BufferError)
            for views_of in views.values():
                for view in views_of:
                    if isinstance(view, memoryview):
                        view.release()
            whole.release()
    finally:
        mapped.close()


def kv_file_pieces(header: Header, names: Iterable[str]) -> dict[str, tuple[tuple[int, int], ...]]:
    """Each named tensor's byte range in a KV file (the whole tensor)."""
    return {name: file_pieces(header, header.tensors[name]) for name in names}
