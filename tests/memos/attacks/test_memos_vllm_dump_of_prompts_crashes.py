"""Adversary #37 item 1: vLLM activation memories under the sealed hook.

Promise (docs/how-to/private-cubes.md "Private in MemOS", the writers table):
``VLLMKVCacheMemory.dump`` writes "a private cube of the memory's KV files (or prompts)"; and
docs/explanation/memos-hook.md "Portable dumps": ``VLLMKVCacheMemory.dump`` writes the prompts
file. A private cube's dump loads back through the hook (into the memory of the served model).

Attack: a vLLM cube (MemOS's ``vllm_kv_cache`` backend: prompt strings the server prefills),
packed, made private to alice; loaded by a hooked ``VLLMKVCacheMemory.load``; dumped with
alice named as reader; the dump loaded back. And, as a regression check, the plain dump of a
clear vLLM memory.

What happened: every hooked ``VLLMKVCacheMemory.dump`` (private or clear) raises
``UnsupportedError: Cannot save a str: expected a transformers DynamicCache``: the seal lookup
``memory_seals`` -> ``cache_seals`` -> ``lookup`` -> ``cache_layers`` is run on each item's
``memory``, which for vLLM is the prompt string. (tests/memos/test_memos_use_attacks.py::
test_vllm_prompts_round_trip_and_their_records_are_enforced fails on main for the same
reason.) With that lookup skipped for strings, the private dump is packed with no model
(``pack_model=None`` for a non-local LLM), and its reload is refused: "The vLLM prompts of
/dev/shm/cubepack-private-... was produced by a different model (model: expected [], found
<served model>)", naming a RAM folder that no longer exists.
"""

from __future__ import annotations

import json
import pickle

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pytest.importorskip("pyrage")

from private_keys import age_keys  # noqa: E402
from private_memos_adv import SECRET, clear_files  # noqa: E402

import cubepack  # noqa: E402
import cubepack.memos as hook  # noqa: E402
from cubepack.memos._privacy import private_folder  # noqa: E402
from cubepack.ops._encrypt import encrypt  # noqa: E402


def test_a_clear_vllm_memory_still_dumps(tmp_path):
    from memos.memories.activation.item import VLLMKVCacheItem

    from memos_live import vllm_memory

    hook.uninstall()
    hook.install(require_pin=False)
    try:
        memory = vllm_memory("Qwen/Qwen3-8B")
        memory.kv_cache_memories = {"p1": VLLMKVCacheItem(id="p1", memory="<p>", metadata={})}
        memory.dump(str(tmp_path / "dump"))
        assert (tmp_path / "dump" / "activations" / "prompts.json").is_file()
    finally:
        hook.uninstall()


def test_a_private_vllm_cube_dumps_private_and_loads_back(zoo, hub_cached, tmp_path,
                                                          monkeypatch):
    from memos.memories.activation.item import VLLMKVCacheItem

    from memos_format import memos_config
    from memos_live import vllm_memory

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    keys = age_keys(tmp_path, "alice")
    served = hub_cached["repo_id"]
    folder = tmp_path / "vllm"
    folder.mkdir()
    config = memos_config(served)
    config["act_mem"]["backend"] = "vllm_kv_cache"
    config["act_mem"]["config"]["extractor_llm"] = {"backend": "vllm", "config": {
        "model_name_or_path": served, "api_base": "http://127.0.0.1:9/v1"}}
    (folder / "config.json").write_text(json.dumps(config))
    items = {"p1": VLLMKVCacheItem(id="p1", memory=f"<prompt> {SECRET}", metadata={})}
    (folder / "activation_memory.pickle").write_bytes(pickle.dumps({"kv_cache_memories": items}))
    hook.uninstall()
    cubepack.pack(folder, legacy_pickle=True)
    encrypt(folder, [keys["alice"][1]])
    monkeypatch.setenv("CUBEPACK_IDENTITY", str(keys["alice"][0]))
    hook.install(require_pin=False, recipients=[keys["alice"][1]])
    try:
        memory = vllm_memory(served)
        memory.load(str(folder))
        assert [item.memory for item in memory.get_all()] == [f"<prompt> {SECRET}"]
        memory.dump(str(tmp_path / "dump"))
        assert clear_files(tmp_path / "dump") == []
        assert private_folder(tmp_path / "dump")
        again = vllm_memory(served)
        again.load(str(tmp_path / "dump"))
        assert [item.memory for item in again.get_all()] == [f"<prompt> {SECRET}"]
    finally:
        hook.uninstall()
