"""Adversary (issue #30, item 1): the model that uses a cache must be its producer.

Found: a loaded model is fingerprinted from the files its ``name_or_path`` names *now*. When a
model folder is rewritten while a MemOS process runs (a fine-tuning job's ``save_pretrained``
into the folder the server loaded, a ``git pull`` of a model repo), the chat model MemOS loaded
earlier (model A's weights in memory) fingerprints as the new files (model B), so a cache built
by an HFLLM loaded after the rewrite (B) is accepted for A's chat: two different weight sets in
memory, one identity, the founding failure with no error. The documented limit is weights
replaced *in memory*; here nothing in memory was touched. Expected: the hook notices that a
live model's files changed since it first saw the model (or since MemOS loaded it) and refuses
(or fingerprints the model as it was loaded)."""

from __future__ import annotations

import os
import shutil

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

from memos_adv import QUESTION, hf_llm

import cubepack
import cubepack.memos as hook


def test_a_chat_model_loaded_before_its_folder_changed_is_not_the_new_producer(zoo, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(zoo["a"], folder)
    hook.uninstall()
    hook.install(require_pin=False)
    try:
        chat = hf_llm(folder)  # model A's weights in memory
        cubepack.fingerprint(chat.model)  # seen (fingerprinted) before the folder changes
        for weights in zoo["b"].glob("*.safetensors"):  # B saved over it (new inodes)
            staged = folder / (weights.name + ".tmp")
            shutil.copyfile(weights, staged)
            os.replace(staged, folder / weights.name)
        extractor = hf_llm(folder)  # model B's weights
        cache = extractor.build_kv_cache("The user likes green tea.")
        with pytest.raises(cubepack.CubepackError):
            chat.generate(QUESTION, past_key_values=cache)  # A answers from B's cache
    finally:
        hook.uninstall()
