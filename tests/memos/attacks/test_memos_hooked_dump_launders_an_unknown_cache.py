"""Adversary (issue #30, item 2): a cache of unknown origin is never used silently.

Found: the hook refuses model B's cache (built before install(): unknown origin) when model A
generates from it directly, but a hooked ``GeneralMemCube.dump`` writes that cache as a KV file
whose producer is the *memory's* model A (labelled "asserted"), packs and locks it, and the
hooked load of the dump then hands it to A with no error and no warning at use: dump + load
turns an unknown cache into A's. (Same shapes, other weights: A answers from B's cache.)"""

from __future__ import annotations

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

from memos_adv import QUESTION, act_memory

import cubepack.memos as hook
from cubepack import IdentityMismatch


def test_dump_and_reload_does_not_turn_model_b_cache_into_model_a(zoo, tmp_path):
    from memos.mem_cube.general import GeneralMemCube

    from memos_live import cube_config

    hook.uninstall()
    foreign = act_memory(zoo["b"]).extract("The user likes coffee.")  # before install()
    cube = GeneralMemCube(cube_config(zoo["a"]))
    cube.act_mem.add([foreign])

    hook.install(require_pin=False)  # defaults: on_mismatch="error"
    try:
        with pytest.raises(IdentityMismatch):  # direct use: refused (this holds)
            cube.act_mem.llm.generate(QUESTION, past_key_values=foreign.memory)
        with pytest.raises(IdentityMismatch):  # through a dump and a load: must refuse too
            cube.dump(str(tmp_path / "dumped"))
            reloaded = act_memory(zoo["a"])
            reloaded.load(str(tmp_path / "dumped"))
            reloaded.llm.generate(QUESTION, past_key_values=reloaded.get_all()[0].memory)
    finally:
        hook.uninstall()
