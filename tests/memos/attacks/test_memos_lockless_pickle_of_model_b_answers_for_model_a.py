"""Adversary (issue #30, item 2): a cache another process made and MemOS pickled (no
cubepack.lock, no producer record) is of unknown origin, and must follow ``on_mismatch``
(``error`` by default) before any model answers from it.

Found: the hooked ``KVCacheMemory.load`` reads the pickle safely, checks only its shape, and
registers every cache with the *loading* model as its producer; model A's chat then answers
from model B's caches (same shapes, other weights) with no error: the founding failure
(MemOS #2300), through the hook, by default."""

from __future__ import annotations

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

from memos_adv import QUESTION, act_memory

import cubepack.memos as hook
from cubepack import IdentityMismatch


def test_model_b_pickle_loaded_into_model_a_is_not_used_silently(zoo, tmp_path):
    hook.uninstall()
    other_process = act_memory(zoo["b"])  # plain MemOS, as another process runs it
    other_process.add([other_process.extract("The user likes green tea.")])
    other_process.dump(str(tmp_path / "b-dump"))  # MemOS's own activation_memory.pickle

    hook.install(require_pin=False)  # defaults: on_mismatch="error"
    try:
        memory = act_memory(zoo["a"])
        with pytest.raises(IdentityMismatch):
            memory.load(str(tmp_path / "b-dump"))
            item = memory.get_all()[0]
            memory.llm.generate(QUESTION, past_key_values=item.memory)  # A answers from B's
    finally:
        hook.uninstall()
