"""Model fingerprints: stable for the same model, different for anything a cache depends on."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

import cubepack
from cubepack._util import hashing
from cubepack.identity import fingerprint
from cubepack.identity._fingerprint import hub_origin
from cubepack.testing import tiny


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


def _hub_cache_copy(zoo, tmp_path, commit="0123456789abcdef0123456789abcdef01234567"):
    """Model A laid out as the HF cache lays it out: blobs named by sha256, snapshot symlinks."""
    repo = tmp_path / "hub" / "models--tiny-org--model-a"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for source in zoo["a"].iterdir():
        blob = repo / "blobs" / hashing.sha256_file(source)
        shutil.copyfile(source, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / source.name)
    return snapshot, commit


def test_hub_cache_snapshot_is_hashed_once_then_remembered(zoo, tmp_path, monkeypatch):
    snapshot, commit = _hub_cache_copy(zoo, tmp_path)
    assert hub_origin(snapshot) == ("tiny-org/model-a", commit)
    identity = fingerprint(snapshot)
    assert (identity.model_id, identity.revision) == ("tiny-org/model-a", commit)
    assert identity.weights_digest == fingerprint(zoo["a"]).weights_digest
    monkeypatch.setattr(hashing, "sha256_file", lambda *a, **k: pytest.fail("hashed again"))
    assert fingerprint(snapshot) == identity


def test_a_same_size_corrupted_blob_is_refused_naming_the_file(zoo, tmp_path):
    snapshot, commit = _hub_cache_copy(zoo, tmp_path, "1" * 40)
    blob = (snapshot / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: the Hub client would accept it
    blob.write_bytes(bytes(data))
    with pytest.raises(cubepack.IntegrityError) as caught:
        fingerprint(snapshot)
    message = str(caught.value)
    assert "model.safetensors" in message and str(blob) in message
    assert f"hf download tiny-org/model-a --revision {commit} --force-download" in message


def test_an_edit_in_place_that_restores_the_mtime_is_seen(zoo, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(zoo["a"], copy)
    first = fingerprint(copy).weights_digest
    weights = copy / "model.safetensors"
    stat = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    with open(weights, "r+b") as handle:  # same inode, same size
        handle.write(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # mtime set back; ctime moves
    assert weights.stat().st_mtime_ns == stat.st_mtime_ns
    assert fingerprint(copy).weights_digest != first


def test_unknown_inputs_are_clear_errors(tmp_path):
    with pytest.raises(cubepack.ModelNotFoundError, match="is neither a folder"):
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


def test_load_time_overrides_count_and_are_named(zoo, models, tmp_path):
    """from_pretrained(..., <config kwarg>) changes the model without touching config.json."""
    from cubepack._util.models import load_causal_lm

    from helpers import build_cache

    cache = build_cache(models["a"], torch.tensor([[5, 6, 7]]))
    path = cubepack.save_kv_cache(cache, tmp_path / "a.kv.safetensors", producer=models["a"])
    edited = load_causal_lm(zoo["a"], attn_implementation="eager", rms_norm_eps=1e-2)
    with pytest.raises(cubepack.IdentityMismatch) as caught:
        cubepack.load_kv_cache(path, edited)
    assert caught.value.fields == ["compute_config.rms_norm_eps"]
    assert "compute_config.rms_norm_eps: expected 1e-06, found 0.01" in str(caught.value)
    assert fingerprint(zoo["a"]).strict() == fingerprint(models["a"]).strict()


def test_rope_is_one_canonical_form_whatever_the_transformers_major():
    from cubepack.identity._config_fields import compute_config

    old = {"rope_theta": 1e6, "rope_scaling": {"type": "linear", "factor": 2.0}, "x": 1}
    new = {"rope_parameters": {"rope_theta": 1000000.0, "rope_type": "linear", "factor": 2.0},
           "x": 1}
    assert compute_config(old) == compute_config(new) == {
        "x": 1, "rope_theta": 1e6, "rope_type": "linear", "rope_scaling": {"factor": 2.0}}
    plain_old = compute_config({"rope_theta": 10000.0, "rope_scaling": None})
    assert plain_old == compute_config({"rope_parameters": {"rope_theta": 10000.0,
                                                            "rope_type": "default"}})


def _tokenizer_variant(zoo, tmp_path, name, edit_json=None, edit_config=None):
    folder = tmp_path / name
    shutil.copytree(zoo["a"], folder)
    if edit_json:
        path = folder / "tokenizer.json"
        path.write_text(json.dumps(edit_json(json.loads(path.read_text()))))
    if edit_config:
        path = folder / "tokenizer_config.json"
        path.write_text(json.dumps(edit_config(json.loads(path.read_text()))))
    return folder


def test_a_post_processor_that_adds_bos_changes_the_tokenizer_digest(zoo, tmp_path):
    def add_bos(document):
        document["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0],
                                                 "tokens": ["<|endoftext|>"]}}}
        return document

    def offsets_only(document):  # a post-processor that changes offsets, not ids
        document["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False,
                                      "trim_offsets": True, "use_regex": True}
        return document

    base = fingerprint(zoo["a"]).tokenizer_digest
    assert fingerprint(_tokenizer_variant(zoo, tmp_path, "bos", add_bos)).tokenizer_digest != base
    assert fingerprint(_tokenizer_variant(zoo, tmp_path, "off", offsets_only)).tokenizer_digest \
        == base


def test_chat_template_and_special_tokens_are_a_warning_not_a_refusal(zoo, models, tmp_path,
                                                                      caplog):
    import logging

    from helpers import build_cache

    cache = build_cache(models["a"], torch.tensor([[5, 6, 7]]))
    path = cubepack.save_kv_cache(cache, tmp_path / "a.kv.safetensors", producer=models["a"])
    variant = _tokenizer_variant(zoo, tmp_path, "eos",
                                 edit_config=lambda c: dict(c, eos_token="<|pad|>"))
    (variant / "chat_template.jinja").write_text("{{ messages }}")
    a, edited = fingerprint(zoo["a"]), fingerprint(variant)
    assert edited.strict() == a.strict() and edited.prompt_format_digest != a.prompt_format_digest
    with caplog.at_level(logging.WARNING, logger="cubepack"):
        loaded = cubepack.load_kv_cache(path, tiny.load(variant))
    assert loaded.get_seq_length() == 3
    assert any("chat template or special tokens differ" in r.getMessage() for r in caplog.records)
