"""Adversary #37 item 1: privacy on a busy server, under ``on_mismatch="rebuild"``.

Promise (docs/how-to/private-cubes.md "Private in MemOS"; SECURITY.md "Private by
construction in MemOS"): privacy travels with each cache as its producer does; a memory that
takes a private cube's cache is sealed. memos-hook.md: a copy (``deepcopy``...) keeps its
producer, found by content, for "the last 4,096 registered caches"; an older copy "is only
shape-checked" (its producer unknown), and ``on_mismatch="rebuild"`` re-extracts an unknown
cache from the item's ``source_text``.

Attack: install with ``on_mismatch="rebuild"`` (a documented policy), load a private cube
(readers named, so its own dumps are private), let the server register 4,096 other caches
(``cubepack.memos.register``, as its other work would), then ``copy.deepcopy`` a private item
and ``KVCacheMemory.add`` it to a fresh memory, and dump that memory.

What happened: the copy's content is no longer remembered, so its producer and its seal are
both unknown; "rebuild" re-extracts it from the item's ``source_text`` (the private text) and
registers the rebuilt cache with no seal. The fresh memory is not sealed and
``KVCacheMemory.dump`` writes the private source text, token ids and tensors in clear. A
forgotten producer costs a refusal or a rebuild; a forgotten seal costs the privacy: the item
itself (its ``source_text``) still carries what the seal was for.
"""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pytest.importorskip("pyrage")

from private_keys import age_keys  # noqa: E402
from private_memos_adv import SECRET, clear_cube, clear_files, private_copy  # noqa: E402

import cubepack.memos as hook  # noqa: E402
from cubepack import CubepackError  # noqa: E402
from cubepack.memos import _use  # noqa: E402
from cubepack.memos._privacy import private_folder  # noqa: E402


def test_a_copy_of_a_private_cache_rebuilt_after_its_record_is_forgotten_stays_private(
        zoo, models, tmp_path, monkeypatch):
    import torch
    from memos.mem_cube.general import GeneralMemCube
    from transformers import DynamicCache

    from memos_live import cube_config

    keys = age_keys(tmp_path, "alice")
    clear = clear_cube(zoo["a"], tmp_path / "clear")
    private = private_copy(clear, tmp_path / "private", [keys["alice"][1]])
    monkeypatch.setenv("CUBEPACK_IDENTITY", str(keys["alice"][0]))
    hook.uninstall()
    hook.install(require_pin=False, on_mismatch="rebuild")
    target = tmp_path / "other"
    try:
        cube = hook.init_from_dir(private, recipients=[keys["alice"][1]])
        [item] = [i for i in cube.act_mem.get_all() if SECRET in i.metadata.get("source_text", "")]
        for _ in range(_use.MAX_REMEMBERED):  # the server's other caches
            other_cache = DynamicCache()
            for layer in range(2):
                other_cache.update(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), layer)
            hook.register(other_cache, models["a"])
        other = GeneralMemCube(cube_config(zoo["a"]))
        other.act_mem.add([copy.deepcopy(item)])
        try:  # refused, or written private (to alice, whom the load named): never clear
            other.act_mem.dump(str(target))
        except CubepackError:
            pass
    finally:
        hook.uninstall()
    assert clear_files(target) == [], "a rebuilt copy of a private cache was dumped in clear"
    assert not target.exists() or private_folder(target)
