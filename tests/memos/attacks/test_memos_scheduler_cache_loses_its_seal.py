"""Adversary #37 item 1: the scheduler's activation update of a private cube, then its cache.

Promise (docs/how-to/private-cubes.md "Private in MemOS"): the scheduler's
``update_activation_memory`` "seals the activation memory with its cube's seals first (the new
cache is made of the cube's text memories)"; privacy travels with each cache as its producer
does, so a memory that takes a private cache (``KVCacheMemory.add``) is sealed.

Attack: load a private cube (``init_from_dir``, recipients named, so its own dumps are private),
run MemOS's ``ActivationMemoryManager.update_activation_memory`` with the cube's text memories
(its dump is private: this holds), then hand the scheduler's item to another memory with
MemOS's own ``KVCacheMemory.add`` and dump that one.

What happened: the cache the scheduler composed of the private text memories is registered
(``record_extraction``) with its producer but without the seal of the memory it was made in,
so the other memory is not sealed and ``KVCacheMemory.dump`` writes it in clear: the private
memories' composed text in its header, their token ids and tensors. A cache made in a sealed
memory should carry that memory's seals, as a loaded one does.
"""

from __future__ import annotations

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pytest.importorskip("pyrage")

from private_keys import age_keys  # noqa: E402
from private_memos_adv import SECRET, clear_cube, clear_files, private_copy, unique  # noqa: E402

import cubepack.memos as hook  # noqa: E402
from cubepack import CubepackError  # noqa: E402
from cubepack.memos._privacy import private_folder  # noqa: E402


def test_the_schedulers_cache_of_private_memories_keeps_its_seal(zoo, tmp_path, monkeypatch):
    from memos.mem_cube.general import GeneralMemCube
    from memos.mem_scheduler.memory_manage_modules.activation_memory_manager import (
        ActivationMemoryManager,
    )

    from memos_live import cube_config

    keys = age_keys(tmp_path, "alice")
    clear = clear_cube(zoo["a"], tmp_path / "clear")
    private = private_copy(clear, tmp_path / "private", [keys["alice"][1]])
    monkeypatch.setenv("CUBEPACK_IDENTITY", str(keys["alice"][0]))
    manager = ActivationMemoryManager(str(tmp_path / "scheduler.kv_cache"), monitor=None,
                                      log_func_callback=None,
                                      log_activation_memory_update_func=lambda **_: None)
    hook.uninstall()
    try:
        cube = hook.init_from_dir(private, recipients=[keys["alice"][1]])
        hook.install(require_pin=False)  # nothing named for other memories
        manager.update_activation_memory([unique(SECRET)], "label", "u1", "c1", cube)
        assert clear_files(tmp_path / "scheduler.kv_cache") == []  # its own dump: private
        [item] = cube.act_mem.get_all()
        other = GeneralMemCube(cube_config(zoo["a"]))
        other.act_mem.add([item])  # MemOS's own add, hooked
        target = tmp_path / "other"
        try:  # refused, or written private (to alice, whom the load named): never clear
            other.act_mem.dump(str(target))
        except CubepackError:
            pass
    finally:
        hook.uninstall()
    assert clear_files(target) == [], "the scheduler's private cache was dumped in clear"
    assert not target.exists() or private_folder(target)
