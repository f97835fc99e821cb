"""Adversary (issue #30, item 2): a cache made by hand is of unknown origin and never used
silently.

Found: the use guard lets any cache whose ``get_seq_length()`` is 0 through unchecked ("no
tokens: nothing to check") and hands MemOS the *original* object. ``get_seq_length()`` reads
layer 0 only, so a cache whose first layer is empty and whose other layers hold model B's
keys and values passes, and model A generates attending over B's tensors in every other layer
(its answer differs from the answer without a cache), with no error. Expected: the emptiness
shortcut looks at every layer (or the guard checks such a cache like any other)."""

from __future__ import annotations

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

from memos_adv import QUESTION, hf_llm

import cubepack.memos as hook
from cubepack import IdentityMismatch


def test_model_b_layers_behind_an_empty_first_layer_are_refused(zoo):
    from transformers import DynamicCache

    hook.uninstall()
    hook.install(require_pin=False)
    try:
        chat, other = hf_llm(zoo["a"]), hf_llm(zoo["b"])
        foreign = other.build_kv_cache("The user likes tea very much and every day.")
        crafted = DynamicCache(config=chat.model.config)
        first = foreign.layers[0]
        crafted.update(first.keys[..., :0, :].clone(), first.values[..., :0, :].clone(), 0)
        for index in range(1, len(foreign.layers)):
            layer = foreign.layers[index]
            crafted.update(layer.keys.clone(), layer.values.clone(), index)
        assert crafted.get_seq_length() == 0 and crafted.layers[1].keys.shape[-2] > 0
        with pytest.raises(IdentityMismatch):
            chat.generate(QUESTION, past_key_values=crafted)  # A attends over B's layers
    finally:
        hook.uninstall()
