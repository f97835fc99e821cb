"""KV format 3 (#30 item 4): every tensor's bytes and the header itself carry an XXH3-64
checksum, and every path that reads a KV file's tensors refuses one whose bytes changed with an
IntegrityError naming the tensor. Format-2 files still load, unchecked, and say so.

The paths were found by grepping for every reader of a KV file's tensors (``mapped_layers``,
``read_kv_header``, ``safe_open``/``mx.load``): ``load_kv_cache`` (and its policy wrapper, with
and without a recomputation), the MLX export and import (torch-free conversions), the llama.cpp
export, ``pack`` and ``verify``; the MemOS hook and the MLX load run in their own environments
(tests/memos/test_memos_checksums.py, tests/mlx/test_mlx.py)."""

from __future__ import annotations

import logging
import struct

import pytest
import torch
import xxhash

import cubepack
from cubepack import CubepackError, FormatError, IntegrityError, VerificationFailed
from cubepack._util.safetensors_header import read_header
from cubepack.kv import _checksum, read_kv_header

from helpers import as_format_2, build_cache, flip_tensor_byte

TENSORS = [f"layers.{i}.{part}" for i in range(2) for part in ("keys", "values")]


@pytest.fixture(scope="module")
def kv_file(models, tmp_path_factory):
    from data import PROMPT

    ids = torch.tensor([PROMPT])
    path = tmp_path_factory.mktemp("checksums") / "a.kv.safetensors"
    return cubepack.save_kv_cache(build_cache(models["a"], ids), path, producer=models["a"],
                                  token_ids=ids, metadata={"id": "item-1"})


def flipped(kv_file, tmp_path, name, at=0.5):
    return flip_tensor_byte(kv_file, name, tmp_path / "flipped.kv.safetensors", at=at)


def test_the_header_records_the_xxh3_of_each_tensors_stored_bytes(kv_file):
    info = read_kv_header(kv_file)
    header, raw = read_header(kv_file), kv_file.read_bytes()
    assert info.version == 3 and sorted(info.checksums) == sorted(TENSORS)
    for name in TENSORS:
        tensor = header.tensors[name]
        data = raw[header.data_offset + tensor.begin:header.data_offset + tensor.end]
        assert info.checksums[name] == xxhash.xxh3_64_hexdigest(data)
    record = info.to_dict()["checksums"]
    assert record["algorithm"] == "xxh3-64"  # named, so it can change in a later version


def _load(path, models, tmp_path):
    return cubepack.load_kv_cache(path, models["a"])


def _load_copy(path, models, tmp_path):
    return cubepack.load_kv_cache(path, models["a"], copy=True)


def _load_recompute(path, models, tmp_path):  # the policy wrapper, proving with the model
    return cubepack.load_kv_cache(path, models["a"], recompute=True)


def _kv_load(path, models, tmp_path):  # the policy-free loader under the wrapper
    from cubepack.kv._load import load_kv_cache

    return load_kv_cache(path, models["a"])


def _recompute(path, models, tmp_path):
    from cubepack.kv._recompute import recompute

    return recompute(models["a"], read_kv_header(path), "item-1")


def _export_mlx(path, models, tmp_path):
    from cubepack.mlx import export_prompt_cache

    return export_prompt_cache(path, tmp_path / "prompt.safetensors")


def _export_llamacpp(path, models, tmp_path):
    from cubepack.llamacpp._convert import state_bytes

    return state_bytes(path, v_trans=True)


PATHS = {"load_kv_cache": _load, "load_kv_cache copy": _load_copy,
         "load_kv_cache recompute": _load_recompute, "kv._load": _kv_load,
         "recompute": _recompute, "export mlx": _export_mlx,
         "export llamacpp": _export_llamacpp}


@pytest.mark.parametrize("tensor", TENSORS)
@pytest.mark.parametrize("path", PATHS)
def test_a_flipped_byte_in_any_tensor_is_refused_by_every_path_naming_it(kv_file, models,
                                                                        tmp_path, path, tensor):
    bad = flipped(kv_file, tmp_path, tensor)
    with pytest.raises(IntegrityError, match=rf"tensor {tensor} \(layer") as caught:
        PATHS[path](bad, models, tmp_path)
    assert caught.value.tensor == tensor
    assert "expected" in str(caught.value) and "Pull the cube again" in str(caught.value)
    assert not (tmp_path / "prompt.safetensors").exists()  # nothing half-written


@pytest.mark.parametrize("at", [0.0, 1.0])
def test_the_first_and_last_byte_of_a_tensor_are_covered(kv_file, models, tmp_path, at):
    bad = flipped(kv_file, tmp_path, "layers.1.values", at=at)
    with pytest.raises(IntegrityError, match=r"layers\.1\.values"):
        cubepack.load_kv_cache(bad, models["a"])


def test_every_flipped_header_byte_is_refused(kv_file, tmp_path):
    """Each bit-0 flip of every byte from the length prefix to the end of the header (padding
    included) is refused by the reader, before a tensor is touched: the safetensors structure,
    the strict JSON, or the header's own checksum catches it."""
    raw = kv_file.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    target = tmp_path / "header.kv.safetensors"
    outcomes = set()
    for offset in range(8 + length):
        changed = bytearray(raw)
        changed[offset] ^= 0x01
        target.write_bytes(bytes(changed))
        with pytest.raises(CubepackError) as caught:
            info = read_kv_header(target)
            _checksum.verify_file(target, info.checksums,
                                  _checksum.kv_file_pieces(info.header, info.tensor_names))
        outcomes.add(type(caught.value).__name__)
    assert "IntegrityError" in outcomes  # a change that still parses: the header's checksum


def test_a_changed_checksum_in_the_header_is_refused_as_the_header(kv_file, models, tmp_path):
    from helpers import rewrite_kv_metadata

    def change(meta):
        digest = meta["checksums"]["tensors"]["layers.0.keys"]
        meta["checksums"]["tensors"]["layers.0.keys"] = \
            digest[:-1] + ("0" if digest[-1] != "0" else "1")

    bad = rewrite_kv_metadata(kv_file, tmp_path / "bad.kv.safetensors", change, reseal=False)
    with pytest.raises(IntegrityError, match="its header does not match"):
        read_kv_header(bad)
    # resealed (anyone editing a header can): then the tensor's bytes disagree with it
    resealed = rewrite_kv_metadata(kv_file, tmp_path / "resealed.kv.safetensors", change)
    with pytest.raises(IntegrityError, match=r"tensor layers\.0\.keys"):
        cubepack.load_kv_cache(resealed, models["a"])


def test_an_unknown_algorithm_is_refused_naming_it(kv_file, tmp_path):
    from helpers import rewrite_kv_metadata

    bad = rewrite_kv_metadata(kv_file, tmp_path / "crc.kv.safetensors",
                              lambda meta: meta["checksums"].update(algorithm="crc32c"))
    with pytest.raises(FormatError, match="'crc32c'; this cubepack checks 'xxh3-64'"):
        read_kv_header(bad)


def test_a_format_3_file_without_checksums_or_a_format_2_file_with_them_is_refused(kv_file,
                                                                                 tmp_path):
    from helpers import rewrite_kv_metadata

    stripped = rewrite_kv_metadata(kv_file, tmp_path / "stripped.kv.safetensors",
                                   lambda meta: meta.pop("checksums"))
    with pytest.raises(FormatError, match="requires a 'checksums' record"):
        read_kv_header(stripped)
    lowered = rewrite_kv_metadata(kv_file, tmp_path / "lowered.kv.safetensors",
                                  lambda meta: meta.update(version=2))
    with pytest.raises(FormatError, match="version 2, which carries no checksums"):
        read_kv_header(lowered)


def test_a_format_2_file_loads_unchecked_says_so_and_upgrade_adds_the_checksums(
        kv_file, models, zoo, tmp_path, caplog, capsys):
    from cubepack.cli import main

    old = as_format_2(kv_file, tmp_path / "old.kv.safetensors")
    info = read_kv_header(old)
    assert info.version == 2 and info.checksums is None and info.to_dict()["checksums"] is None
    with caplog.at_level(logging.WARNING, logger="cubepack"):
        loaded = cubepack.load_kv_cache(old, models["a"])
    assert loaded.get_seq_length() == info.token_count
    [message] = [r.getMessage() for r in caplog.records if "checksums" in r.getMessage()]
    assert "no per-tensor checksums (format v2)" in message and "cubepack upgrade" in message
    flip_tensor_byte(old, "layers.0.keys")  # unchecked: a format-2 file cannot tell
    cubepack.load_kv_cache(old, models["a"])
    assert main(["upgrade", str(old), "--model", str(zoo["a"])]) == 0
    assert "upgraded 1 file(s)" in capsys.readouterr().out
    upgraded = read_kv_header(old)
    assert upgraded.version == 3 and upgraded.producer == info.producer
    original = read_kv_header(kv_file).checksums  # the bytes as they were at the upgrade:
    assert {n for n in TENSORS if upgraded.checksums[n] != original[n]} == {"layers.0.keys"}
    cubepack.load_kv_cache(old, models["a"])
    flip_tensor_byte(old, "layers.1.keys")
    with pytest.raises(IntegrityError, match=r"layers\.1\.keys"):
        cubepack.load_kv_cache(old, models["a"])


def test_upgrading_a_format_2_file_with_another_model_is_refused(kv_file, zoo, tmp_path):
    from cubepack.ops import upgrade

    old = as_format_2(kv_file, tmp_path / "old.kv.safetensors")
    before = old.read_bytes()
    with pytest.raises(cubepack.IdentityMismatch, match="weights_digest"):
        upgrade(old, zoo["b"])
    assert old.read_bytes() == before


def test_inspect_shows_the_checksums(kv_file, tmp_path, capsys):
    from cubepack.cli import main

    assert main(["inspect", str(kv_file)]) == 0
    assert "checksums:   xxh3-64, 4 tensors" in capsys.readouterr().out
    assert main(["inspect", str(as_format_2(kv_file, tmp_path / "old.kv.safetensors"))]) == 0
    assert "checksums:   none (format v2)" in capsys.readouterr().out


# --- MLX prompt caches carry the record: import checks it --------------------------------------

@pytest.mark.parametrize("tensor", TENSORS)
def test_an_exported_prompt_cache_with_a_flipped_byte_is_refused_at_import(kv_file, zoo,
                                                                          tmp_path, tensor):
    from cubepack.mlx import export_prompt_cache, import_prompt_cache

    prompt = export_prompt_cache(kv_file, tmp_path / "prompt.safetensors")
    index, part = tensor.split(".")[1], {"keys": "0", "values": "1"}[tensor.split(".")[2]]
    flip_tensor_byte(prompt, f"{index}.{part}")
    with pytest.raises(IntegrityError, match=rf"tensor {tensor} \(layer"):
        import_prompt_cache(prompt, zoo["a"], out=tmp_path / "back.kv.safetensors")
    assert not (tmp_path / "back.kv.safetensors").exists()


def test_an_exported_prompt_cache_imports_back_to_the_same_checksums(kv_file, zoo, tmp_path):
    from cubepack.mlx import export_prompt_cache, import_prompt_cache

    prompt = export_prompt_cache(kv_file, tmp_path / "prompt.safetensors")
    back = import_prompt_cache(prompt, zoo["a"], out=tmp_path / "back.kv.safetensors")
    assert read_kv_header(back).checksums == read_kv_header(kv_file).checksums


# --- a cube: pack refuses to seal changed bytes; verify refuses them by the lock's sha256 ----

ITEM = "activations/item-1.kv.safetensors"


@pytest.mark.parametrize("tensor", TENSORS)
def test_verify_refuses_the_changed_tensor_and_pack_refuses_to_seal_it(cube, tensor):
    report = cubepack.verify(cube)
    [check] = [c for c in report.checks if c.name == "kv checksums" and "item-1" in c.subject]
    assert check.ok is True and "match their xxh3-64 checksums" in check.detail
    flip_tensor_byte(cube / ITEM, tensor)
    with pytest.raises(VerificationFailed) as caught:
        cubepack.verify(cube)
    failed = {c.name for c in caught.value.report.failures}
    assert failed == {"sha256"}  # the lock's hash; a file whose hash failed is never parsed
    with pytest.raises(IntegrityError, match=rf"tensor {tensor}"):
        cubepack.pack(cube)


def test_verify_reports_a_format_2_cube_as_unchecked(cube):
    from adversarial import relock_file

    for path in sorted((cube / "activations").glob("*.kv.safetensors")):
        as_format_2(path, path)
        relock_file(cube, path.relative_to(cube).as_posix())
    report = cubepack.verify(cube)
    checks = [c for c in report.checks if c.name == "kv checksums"]
    assert checks and all(c.ok is None and "no per-tensor checksums (format v2)" in c.detail
                          for c in checks)


def test_the_pool_hashes_large_caches_across_threads_with_the_same_result():
    """Above PARALLEL_BYTES the tensors are hashed on the pool (the hash releases the GIL):
    the digests are the serial ones."""
    pieces = {f"t{i}": [bytes([i]) * (_checksum.PARALLEL_BYTES // 2)] for i in range(4)}
    assert _checksum.compute(pieces) == {name: _checksum.digest(data)
                                         for name, data in pieces.items()}
