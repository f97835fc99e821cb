"""Adversary #37 item 1: seals against ``uninstall()``.

Promise (docs/how-to/private-cubes.md "Private in MemOS"): "A memory stays sealed for its
life"; every path that writes a private cube's memories writes a private cube or refuses,
naming the path. cubepack's own messages suggest ``cubepack.memos.uninstall()`` as a way on
(``live_identity``: "call cubepack.memos.uninstall() to run MemOS unguarded").

Attack: load a private cube under the hook (``init_from_dir``, readers named), call
``uninstall()`` (to loosen a setting, or as a refusal suggests), then dump its memories with
MemOS's writers: ``KVCacheMemory.dump``, ``NaiveTextMemory.dump``, ``GeneralMemCube.dump``.

What happened: ``uninstall()`` restores MemOS's methods while sealed memories live, and
nothing stands between them and MemOS's own dumps: ``activation_memory.pickle`` (the caches,
their source text, pickled) and ``textual_memory.json`` are written in clear. Either a seal
outlives the hook's patches (the writers of sealed memories stay guarded), or ``uninstall()``
is refused while a sealed memory lives, naming it; this test accepts both.
"""

from __future__ import annotations

import gc

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pytest.importorskip("pyrage")

from private_memos_adv import alices_private_cube, clear_files  # noqa: E402

import cubepack.memos as hook  # noqa: E402
from cubepack import CubepackError  # noqa: E402
from cubepack.memos._privacy import private_folder  # noqa: E402


def test_uninstall_never_lets_a_sealed_memory_dump_in_clear(zoo, tmp_path, monkeypatch):
    _, private = alices_private_cube(zoo["a"], tmp_path, monkeypatch)
    cube = None
    try:
        cube = hook.init_from_dir(private)
        try:
            hook.uninstall()
        except CubepackError:  # refused while sealed memories live: also keeps the promise
            pass
        writers = {"KVCacheMemory.dump": cube.act_mem.dump,
                   "NaiveTextMemory.dump": cube.text_mem.dump,
                   "GeneralMemCube.dump": cube.dump}
        leaked = {}
        for name, dump in writers.items():
            target = tmp_path / name
            try:
                dump(str(target))
            except CubepackError:
                pass
            if clear_files(target) or (target.exists() and not private_folder(target)):
                leaked[name] = sorted(p.name for p in target.iterdir())
        assert leaked == {}, "after uninstall() these MemOS writers wrote in clear"
    finally:
        cube = writers = dump = None  # noqa: F841 - an uninstall refused while they live
        gc.collect()
        hook.uninstall()
