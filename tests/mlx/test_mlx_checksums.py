"""The MLX load checks a KV file's (or a cubepack prompt cache's) per-tensor checksums by
default (#30 item 4): one flipped byte in any tensor is an IntegrityError naming it, nothing
loaded; a prompt cache MLX saves records the checksums of the bytes it wrote."""

from __future__ import annotations

import logging

import pytest
import torch

import cubepack
import cubepack.mlx
from cubepack import IntegrityError

from helpers import as_format_2, build_cache, flip_tensor_byte

IDS = [1, 17, 42, 7, 99, 5, 300, 12]
TENSORS = [f"layers.{i}.{part}" for i in range(2) for part in ("keys", "values")]


@pytest.fixture(scope="module")
def mlx_kv(mlx_models, tmp_path_factory):
    """A cache MLX built and saved (its runtime: no recomputation at load), and its KV file."""
    from cubepack.mlx._runtime import MLXRuntime

    folder = tmp_path_factory.mktemp("mlx-checksums")
    made = MLXRuntime(mlx_models["a"]).prefill_layers(IDS)
    from cubepack.kv._torch import write_kv_layers

    kv = write_kv_layers(made, folder / "m.kv.safetensors",
                         producer=cubepack.mlx.model_identity(mlx_models["a"]), token_ids=IDS,
                         metadata={"runtime": "mlx-lm 0.32.2"})
    caches = cubepack.mlx.load_prompt_cache(kv, mlx_models["a"])
    prompt = cubepack.mlx.save_prompt_cache(folder / "p.safetensors", caches, mlx_models["a"],
                                            token_ids=IDS)
    return kv, prompt


@pytest.mark.parametrize("tensor", TENSORS)
def test_a_flipped_byte_in_a_kv_file_is_refused_by_the_mlx_load(mlx_kv, mlx_models, tmp_path,
                                                                tensor):
    bad = flip_tensor_byte(mlx_kv[0], tensor, tmp_path / "bad.kv.safetensors")
    with pytest.raises(IntegrityError, match=rf"tensor {tensor} \(layer"):
        cubepack.mlx.load_prompt_cache(bad, mlx_models["a"])


@pytest.mark.parametrize("tensor", TENSORS)
def test_a_flipped_byte_in_a_saved_prompt_cache_is_refused_by_the_mlx_load(
        mlx_kv, mlx_models, tmp_path, tensor):
    _, prompt = mlx_kv
    assert len(cubepack.mlx.load_prompt_cache(prompt, mlx_models["a"])) == 2  # honest: loads
    index, part = tensor.split(".")[1], {"keys": "0", "values": "1"}[tensor.split(".")[2]]
    bad = flip_tensor_byte(prompt, f"{index}.{part}", tmp_path / "bad.safetensors")
    with pytest.raises(IntegrityError, match=rf"tensor {tensor} \(layer"):
        cubepack.mlx.load_prompt_cache(bad, mlx_models["a"])


def test_a_prompt_cache_mlx_saves_imports_to_the_kv_files_checksums(mlx_kv, zoo, tmp_path):
    kv, prompt = mlx_kv
    back = cubepack.mlx.import_prompt_cache(prompt, zoo["a"], out=tmp_path / "b.kv.safetensors")
    assert cubepack.read_kv_header(back).checksums == cubepack.read_kv_header(kv).checksums


def test_a_format_2_kv_file_loads_into_mlx_unchecked_and_says_so(mlx_kv, mlx_models, tmp_path,
                                                                caplog):
    old = as_format_2(mlx_kv[0], tmp_path / "old.kv.safetensors")
    with caplog.at_level(logging.WARNING, logger="cubepack"):
        assert len(cubepack.mlx.load_prompt_cache(old, mlx_models["a"])) == 2
    assert any("no per-tensor checksums (format v2)" in r.getMessage() for r in caplog.records)


def test_a_transformers_cache_with_a_flipped_byte_is_refused_before_mlx_recomputes(
        models, mlx_models, tmp_path):
    kv = cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([IDS])),
                                tmp_path / "t.kv.safetensors", producer=models["a"], token_ids=IDS)
    flip_tensor_byte(kv, "layers.1.values")
    with pytest.raises(IntegrityError, match=r"layers\.1\.values"):
        cubepack.mlx.load_prompt_cache(kv, mlx_models["a"])
