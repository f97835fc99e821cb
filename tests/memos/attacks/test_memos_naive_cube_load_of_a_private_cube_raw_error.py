"""Adversary #37 item 1 (every load path): ``NaiveMemCube.load`` of a private cube.

Promise (cubepack/memos/_hook.py, docs/explanation/memos-hook.md): the hooked leaves cover
every entry point, ``NaiveMemCube.load`` among them (MemOS's server API builds NaiveMemCubes);
a private cube is opened in memory with ``CUBEPACK_IDENTITY`` and its memories sealed, as
``GeneralMemCube.load`` does; principle 1: refusals are typed and say what to do.

Attack: a NaiveMemCube (a naive text memory and an activation memory of model A, its config
set as MemOS's server sets it) loads a private cube folder, with ``CUBEPACK_IDENTITY`` set.

What happened: ``NaiveMemCube.load`` is not hooked, and MemOS's own load reads the cube's
``config.json`` first, which a private cube holds only as ``config.json.age``: a raw
``FileNotFoundError`` (no cubepack error, no word of a private cube or of what to do). Nothing
leaks; the honest flow is refused with MemOS's error.
"""

from __future__ import annotations

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pytest.importorskip("pyrage")

from private_memos_adv import alices_private_cube  # noqa: E402

import cubepack.memos as hook  # noqa: E402
from cubepack import CubepackError  # noqa: E402


def test_naive_mem_cube_load_opens_a_private_cube_or_says_why_not(zoo, tmp_path, monkeypatch):
    from memos.mem_cube.general import GeneralMemCube
    from memos.mem_cube.navie import NaiveMemCube

    from memos_live import cube_config, llm

    _, private = alices_private_cube(zoo["a"], tmp_path, monkeypatch)
    try:
        general = GeneralMemCube(cube_config(zoo["a"], text_mem={
            "backend": "naive_text", "config": {"extractor_llm": llm(zoo["a"])}}))
        naive = NaiveMemCube(text_mem=general.text_mem, act_mem=general.act_mem)
        naive.config = general.config
        try:
            naive.load(str(private))
        except CubepackError as exc:
            assert str(private) in str(exc)
            return
        assert len(naive.act_mem.get_all()) == 2 and len(naive.text_mem.get_all()) == 2
    finally:
        hook.uninstall()
