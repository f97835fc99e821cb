"""Shared by the MemOS hook's attack reproductions (tests/memos/attacks/): a real MemOS activation memory of a tiny model
and one chat question."""

from __future__ import annotations

QUESTION = [{"role": "user", "content": "What does the user drink?"}]


def act_memory(model):
    """A real KVCacheMemory whose extractor LLM is ``model`` (a HF folder)."""
    from memos.mem_cube.general import GeneralMemCube

    from memos_live import cube_config

    return GeneralMemCube(cube_config(model)).act_mem


def hf_llm(model):
    """A real MemOS HFLLM of ``model`` (greedy, a few tokens)."""
    from memos.configs.llm import HFLLMConfig
    from memos.llms.hf import HFLLM

    from memos_live import llm

    return HFLLM(HFLLMConfig.model_validate(llm(model)["config"]))
