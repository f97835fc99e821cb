"""Write cube folders in MemOS's on-disk format without MemoryOS installed.

``config.json`` has the structure ``GeneralMemCube.dump`` writes, and the activation pickle
names the same globals MemOS's does (``memos.memories.activation.item.KVCacheItem`` holding a
``transformers.cache_utils.DynamicCache``), so cubepack reads exactly what it reads from a real
dump. The real-MemoryOS round trip lives in ``test_memos_pack.py`` (memos environment).
"""

from __future__ import annotations

import contextlib
import json
import pickle
import sys
import types
from pathlib import Path

from transformers import cache_utils

MEMOS_ITEM_MODULE = "memos.memories.activation.item"


def memos_config(model_dir: str, cube_id: str = "u1/tiny_cube") -> dict:
    llm = {"backend": "huggingface", "config": {
        "model_name_or_path": str(model_dir), "temperature": 0.7, "max_tokens": 16,
        "top_p": 0.95, "top_k": 50, "remove_think_prefix": False, "default_headers": None,
        "do_sample": False, "add_generation_prompt": True}}
    return {
        "model_schema": "memos.configs.mem_cube.GeneralMemCubeConfig",
        "config_filename": "config.json", "user_id": "u1", "cube_id": cube_id,
        "text_mem": {"backend": "uninitialized", "config": {"cube_id": None}},
        "act_mem": {"backend": "kv_cache", "config": {
            "cube_id": None, "memory_filename": "activation_memory.pickle", "extractor_llm": llm}},
        "para_mem": {"backend": "uninitialized", "config": {"cube_id": None}},
        "pref_mem": {"backend": "uninitialized", "config": {"cube_id": None}},
    }


class _PydanticLike:
    """Pickles like a pydantic v2 model: state is {'__dict__': fields, ...}."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __getstate__(self):
        return {"__dict__": dict(self.__dict__), "__pydantic_extra__": None,
                "__pydantic_fields_set__": set(self.__dict__), "__pydantic_private__": None}

    def __setstate__(self, state):
        self.__dict__.update(state["__dict__"])


class KVCacheItem(_PydanticLike):
    pass


class KVCacheRecords(_PydanticLike):
    pass


class VLLMKVCacheItem(_PydanticLike):
    pass


class EarlyDynamicCache:
    """The transformers <= 4.53 DynamicCache layout: key_cache / value_cache lists."""

    def __init__(self, keys, values):
        self.key_cache, self.value_cache, self._seen_tokens = keys, values, keys[0].shape[-2]


@contextlib.contextmanager
def _as_memos_globals(early: bool):
    module = types.ModuleType(MEMOS_ITEM_MODULE)
    for cls in (KVCacheItem, KVCacheRecords, VLLMKVCacheItem):
        cls.__module__ = MEMOS_ITEM_MODULE
        setattr(module, cls.__name__, cls)
    saved = {name: sys.modules.get(name) for name in ("memos", "memos.memories",
                                                      "memos.memories.activation", MEMOS_ITEM_MODULE)}
    for name in saved:
        if saved[name] is None:
            sys.modules[name] = types.ModuleType(name)
    sys.modules[MEMOS_ITEM_MODULE] = module
    real_cache = cache_utils.DynamicCache
    if early:
        EarlyDynamicCache.__module__, EarlyDynamicCache.__qualname__ = cache_utils.__name__, "DynamicCache"
        cache_utils.DynamicCache = EarlyDynamicCache
    try:
        yield
    finally:
        cache_utils.DynamicCache = real_cache
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous


def write_cube(folder: Path, model_dir: str, caches: dict[str, object], *, early: bool = False,
               texts: dict[str, str] | None = None,
               producer: dict[str, object] | None = None) -> Path:
    """A MemOS-format cube with one activation per cache (``early``: mid-2025 layout;
    ``producer``: each item's MemOS #2305 ``metadata.producer`` record)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(memos_config(model_dir), indent=2))
    memories = {}
    with _as_memos_globals(early):
        for item_id, cache in caches.items():
            metadata = {"source_text": (texts or {}).get(item_id, f"text of {item_id}"),
                        "extracted_at": "2026-11-30T03:22:03.833206"}
            if producer is not None:
                metadata["producer"] = dict(producer)
            if early:
                keys = [layer.keys for layer in cache.layers]
                values = [layer.values for layer in cache.layers]
                memories[item_id] = KVCacheItem(kv_cache_id=item_id,
                                                kv_cache=EarlyDynamicCache(keys, values),
                                                metadata=metadata)
            else:
                records = KVCacheRecords(text_memories=[], composed_text_memory="")
                memories[item_id] = KVCacheItem(id=item_id, memory=cache, metadata=metadata,
                                                records=records)
        data = pickle.dumps({"kv_cache_memories": memories})
    (folder / "activation_memory.pickle").write_bytes(data)
    return folder


def write_vllm_cube(folder: Path, model_name: str, prompts: dict[str, str]) -> Path:
    """A MemOS-format vLLM cube (``vllm_kv_cache``): its activations are prompt strings a vLLM
    server serving ``model_name`` prefills, pickled as MemOS's ``VLLMKVCacheMemory.dump`` does."""
    folder.mkdir(parents=True, exist_ok=True)
    config = memos_config(model_name)
    config["act_mem"]["backend"] = "vllm_kv_cache"
    config["act_mem"]["config"]["extractor_llm"] = {"backend": "vllm", "config": {
        "model_name_or_path": model_name, "api_base": "http://127.0.0.1:9/v1"}}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    with _as_memos_globals(False):
        items = {item_id: VLLMKVCacheItem(id=item_id, memory=prompt, metadata={})
                 for item_id, prompt in prompts.items()}
        data = pickle.dumps({"kv_cache_memories": items})
    (folder / "activation_memory.pickle").write_bytes(data)
    return folder
