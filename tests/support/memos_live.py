"""Live MemoryOS objects for tests (memos environment): configs, a real MOS/MOSCore, a vLLM
activation memory that needs no server."""

from __future__ import annotations

import types


def llm(model, max_tokens=6):
    return {"backend": "huggingface", "config": {"model_name_or_path": str(model),
                                                 "max_tokens": max_tokens, "do_sample": False}}


def cube_config(model, *, cube_id="u1/tiny_cube", text_mem=None):
    from memos.configs.mem_cube import GeneralMemCubeConfig

    return GeneralMemCubeConfig.model_validate({
        "user_id": "u1", "cube_id": cube_id, "text_mem": text_mem or {"backend": "uninitialized"},
        "act_mem": {"backend": "kv_cache", "config": {"extractor_llm": llm(model)}}})


def mos_for(chat_model, reader_model, *, kind="MOS"):
    """A real MOS (or MOSCore) with activation memory on and a HF chat model."""
    from memos.configs.mem_os import MOSConfig
    from memos.mem_os.core import MOSCore
    from memos.mem_os.main import MOS

    config = MOSConfig.model_validate({
        "user_id": "u1", "chat_model": llm(chat_model),
        "mem_reader": {"backend": "simple_struct", "config": {
            "llm": llm(reader_model),
            "embedder": {"backend": "universal_api", "config": {
                "provider": "openai", "api_key": "x", "base_url": "http://127.0.0.1:9",
                "model_name_or_path": "unused"}},
            "chunker": {"backend": "sentence", "config": {
                "tokenizer_or_token_counter": "character", "chunk_size": 512,
                "chunk_overlap": 0, "min_sentences_per_chunk": 1}}}},
        "enable_textual_memory": False, "enable_activation_memory": True})
    return (MOS if kind == "MOS" else MOSCore)(config)


def vllm_memory(model_name):
    """A VLLMKVCacheMemory whose LLM config names ``model_name`` (no server is contacted)."""
    from memos.configs.memory import KVCacheMemoryConfig
    from memos.memories.activation.vllmkv import VLLMKVCacheMemory

    memory = VLLMKVCacheMemory.__new__(VLLMKVCacheMemory)
    memory.config = KVCacheMemoryConfig.model_validate({"extractor_llm": {
        "backend": "vllm", "config": {"model_name_or_path": model_name,
                                      "api_base": "http://127.0.0.1:9/v1"}}})
    memory.llm = types.SimpleNamespace(config=memory.config.extractor_llm.config)
    memory.kv_cache_memories = {}
    return memory
