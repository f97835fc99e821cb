"""KV file <-> llama.cpp session bytes, without llama.cpp (runs in every suite): the layout
conversion (key head-dimension order, transposed values) is its own inverse, bit for bit."""

from __future__ import annotations

import pytest
import torch

import cubepack
from cubepack.errors import FormatError, IdentityMismatch, UnsupportedError
from cubepack.kv._torch import mapped_layers
from cubepack.llamacpp import export_state, import_state
from cubepack.llamacpp._convert import session_layers, state_bytes
from cubepack.llamacpp._layout import read_session, session_bytes

from envs import chain_once

IDS = [3, 17, 42, 9, 250, 11, 64]


@pytest.fixture
def kv(models, tmp_path):
    cache = cubepack.kv.prefill(models["a"], torch.tensor([IDS]))
    return cubepack.save_kv_cache(cache, tmp_path / "t.kv.safetensors", producer=models["a"],
                                  token_ids=IDS)


@pytest.mark.parametrize("v_trans", [False, True])
def test_a_kv_file_survives_the_session_layout(kv, tmp_path, v_trans):
    data, info = state_bytes(kv, v_trans=v_trans)
    session = tmp_path / "s.bin"
    session.write_bytes(data)
    parsed = read_session(session)
    assert parsed.tokens == IDS and parsed.v_trans is v_trans and parsed.arch == "llama"
    for (_, _, k0, v0), (_, _, k1, v1) in zip(mapped_layers(info),
                                              session_layers(parsed, info.producer)):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
    # the keys are stored in llama.cpp's order: pairs (i, i + head_dim/2) side by side
    first = torch.frombuffer(bytearray(data[parsed.layers[0].k_offset:][:16 * 4]),
                             dtype=torch.float32)
    keys = mapped_layers(info)[0][2][0, 0, 0]
    assert torch.equal(first[0::2], keys[:8]) and torch.equal(first[1::2], keys[8:])


def test_an_imported_session_is_pinned_and_another_models_shapes_refused(kv, zoo, tmp_path):
    session = tmp_path / "s.bin"
    session.write_bytes(state_bytes(kv, v_trans=True)[0])
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    out = import_state(session, gguf, zoo["a"])
    info = cubepack.read_kv_header(out)
    assert info.metadata["gguf"]["size"] == len(b"GGUF stand-in")
    assert info.metadata["provenance"]["kind"] == "asserted"
    with pytest.raises(IdentityMismatch, match="num_layers"):
        import_state(session, gguf, zoo["deep"], out=tmp_path / "x.kv.safetensors")
    assert not (tmp_path / "x.kv.safetensors").exists()
    with pytest.raises(FormatError, match="pins no GGUF"):
        export_state(kv, tmp_path / "x.state")
    other = tmp_path / "other.gguf"
    other.write_bytes(b"another")
    with pytest.raises(IdentityMismatch, match="gguf.sha256"):
        export_state(out, tmp_path / "x.state", gguf=other)
    assert not (tmp_path / "x.state").exists()
    assert export_state(out, tmp_path / "y.state", gguf=gguf, v_trans=True).read_bytes() == \
        session.read_bytes()


def test_a_state_of_another_architecture_is_unsupported(zoo, tmp_path):
    session = tmp_path / "qwen.bin"
    session.write_bytes(session_bytes([1, 2], "qwen2", False, [("float32", bytes(64), bytes(64))],
                                      8))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    with pytest.raises(UnsupportedError, match="'qwen2' model"):
        import_state(session, gguf, zoo["a"])


@chain_once
def test_the_cli_round_trip_without_llama_cpp(kv, zoo, tmp_path, run):
    import json

    session = tmp_path / "s.bin"
    session.write_bytes(state_bytes(kv, v_trans=True)[0])
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    imported = json.loads(run("import", "llamacpp", session, "--gguf", gguf, "--model", zoo["a"],
                              "--json").stdout)
    assert imported["ok"] and imported["token_count"] == len(IDS)
    assert imported["gguf"]["size"] == len(b"GGUF stand-in")
    exported = json.loads(run("export", "llamacpp", imported["path"], "--out",
                              tmp_path / "back.state", "--json").stdout)
    assert exported["ok"] and (tmp_path / "back.state").read_bytes() == session.read_bytes()
    assert exported["pin"].endswith("back.state.cubepack.json")
