"""KV files: a cache loads only into the model that produced it, bit-exactly."""

from __future__ import annotations

import struct

import pytest
import torch

import cubepack
from cubepack import FormatError, IdentityMismatch, UnsupportedError
from cubepack.kv import read_kv_header

from helpers import all_equal, as_format_1, build_cache, continue_greedy, rewrite_kv_metadata


@pytest.fixture(scope="module")
def a_file(models, tmp_path_factory):
    """A cache built by model A from the prompt, saved, plus its in-memory original."""
    from data import PROMPT

    ids = torch.tensor([PROMPT])
    cache = build_cache(models["a"], ids)
    path = tmp_path_factory.mktemp("kv") / "a.kv.safetensors"
    cubepack.save_kv_cache(cache, path, producer=models["a"], token_ids=ids,
                           metadata={"source": "The user is a Chinese man.", "id": "item-1"})
    return path, cache


def test_cache_from_a_loads_into_a_with_identical_logits(models, a_file):
    path, original = a_file
    loaded = cubepack.load_kv_cache(path, models["a"])
    assert loaded.get_seq_length() == original.get_seq_length() == 10
    assert all_equal(continue_greedy(models["a"], original, 20, 6),
                     continue_greedy(models["a"], loaded, 20, 6))


def test_cache_from_a_is_refused_by_same_shape_model_b(models, a_file):
    path, _ = a_file
    with pytest.raises(IdentityMismatch) as caught:
        cubepack.load_kv_cache(path, models["b"])
    assert caught.value.fields == ["weights_digest"]
    assert isinstance(caught.value, cubepack.CubepackError)
    mismatch = caught.value.mismatches[0]
    assert mismatch.expected == cubepack.fingerprint(models["a"]).weights_digest
    assert mismatch.found == cubepack.fingerprint(models["b"]).weights_digest
    assert "weights_digest: expected sha256:" in str(caught.value)


def test_fp32_cache_is_refused_by_a_loaded_in_bf16(models, a_file):
    path, _ = a_file
    with pytest.raises(IdentityMismatch) as caught:
        cubepack.load_kv_cache(path, models["a_as_bf16"])
    assert caught.value.fields == ["dtype", "kv_dtype"]
    assert "dtype: expected float32, found bfloat16" in str(caught.value)


def test_cache_is_refused_by_a_model_with_another_layer_count(models, a_file):
    path, _ = a_file
    with pytest.raises(IdentityMismatch) as caught:
        cubepack.load_kv_cache(path, models["deep"])
    layers = [m for m in caught.value.mismatches if m.field == "geometry.num_layers"]
    assert layers and (layers[0].expected, layers[0].found) == (2, 3)
    assert "geometry.num_layers: expected 2, found 3" in str(caught.value)


def test_cache_is_refused_by_a_model_with_another_tokenizer(models, a_file):
    path, _ = a_file
    with pytest.raises(IdentityMismatch) as caught:
        cubepack.load_kv_cache(path, models["other_tok"])
    assert caught.value.fields == ["tokenizer_digest"]


def test_sliding_window_cache_restores_exactly(models, tmp_path):
    model = models["hybrid"]
    ids = torch.arange(2, 12)[None]  # 10 tokens, longer than the 4-token window
    original = build_cache(model, ids)
    path = cubepack.save_kv_cache(original, tmp_path / "h.kv.safetensors", producer=model,
                                  token_ids=ids)
    info = read_kv_header(path)
    assert [layer.type for layer in info.layers] == ["sliding_attention", "full_attention"]
    assert info.layers[0].shape[2] < info.layers[0].cumulative_length == 10
    loaded = cubepack.load_kv_cache(path, model)
    assert loaded.get_seq_length() == 10
    assert all_equal(continue_greedy(model, original, 30, 6), continue_greedy(model, loaded, 30, 6))


def test_header_records_producer_tokens_and_metadata(models, a_file):
    from data import PROMPT

    info = read_kv_header(a_file[0])
    assert info.version == 3 and info.num_layers == 2 and info.kv_dtype == "float32"
    assert info.token_ids == PROMPT and info.token_count == len(PROMPT)
    assert info.metadata == {"source": "The user is a Chinese man.", "id": "item-1"}
    assert info.producer.strict() == cubepack.fingerprint(models["a"]).strict()


def test_copy_detaches_tensors_from_the_file(models, a_file, tmp_path):
    path, _ = a_file
    private = tmp_path / "private.kv.safetensors"
    private.write_bytes(path.read_bytes())
    cache = cubepack.load_kv_cache(private, models["a"], copy=True)
    private.unlink()
    assert cache.get_seq_length() == 10
    assert torch.isfinite(cache.layers[0].keys).all()


def test_unknown_format_version_is_refused(models, a_file, tmp_path):
    bad = rewrite_kv_metadata(a_file[0], tmp_path / "v4.kv.safetensors",
                            lambda meta: meta.update(version=4))
    with pytest.raises(FormatError, match="version 4; this cubepack reads versions 1, 2, 3"):
        cubepack.load_kv_cache(bad, models["a"])


def test_corrupt_header_is_refused(models, a_file, tmp_path):
    raw = bytearray(a_file[0].read_bytes())
    raw[12:20] = b"\xff\xfe{{{{{{"
    bad = tmp_path / "corrupt.kv.safetensors"
    bad.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="corrupt safetensors header"):
        cubepack.load_kv_cache(bad, models["a"])


def test_truncated_file_is_refused(models, a_file, tmp_path):
    raw = a_file[0].read_bytes()
    bad = tmp_path / "truncated.kv.safetensors"
    bad.write_bytes(raw[: len(raw) - 100])
    with pytest.raises(FormatError, match="outside the file"):
        cubepack.load_kv_cache(bad, models["a"])
    bad.write_bytes(raw[:5])
    with pytest.raises(FormatError, match="only 5 bytes"):
        cubepack.load_kv_cache(bad, models["a"])


def test_huge_declared_header_is_refused_without_reading(tmp_path):
    bad = tmp_path / "huge.kv.safetensors"
    bad.write_bytes(struct.pack("<Q", 2**60) + b"{}")
    with pytest.raises(FormatError, match="limit"):
        read_kv_header(bad)


def test_header_that_lies_about_dtype_is_refused(models, a_file, tmp_path):
    bad = rewrite_kv_metadata(a_file[0], tmp_path / "lie.kv.safetensors",
                            lambda meta: (meta.update(kv_dtype="bfloat16"),
                                          meta["producer"].update(kv_dtype="bfloat16")))
    with pytest.raises(FormatError, match="declares kv_dtype bfloat16"):
        read_kv_header(bad)


def test_plain_safetensors_file_is_not_a_kv_file(tmp_path):
    from safetensors.torch import save_file

    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(plain))
    with pytest.raises(FormatError, match="not a cubepack KV file"):
        read_kv_header(plain)


def test_quantized_cache_is_refused(models, tmp_path):
    from transformers.cache_utils import QuantizedLayer

    class IdentityQuantizedLayer(QuantizedLayer):  # a real QuantizedLayer, trivial codec
        def _quantize(self, tensor, axis):
            return tensor

        def _dequantize(self, q_tensor):
            return q_tensor

    cache = build_cache(models["a"], torch.tensor([[5, 6, 7]]))
    quantized = IdentityQuantizedLayer.__new__(IdentityQuantizedLayer)
    quantized.__dict__.update(cache.layers[0].__dict__)
    cache.layers[0] = quantized
    target = tmp_path / "q.kv.safetensors"
    with pytest.raises(UnsupportedError, match="QuantizedLayer"):
        cubepack.save_kv_cache(cache, target, producer=models["a"])
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_saving_with_the_wrong_producer_is_refused(models, tmp_path):
    cache = build_cache(models["a"], torch.tensor([[5, 6, 7]]))
    with pytest.raises(IdentityMismatch, match="geometry.num_layers: expected 3, found 2"):
        cubepack.save_kv_cache(cache, tmp_path / "x.kv.safetensors", producer=models["deep"])
    with pytest.raises(IdentityMismatch, match=r"\(kv_dtype: expected bfloat16, found float32\)"):
        cubepack.save_kv_cache(cache, tmp_path / "x.kv.safetensors", producer=models["a_as_bf16"])
    assert list(tmp_path.iterdir()) == []


def test_save_replaces_atomically_and_leaves_no_temp_files(models, a_file, tmp_path):
    cache = build_cache(models["a"], torch.tensor([[5, 6, 7]]))
    target = tmp_path / "item.kv.safetensors"
    cubepack.save_kv_cache(cache, target, producer=models["a"])
    with pytest.raises(cubepack.CubepackError, match="JSON-serialisable"):
        cubepack.save_kv_cache(cache, target, producer=models["a"], metadata={"x": object()})
    assert [p.name for p in tmp_path.iterdir()] == ["item.kv.safetensors"]
    assert read_kv_header(target).token_count == 3


def test_a_format_1_file_is_read_refused_for_loading_and_upgraded_by_its_producer(
        models, zoo, a_file, tmp_path, capsys):
    from cubepack.cli import main
    from cubepack.ops import upgrade

    old = as_format_1(a_file[0], tmp_path / "old.kv.safetensors", zoo["a"] / "tokenizer.json")
    assert read_kv_header(old).version == 1  # still readable (inspect)
    with pytest.raises(FormatError, match=r"KV format version 1.*cubepack upgrade .* --model"):
        cubepack.load_kv_cache(old, models["a"])
    with pytest.raises(IdentityMismatch, match="weights_digest"):
        upgrade(old, zoo["b"])
    assert main(["upgrade", str(old), "--model", str(zoo["a"])]) == 0
    assert "upgraded 1 file(s)" in capsys.readouterr().out
    loaded = cubepack.load_kv_cache(old, models["a"])
    assert all_equal(continue_greedy(models["a"], a_file[1], 20, 4),
                     continue_greedy(models["a"], loaded, 20, 4))
    assert read_kv_header(old).metadata == read_kv_header(a_file[0]).metadata


def test_a_loaded_cache_is_views_of_one_private_map_of_the_file(models, a_file):
    path, original = a_file
    before = path.read_bytes()
    loaded = cubepack.load_kv_cache(path, models["a"])
    tensors = [t for layer in loaded.layers for t in (layer.keys, layer.values)]
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    assert len(storages) == 1  # zero-copy: every tensor a view of the one mapping
    assert tensors[0].untyped_storage().nbytes() == len(before)
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(loaded.layers, original.layers))
    loaded.layers[0].keys.add_(1)  # copy on write: the file never changes
    assert path.read_bytes() == before


def test_layers_are_initialised_as_their_own_first_update_does():
    from cubepack.kv._torch import _initialise

    calls = []

    class Four:  # transformers 4.x: lazy_initialization(key_states)
        def lazy_initialization(self, key_states):
            calls.append(("4", key_states))

    class Five:  # transformers 5.x: lazy_initialization(key_states, value_states)
        def lazy_initialization(self, key_states, value_states):
            calls.append(("5", key_states, value_states))

    class Older:  # no lazy_initialization: an update that appends nothing
        def update(self, keys, values):
            calls.append(("update", tuple(keys.shape), tuple(values.shape)))

    keys, values = torch.zeros(1, 2, 3, 4), torch.ones(1, 2, 3, 4)
    for layer in (Four(), Five(), Older()):
        _initialise(layer, keys, values)
    assert calls[0] == ("4", keys) and calls[1] == ("5", keys, values)
    assert calls[2] == ("update", (1, 2, 0, 4), (1, 2, 0, 4))


def test_a_saved_file_holds_exactly_the_bytes_safetensors_writes(models, a_file):
    from safetensors.torch import save

    path, original = a_file
    tensors = {f"layers.{i}.{part}": getattr(layer, part)
               for i, layer in enumerate(original.layers) for part in ("keys", "values")}
    metadata = read_kv_header(path).header.metadata
    assert path.read_bytes() == save(tensors, metadata=metadata)


@pytest.mark.parametrize("source", ["memory", "file"])
@pytest.mark.parametrize("sizes", [[3] * 7, [2 * 1024 * 1024 + 5, 7, 3 * 1024 * 1024], [0, 5]])
def test_writes_end_on_2_mib_boundaries_and_lose_no_byte(tmp_path, monkeypatch, sizes, source):
    """Tensors from memory, or left in another file in scattered pieces: the bytes safetensors
    writes, every write ending short of or on a 2 MiB boundary, short writes and short reads
    of the other file included."""
    import os

    from safetensors.torch import save

    from cubepack._util import safetensors_header

    ends, real_write, real_read = [], os.pwritev, os.preadv

    def recorded_write(descriptor, pieces, offset):
        written = real_write(descriptor, pieces[:1] if len(pieces) > 2 else pieces, offset)
        ends.append(offset + written)  # short writes too
        return written

    def short_read(descriptor, views, at):
        return real_read(descriptor, [views[0][:1_000_003]], at)

    monkeypatch.setattr(safetensors_header.os, "pwritev", recorded_write)
    monkeypatch.setattr(safetensors_header.os, "preadv", short_read)
    tensors = {f"t{i}": torch.arange(size, dtype=torch.uint8) for i, size in enumerate(sizes)}
    with open(tmp_path / "other", "w+b") as other:
        stored = []
        for name, tensor in tensors.items():
            if source == "memory":
                stored.append((name, "U8", tuple(tensor.shape), tensor.numpy()))
                continue
            data, pieces = tensor.numpy().tobytes(), []
            for part in (data[: len(data) // 3], data[len(data) // 3:]):  # apart, a gap between
                other.seek(0, os.SEEK_END)
                other.write(b"gap")
                pieces.append((other.tell(), len(part)))
                other.write(part)
            other.flush()
            stored.append((name, "U8", tuple(tensor.shape), safetensors_header.FileBytes(
                other.fileno(), tuple(pieces), "other")))
        safetensors_header.write_safetensors(tmp_path / "f", stored, {"k": "v"})
    assert (tmp_path / "f").read_bytes() == save(tensors, metadata={"k": "v"})
    boundaries = [end for end in ends if end % (2 * 1024 * 1024) == 0]  # no write spans one
    assert len(boundaries) == (tmp_path / "f").stat().st_size // (2 * 1024 * 1024)


def test_a_file_that_ends_before_its_pieces_is_a_format_error(tmp_path):
    from cubepack._util import safetensors_header

    (tmp_path / "other").write_bytes(bytes(100))
    with open(tmp_path / "other", "rb") as other:
        pieces = safetensors_header.FileBytes(other.fileno(), ((0, 60), (60, 80)), "other")
        with pytest.raises(FormatError, match=r"other changed while cubepack read it \(it ended "
                                              r"before byte 140\)"):
            safetensors_header.write_safetensors(tmp_path / "f", [("t", "U8", (140,), pieces)], {})
