"""A cube built by the real MemoryOS package, packed and verified (memos environment)."""

from __future__ import annotations

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack

from helpers import all_equal, continue_greedy


def build_memos_cube(model_dir, out_dir, texts):
    from memos.configs.mem_cube import GeneralMemCubeConfig
    from memos.mem_cube.general import GeneralMemCube

    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(model_dir),
                                                 "max_tokens": 8}}
    config = GeneralMemCubeConfig.model_validate({
        "user_id": "u1", "cube_id": "u1/tiny_cube", "text_mem": {"backend": "uninitialized"},
        "act_mem": {"backend": "kv_cache", "config": {"extractor_llm": llm}}})
    cube = GeneralMemCube(config)
    items = [cube.act_mem.extract(text) for text in texts]
    cube.act_mem.add(items)
    cube.dump(str(out_dir))
    return cube, items


def test_real_memos_cube_packs_verifies_and_continues_identically(zoo, tmp_path):
    texts = ["The user is a Chinese man.", "He likes green tea."]
    cube, items = build_memos_cube(zoo["a"], tmp_path / "cube", texts)
    assert (tmp_path / "cube" / "activation_memory.pickle").exists()

    result = cubepack.pack(tmp_path / "cube", legacy_pickle=True)
    assert sorted(result.converted) == sorted(item.id for item in items)
    assert not (tmp_path / "cube" / "activation_memory.pickle").exists()
    report = cubepack.verify(tmp_path / "cube", model=str(zoo["a"]))
    assert report.ok

    model = cube.act_mem.llm.model  # the model MemOS itself loaded and extracted with
    for item in items:
        path = tmp_path / "cube" / "activations" / f"{item.id}.kv.safetensors"
        info = cubepack.read_kv_header(path)
        assert info.metadata["source_text"] in texts
        loaded = cubepack.load_kv_cache(path, model)
        assert loaded.get_seq_length() == item.memory.get_seq_length()
        assert all_equal(continue_greedy(model, item.memory, 40, 4),
                         continue_greedy(model, loaded, 40, 4))
