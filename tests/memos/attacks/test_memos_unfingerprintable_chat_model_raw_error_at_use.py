"""Adversary (issue #30, item 1/5): "a model that cannot be fingerprinted is a typed
UnsupportedError naming the call".

Found: that holds where caches are made (``build_kv_cache``, ``extract``, ``add``: they go
through ``live_identity``), but the use guard (``HFLLM.generate`` / ``generate_stream`` ->
``_generate_with_cache(_stream)``) fingerprints the chat model directly: a chat model cubepack
cannot fingerprint (MemOS's own tests use a MagicMock model) surfaces as huggingface_hub's raw
``HFValidationError`` about a repo id, the exact symptom item 5 fixed for
``from_textual_memory``."""

from __future__ import annotations

from unittest.mock import MagicMock

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

from memos_adv import QUESTION, hf_llm

import cubepack.memos as hook
from cubepack import UnsupportedError


@pytest.mark.parametrize("call", ["generate", "generate_stream"])
def test_a_chat_model_cubepack_cannot_fingerprint_is_a_typed_error_naming_the_call(zoo, call):
    from memos.llms.hf import HFLLM

    hook.uninstall()
    hook.install(require_pin=False)
    try:
        real = hf_llm(zoo["a"])
        cache = real.build_kv_cache("The user likes green tea.")
        mocked = HFLLM.__new__(HFLLM)  # as MemOS's own tests build one
        mocked.config, mocked.tokenizer = real.config, real.tokenizer
        mocked.logits_processors, mocked.model = real.logits_processors, MagicMock()
        with pytest.raises(UnsupportedError, match="generate"):
            result = getattr(mocked, call)(QUESTION, past_key_values=cache)
            if call == "generate_stream":
                next(iter(result))
    finally:
        hook.uninstall()
