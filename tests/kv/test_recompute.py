"""Proof by recomputation: the live model must reproduce a cube's KV caches.

A header and a lock are claims; these tests alter what a claim cannot show (the values), and
require ``verify --recompute`` to refuse, naming the first layer and position that differ,
while honest caches (fp32, bf16, sliding windows, prefixes) pass.
"""

from __future__ import annotations

import json

import pytest
import torch

import cubepack
from cubepack._util import constants
from cubepack.kv import read_kv_header
from cubepack.kv._torch import cache_layers, write_kv_layers

from data import PROMPT
from helpers import build_cache, reseal_lock

ITEM = "activations/item-1.kv.safetensors"


def cube_with(tmp_path, zoo, model, *, cache=None, ids=PROMPT, name="cube", producer=None):
    """A packed cube holding one activation with its token ids, built by ``model`` (or the
    given ``cache``, labelled as ``producer``'s)."""
    from memos_format import memos_config

    cube = tmp_path / name
    tensor_ids = torch.tensor([ids])
    cache = cache if cache is not None else build_cache(model, tensor_ids)
    producer = producer or cubepack.fingerprint(model)
    write_kv_layers(cache_layers(cache), cube / ITEM, producer=producer, token_ids=tensor_ids,
                    metadata={"id": "item-1"})
    (cube / "config.json").write_text(json.dumps(memos_config(str(zoo["a"]))))
    cubepack.pack(cube, model=model)
    return cube


def relock(cube):
    from cubepack._util import hashing

    digest, size = hashing.sha256_file(cube / ITEM), (cube / ITEM).stat().st_size

    def change(lock):
        lock["files"][ITEM] = {"sha256": digest, "size": size}
        lock["activations"]["item-1"]["sha256"] = digest
    reseal_lock(cube, change)


def checks(report, name):
    return [c for c in report.checks if c.name == name]


def test_an_honest_cache_is_reproduced_and_the_report_says_how_closely(tmp_path, zoo, models):
    cube = cube_with(tmp_path, zoo, models["a"])
    report = cubepack.verify(cube, model=models["a"], recompute=True)
    [check] = checks(report, "recompute")
    assert check.ok and f"recomputed {len(PROMPT)} positions" in check.detail
    assert check.found["max_rel_error"] <= 1e-4
    prefix = cubepack.verify(cube, model=str(zoo["a"]), recompute=3)
    assert "recomputed 3 positions" in checks(prefix, "recompute")[0].detail


def test_poisoned_values_under_a_correct_header_are_refused_at_the_first_difference(
        tmp_path, zoo, models):
    from safetensors.torch import load_file, save_file

    cube = cube_with(tmp_path, zoo, models["a"])
    path = cube / ITEM
    tensors = load_file(str(path))
    metadata = read_kv_header(path).header.metadata
    tensors["layers.1.values"][:, :, 6, :] += 0.5  # one position of one layer, nudged
    save_file(tensors, str(path), metadata=metadata)
    relock(cube)
    assert cubepack.verify(cube, model=str(zoo["a"])).ok  # every claim still holds
    with pytest.raises(cubepack.VerificationFailed) as caught:
        cubepack.verify(cube, model=models["a"], recompute=True)
    [check] = [c for c in caught.value.failures if c.name == "recompute"]
    assert "layer 1, position 6 (values)" in check.detail


def test_another_models_cache_relabelled_is_refused(tmp_path, zoo, models):
    cache_b = build_cache(models["b"], torch.tensor([PROMPT]))
    cube = cube_with(tmp_path, zoo, models["a"], cache=cache_b,
                     producer=cubepack.fingerprint(models["a"]))
    with pytest.raises(cubepack.VerificationFailed, match=r"layer 0, position 0 \(keys\)"):
        cubepack.verify(cube, model=models["a"], recompute=True)


def test_a_cache_built_at_shifted_positions_is_refused(tmp_path, zoo, models):
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        shifted = models["a"](ids, position_ids=torch.arange(3, 3 + len(PROMPT))[None],
                              use_cache=True).past_key_values
    cube = cube_with(tmp_path, zoo, models["a"], cache=shifted)
    with pytest.raises(cubepack.VerificationFailed, match=r"layer 0, position \d+ \(keys\)"):
        cubepack.verify(cube, model=models["a"], recompute=True)


@pytest.mark.parametrize("kind", ["hybrid", "a_as_bf16"])
def test_sliding_windows_and_bf16_caches_pass_within_their_tolerance(tmp_path, zoo, models, kind):
    ids = list(range(2, 14))  # longer than the hybrid model's 4-token window
    cube = cube_with(tmp_path, zoo, models[kind], ids=ids)
    report = cubepack.verify(cube, model=models[kind], recompute=True)
    [check] = checks(report, "recompute")
    assert check.ok, check.detail


def test_require_provenance_recomputed(tmp_path, zoo, models):
    cube = cube_with(tmp_path, zoo, models["a"])
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    assert lock["activations"]["item-1"]["provenance"]["kind"] == "recorded"
    with pytest.raises(cubepack.VerificationFailed, match="provenance is recorded"):
        cubepack.verify(cube, require_provenance="recomputed")
    assert cubepack.verify(cube, model=models["a"], recompute=True,
                           require_provenance="recomputed").ok
    cubepack.pack(cube, model=models["a"], recompute=True)
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    provenance = lock["activations"]["item-1"]["provenance"]
    assert provenance["kind"] == "recomputed" and provenance["tokens"] == len(PROMPT)
    assert provenance["model"] == cubepack.fingerprint(models["a"]).weights_digest
    assert cubepack.verify(cube, require_provenance="recomputed").ok
    assert "recomputed" in (cube / "README.md").read_text()


def test_cli_verify_recompute(tmp_path, zoo, models, capsys):
    from cubepack.cli import main

    cube = cube_with(tmp_path, zoo, models["a"])
    assert main(["verify", str(cube), "--model", str(zoo["a"]), "--recompute",
                 "--recompute-tokens", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [check] = [c for c in report["checks"] if c["check"] == "recompute"]
    assert check["ok"] and "recomputed 4 positions" in check["detail"]
    assert main(["verify", str(cube), "--require-provenance", "recomputed"]) == 1


def test_a_converted_memos_pickle_is_proven_by_its_producer(tmp_path, zoo):
    """MemOS records no token ids; pack recovers them the way MemOS built the cache (its
    chat-template path), proves them by recomputation, and stores them."""
    pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
    from memos.configs.mem_cube import GeneralMemCubeConfig
    from memos.mem_cube.general import GeneralMemCube

    def build(name):
        llm = {"backend": "huggingface", "config": {"model_name_or_path": str(zoo["a"]),
                                                     "max_tokens": 4}}
        cube = GeneralMemCube(GeneralMemCubeConfig.model_validate({
            "user_id": "u", "cube_id": "u/c", "text_mem": {"backend": "uninitialized"},
            "act_mem": {"backend": "kv_cache", "config": {"extractor_llm": llm}}}))
        cube.act_mem.add([cube.act_mem.extract("The user likes green tea."),
                          cube.act_mem.extract([{"role": "user", "content": "I am Ki."}])])
        cube.dump(str(tmp_path / name))
        return tmp_path / name

    proven = build("proven")
    cubepack.pack(proven, legacy_pickle=True, recompute=True)
    lock = json.loads((proven / constants.LOCK_FILENAME).read_text())
    assert {a["provenance"]["kind"] for a in lock["activations"].values()} == {"recomputed"}
    for entry in lock["activations"].values():
        assert read_kv_header(proven / entry["file"]).token_ids  # recovered, proven, stored
    wrong = build("wrong")
    with pytest.raises(cubepack.RecomputationFailed, match="layer 0, position"):
        cubepack.pack(wrong, legacy_pickle=True, model=str(zoo["b"]),
                      assert_producer=True, recompute=True)
