"""llama.cpp's session file (``llama_state_save_file``), read and written without llama.cpp,
numpy or torch.

The layout is llama.cpp's (``src/llama-context.cpp`` ``state_save_file`` and
``src/llama-kv-cache.cpp`` ``state_write``, session format version 10, the version vendored by
llama-cpp-python 0.3.36), all little-endian::

    u32 magic 'ggsn', u32 version, u32 n_tokens, i32 tokens[n_tokens]
    u32 len, arch name                               (llama_context::state_write_data)
    u32 n_stream; per stream: u32 cell_count, then per cell: i32 pos, u32 n_seq, i32 seq[n_seq]
    u32 v_trans, u32 n_layer
    per layer: i32 k_type, u64 k_row_bytes, k rows (one row per cell: n_kv_heads * head_dim)
    v_trans 0: per layer: i32 v_type, u64 v_row_bytes, v rows
    v_trans 1: per layer: i32 v_type, u32 element_bytes, u32 n_embd_v, then per embedding
               element j, that element for every cell (V transposed)

What llama.cpp itself checks on load is that layout: magic, version, arch name, layer count,
tensor types and row sizes. Nothing names the weights, so a fine-tune with the same shapes
loads silently: cubepack pins a state to the GGUF's digest before llama.cpp sees it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FormatError, UnsupportedError

MAGIC = 0x6767736E  # 'ggsn', LLAMA_SESSION_MAGIC
VERSION = 10  # LLAMA_SESSION_VERSION of the vendored llama.cpp
#: ggml type ids of the cache types cubepack converts (ggml.h: GGML_TYPE_F32, GGML_TYPE_F16).
GGML_TYPES = {0: ("float32", 4), 1: ("float16", 2)}
GGML_IDS = {name: (ident, size) for ident, (name, size) in GGML_TYPES.items()}


@dataclass
class StateLayer:
    """One layer's keys and values: where their bytes are in the file, and their type."""

    k_type: str
    k_offset: int
    v_type: str
    v_offset: int
    row_elements: int  # n_kv_heads * head_dim (keys and values alike, for a llama model)


@dataclass
class SessionInfo:
    path: Path
    version: int
    tokens: list[int]
    arch: str
    positions: list[int]
    v_trans: bool
    layers: list[StateLayer] = field(default_factory=list)
    size: int = 0

    @property
    def cell_count(self) -> int:
        return len(self.positions)

    @property
    def kv_dtype(self) -> str:
        return self.layers[0].k_type if self.layers else "float32"


class _Reader:
    def __init__(self, data: bytes, name: str):
        self.data, self.name, self.at = data, name, 0

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise FormatError(f"{self.name} is truncated: it ends inside the llama.cpp state "
                              f"(at byte {self.at}).")
        values = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return values

    def one(self, fmt: str) -> int:
        return self.take(fmt)[0]

    def skip(self, size: int) -> int:
        start = self.at
        if size < 0 or self.at + size > len(self.data):
            raise FormatError(f"{self.name} is truncated: a tensor runs past its end.")
        self.at += size
        return start


def read_session(path: str | os.PathLike[str]) -> SessionInfo:
    """Parse a llama.cpp session file (one sequence, one stream, f32/f16 cache).

    Raises:
        FormatError: not a session file, another version, truncated or with trailing bytes.
        UnsupportedError: several sequences or streams, a quantised cache, or a memory layout
            cubepack does not convert (the arch's cells carry extra position data).
    """
    path = Path(path)
    data = path.read_bytes()
    r = _Reader(data, path.name)
    magic, version = r.take("<II")
    if magic != MAGIC:
        raise FormatError(f"{path.name} is not a llama.cpp session file (magic {magic:#010x}, "
                          f"expected {MAGIC:#010x} 'ggsn').")
    if version != VERSION:
        raise FormatError(f"{path.name} is llama.cpp session version {version}; cubepack reads "
                          f"version {VERSION} (llama-cpp-python 0.3.36).")
    n_tokens = r.one("<I")
    tokens = list(r.take(f"<{n_tokens}i")) if n_tokens else []
    arch_len = r.one("<I")
    arch = bytes(data[r.skip(arch_len):r.at]).decode("utf-8", "replace")
    n_stream = r.one("<I")
    streams = []
    for _ in range(n_stream):
        cells = r.one("<I")
        if cells:
            streams.append(_read_stream(r, cells, path.name))
    if r.at != len(data):
        raise FormatError(f"{path.name} has {len(data) - r.at} bytes after the llama.cpp state.")
    if len(streams) > 1:
        raise UnsupportedError(f"{path.name} holds {len(streams)} KV streams; cubepack converts "
                               "a single-sequence state.")
    positions, v_trans, layers = streams[0] if streams else ([], False, [])
    if positions != list(range(len(positions))):
        raise UnsupportedError(f"{path.name}: its cells are not positions 0..{len(positions) - 1} "
                               "of one sequence (a shifted or edited cache).")
    if len(positions) != n_tokens:
        raise FormatError(f"{path.name} records {n_tokens} tokens but holds {len(positions)} "
                          "KV cells.")
    return SessionInfo(path, version, tokens, arch, positions, v_trans, layers, len(data))


def _read_stream(r: _Reader, cells: int, name: str) -> tuple[list[int], bool, list[StateLayer]]:
    positions = []
    for _ in range(cells):
        pos, n_seq = r.take("<iI")
        seqs = r.take(f"<{n_seq}i") if n_seq else ()
        if seqs != (0,):
            raise UnsupportedError(f"{name}: a cell belongs to sequences {list(seqs)}; cubepack "
                                   "converts the state of sequence 0 alone.")
        positions.append(pos)
    v_trans, n_layer = r.take("<II")
    keys = []
    for _ in range(n_layer):
        k_type, row_bytes = r.take("<iQ")
        dtype, size = _ggml_type(k_type, name)
        if row_bytes % size:
            raise FormatError(f"{name}: a key row of {row_bytes} bytes is not whole {dtype}s.")
        keys.append((dtype, r.skip(row_bytes * cells), row_bytes // size))
    layers = []
    for dtype_k, k_offset, row in keys:
        if not v_trans:
            v_type, row_bytes = r.take("<iQ")
            dtype, size = _ggml_type(v_type, name)
            v_row = row_bytes // size
        else:
            v_type, element, v_row = r.take("<iII")
            dtype, size = _ggml_type(v_type, name)
            if element != size:
                raise FormatError(f"{name}: a {dtype} value element of {element} bytes.")
        if v_row != row:
            raise UnsupportedError(f"{name}: keys of {row} and values of {v_row} elements per "
                                   "cell (another head size for values).")
        layers.append(StateLayer(dtype_k, k_offset, dtype, r.skip(row * size * cells), row))
    return positions, bool(v_trans), layers


def _ggml_type(ident: int, name: str) -> tuple[str, int]:
    if ident not in GGML_TYPES:
        raise UnsupportedError(f"{name}: a KV cache of ggml type {ident}; cubepack converts f32 "
                               "and f16 caches (a quantised cache is not a transformers cache).")
    return GGML_TYPES[ident]


def session_bytes(tokens: list[int], arch: str, v_trans: bool,
                  layers: list[tuple[str, bytes, bytes]], row_elements: int) -> bytes:
    """A session file holding one sequence (cells 0..n-1 of sequence 0): ``layers`` as
    (dtype, key bytes, value bytes) in the file's order (one row per cell; values transposed,
    one row per embedding element, when ``v_trans``)."""
    cells = len(tokens)
    name = arch.encode("utf-8")
    parts = [struct.pack("<III", MAGIC, VERSION, cells), struct.pack(f"<{cells}i", *tokens),
             struct.pack("<I", len(name)), name, struct.pack("<II", 1, cells)]
    parts.extend(struct.pack("<iIi", pos, 1, 0) for pos in range(cells))
    parts.append(struct.pack("<II", int(v_trans), len(layers)))
    for dtype, keys, _ in layers:
        ident, size = GGML_IDS[dtype]
        parts += [struct.pack("<iQ", ident, row_elements * size), keys]
    for dtype, _, values in layers:
        ident, size = GGML_IDS[dtype]
        if v_trans:
            parts += [struct.pack("<iII", ident, size, row_elements), values]
        else:
            parts += [struct.pack("<iQ", ident, row_elements * size), values]
    return b"".join(parts)
