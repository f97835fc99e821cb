"""Model fingerprints: stable for the same model, different for anything a cache depends on."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import cubepack
from cubepack import _hashing as hashing
from cubepack.testing import tiny
from cubepack.fingerprints import fingerprint, hub_origin


def test_same_model_saved_and_reloaded_has_the_same_strict_fields(models, zoo, tmp_path):
    resaved = tmp_path / "resaved"
    models["a"].save_pretrained(resaved)
    tiny.build_tokenizer().save_pretrained(resaved)
    reloaded = tiny.load(resaved)
    assert fingerprint(reloaded).strict() == fingerprint(models["a"]).strict()
    assert fingerprint(zoo["a"]).strict() == fingerprint(models["a"]).strict()


def test_fp32_and_bf16_fingerprints_differ(models, zoo):
    fp32, bf16 = fingerprint(models["a"]), fingerprint(models["a_as_bf16"])
    assert (fp32.dtype, bf16.dtype) == ("float32", "bfloat16")
    assert fp32.weights_digest == bf16.weights_digest  # same files, run in another dtype
    assert fingerprint(zoo["a_bf16"]).dtype == "bfloat16"  # stored in bf16
    assert fingerprint(zoo["a"], dtype="bfloat16").strict() == bf16.strict()


def test_models_a_and_b_differ_only_in_weights(models):
    a, b = fingerprint(models["a"]), fingerprint(models["b"])
    assert a.weights_digest != b.weights_digest
    assert {k: v for k, v in a.strict().items() if k != "weights_digest"} == \
        {k: v for k, v in b.strict().items() if k != "weights_digest"}


def test_geometry_records_layer_types_and_window(models):
    geometry = fingerprint(models["hybrid"]).geometry
    assert geometry["layer_types"] == ["sliding_attention", "full_attention"]
    assert geometry["sliding_window"] == 4
    assert (geometry["num_layers"], geometry["num_kv_heads"], geometry["head_dim"]) == (2, 2, 16)
    assert fingerprint(models["a"]).geometry["sliding_window"] is None


def test_model_built_in_memory_gets_a_marked_state_dict_digest():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny.llama_config())
    identity = fingerprint(model)
    assert identity.weights_digest.startswith("state-dict-sha256:")
    assert identity.tokenizer_digest is None
    assert fingerprint(model, tokenizer=tiny.build_tokenizer()).tokenizer_digest.startswith("sha256:")


def test_second_fingerprint_of_unchanged_files_reads_no_bytes(zoo, tmp_path, monkeypatch):
    copy = tmp_path / "copy"
    shutil.copytree(zoo["a"], copy)
    first = fingerprint(copy)
    calls = []
    real = hashing.sha256_file
    monkeypatch.setattr(hashing, "sha256_file", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert fingerprint(copy) == first
    assert calls == []
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))  # new mtime and content: must be re-hashed
    assert fingerprint(copy).weights_digest != first.weights_digest
    assert len(calls) == 1


def test_hub_cache_snapshot_gives_repo_id_and_commit_without_hashing(zoo, tmp_path, monkeypatch):
    """A folder laid out as the HF cache lays it out: blobs named by sha256, snapshot symlinks."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--tiny-org--model-a"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for source in zoo["a"].iterdir():
        digest = hashing.sha256_file(source)
        blob = repo / "blobs" / digest
        shutil.copyfile(source, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / source.name)
    assert hub_origin(snapshot) == ("tiny-org/model-a", commit)
    monkeypatch.setattr(hashing, "sha256_file", lambda *a, **k: pytest.fail("hashed a Hub blob"))
    identity = fingerprint(snapshot)
    monkeypatch.undo()
    assert (identity.model_id, identity.revision) == ("tiny-org/model-a", commit)
    assert identity.weights_digest == fingerprint(zoo["a"]).weights_digest


def test_unknown_inputs_are_clear_errors(tmp_path):
    with pytest.raises(cubepack.ModelNotFoundError, match="does not exist"):
        fingerprint(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(cubepack.FormatError, match="no config.json"):
        fingerprint(tmp_path / "empty")
    with pytest.raises(cubepack.CubepackError, match="Cannot fingerprint a int"):
        fingerprint(42)


def test_unknown_hub_id_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # set after import: cubepack still honours it
    with pytest.raises(cubepack.ModelNotFoundError, match="not in the Hugging Face cache"):
        fingerprint("nobody/nothing")
