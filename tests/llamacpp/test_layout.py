"""llama.cpp's session layout, read and written without llama.cpp (runs in every suite)."""

from __future__ import annotations

import struct

import pytest

from cubepack.errors import FormatError, UnsupportedError
from cubepack.llamacpp._layout import MAGIC, VERSION, read_session, session_bytes


def _session(tmp_path, *, v_trans=False, tokens=(5, 6, 7), dtype="float32", name="s.bin"):
    size = 4 if dtype == "float32" else 2
    width = 4  # kv heads * head dim
    layers = [(dtype, bytes(range(len(tokens) * width * size)), bytes(len(tokens) * width * size))
              for _ in range(2)]
    path = tmp_path / name
    path.write_bytes(session_bytes(list(tokens), "llama", v_trans, layers, width))
    return path


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_written_session_reads_back(tmp_path, v_trans, dtype):
    info = read_session(_session(tmp_path, v_trans=v_trans, dtype=dtype))
    assert (info.tokens, info.arch, info.positions, info.v_trans) == ([5, 6, 7], "llama",
                                                                      [0, 1, 2], v_trans)
    assert len(info.layers) == 2 and info.kv_dtype == dtype
    assert all(layer.row_elements == 4 for layer in info.layers)
    first = info.layers[0]
    raw = info.path.read_bytes()
    size = 4 if dtype == "float32" else 2
    assert raw[first.k_offset:first.k_offset + 3 * 4 * size] == bytes(range(3 * 4 * size))


def test_what_is_not_a_session_of_this_version_is_refused(tmp_path):
    path = _session(tmp_path)
    data = path.read_bytes()
    for broken, message in ((b"xxxx" + data[4:], "not a llama.cpp session file"),
                            (data[:4] + struct.pack("<I", VERSION - 1) + data[8:],
                             f"session version {VERSION - 1}"),
                            (data[:-3], "truncated"), (data + b"\0", "bytes after")):
        path.write_bytes(broken)
        with pytest.raises(FormatError, match=message):
            read_session(path)


def test_a_quantised_cache_or_another_sequence_is_unsupported(tmp_path):
    data = bytearray(_session(tmp_path).read_bytes())
    header = 12 + 3 * 4 + 4 + len("llama") + 8  # tokens, arch, n_stream, cell_count
    seq = bytearray(data)
    struct.pack_into("<i", seq, header + 8, 1)  # cell 0 belongs to sequence 1
    path = tmp_path / "seq.bin"
    path.write_bytes(bytes(seq))
    with pytest.raises(UnsupportedError, match="sequences"):
        read_session(path)
    quant = bytearray(data)
    struct.pack_into("<i", quant, header + 3 * 12 + 8, 8)  # layer 0's keys: ggml Q8_0
    path.write_bytes(bytes(quant))
    with pytest.raises(UnsupportedError, match="ggml type 8"):
        read_session(path)
    assert struct.unpack_from("<I", data)[0] == MAGIC


def test_shifted_cells_are_unsupported(tmp_path):
    data = bytearray(_session(tmp_path).read_bytes())
    struct.pack_into("<i", data, 12 + 3 * 4 + 4 + len("llama") + 8, 5)  # cell 0 at position 5
    path = tmp_path / "shifted.bin"
    path.write_bytes(bytes(data))
    with pytest.raises(UnsupportedError, match="not positions 0..2"):
        read_session(path)
