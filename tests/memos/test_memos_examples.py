"""MemOS's own example cube, ``examples/data/mem_cube_2`` (see ../shared/fixtures/NOTICE.md):
an early-2025 activation pickle from Qwen3-1.7B (28 layers, 8 KV heads, head dim 128, bf16, 7
tokens), 768-dim textual memories, a text placeholder adapter and MemOS's one-line README.

No weights come with it: a tiny Qwen3 with the same KV geometry is published as
``Qwen/Qwen3-1.7B`` to a local endpoint and downloaded into the test's HF cache, so the names
in the cube's config.json resolve exactly as they would for a user.
"""

from __future__ import annotations

import json
import shutil

import pytest

import cubepack
from cubepack._util import constants

from data import EXAMPLES

pytestmark = pytest.mark.skipif(not (EXAMPLES / "mem_cube_2").is_dir(),
                                reason="../shared/fixtures/memos-examples is not present")


@pytest.fixture
def mem_cube_2(tmp_path, qwen3_snapshot, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the names resolve through the HF cache only
    cube = tmp_path / "mem_cube_2"
    shutil.copytree(EXAMPLES / "mem_cube_2", cube)
    return cube


def test_mem_cube_2_packs_keeps_its_readme_and_verifies(mem_cube_2, qwen3_snapshot):
    original_readme = (mem_cube_2 / "README.md").read_text()
    result = cubepack.pack(mem_cube_2, legacy_pickle=True)
    assert len(result.converted) == 1
    assert not (mem_cube_2 / "activation_memory.pickle").exists()
    card = (mem_cube_2 / "README.md").read_text()
    assert original_readme.strip() in card and "original README" in card
    lock = json.loads((mem_cube_2 / constants.LOCK_FILENAME).read_text())
    [activation] = lock["activations"].values()
    assert (activation["token_count"], activation["num_layers"], activation["kv_dtype"]) == \
        (7, 28, "bfloat16")
    assert activation["provenance"]["kind"] == "asserted"
    pin = lock["models"]["act_mem"]
    assert (pin["repo_id"], pin["revision"]) == ("Qwen/Qwen3-1.7B", qwen3_snapshot.name)
    assert lock["models"]["text_mem.embedder"]["identity"] is None  # Ollama: not a local model
    report = cubepack.verify(mem_cube_2)
    assert report.ok
    # The pinned revision from the HF cache: its weights proved; its dtype the pin's word.
    assert [(c.ok, c.basis) for c in report.checks if c.name == "model identity"] == [
        (True, "proved"), (True, "claimed")]
    assert cubepack.pack(mem_cube_2).changed is False  # a re-pack keeps the kept README


def test_mem_cube_2_loads_through_the_hook(mem_cube_2, qwen3_snapshot, monkeypatch):
    pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
    import pickle

    from memos.configs.mem_cube import GeneralMemCubeConfig
    from memos.memories.activation.kv import KVCacheMemory

    import cubepack.memos as hook

    cubepack.pack(mem_cube_2, legacy_pickle=True)
    config = json.loads((mem_cube_2 / "config.json").read_text())
    config["act_mem"]["config"]["extractor_llm"]["config"]["model_name_or_path"] = \
        str(qwen3_snapshot)  # as the hook points MemOS at the pinned snapshot
    act_config = GeneralMemCubeConfig.model_validate(config).act_mem.config
    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("pickle.load was called"))
    hook.install()
    try:
        memory = KVCacheMemory(act_config)
        memory.load(str(mem_cube_2))  # MemOS's load path, the hooked leaf
    finally:
        hook.uninstall()
    [item] = memory.get_all()
    assert item.memory.get_seq_length() == 7 and memory.cubepack.verified
    assert "Chinese" in str(item.metadata.get("source_text", ""))
