"""Promise 4: "MemOS's dump of a loaded private cube writes it encrypted again, to the same
recipients". It does, but not as it was: a cube encrypted with ``--hide-names`` (its item ids
kept private: ``private/<random>.age``) is dumped by the hook with the clear names
(``activations/<item id>.kv.safetensors.age``), so pushing the dump publishes the item ids the
owner hid. The hook's dump calls ``encrypt(folder, recipients)`` without the cube's
``hidden_names``."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pytest.importorskip("pyrage")

from private_keys import age_keys  # noqa: E402

import cubepack.memos as hook  # noqa: E402
from cubepack._util import constants  # noqa: E402
from cubepack.ops._encrypt import encrypt  # noqa: E402


def test_a_dump_of_a_hidden_names_cube_hides_its_names(zoo, tmp_path, monkeypatch):
    from memos.configs.mem_cube import GeneralMemCubeConfig
    from memos.mem_cube.general import GeneralMemCube

    keys = age_keys(tmp_path, "alice")
    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(zoo["a"]),
                                                 "max_tokens": 6}}
    config = GeneralMemCubeConfig.model_validate({
        "user_id": "u1", "cube_id": "u1/private_cube", "text_mem": {"backend": "uninitialized"},
        "act_mem": {"backend": "kv_cache", "config": {"extractor_llm": llm}}})
    cube = GeneralMemCube(config)
    items = [cube.act_mem.extract(text) for text in ("my PIN is 4242", "He likes tea.")]
    cube.act_mem.add(items)
    packed = hook.pack_cube(cube, tmp_path / "packed" / "cube")
    encrypt(packed, [keys["alice"][1]], hide_names=True)
    public = (packed / constants.LOCK_FILENAME).read_text()
    assert not any(item.id in public for item in items)
    monkeypatch.setenv("CUBEPACK_IDENTITY", str(keys["alice"][0]))
    hook.uninstall()
    # An unsigned cube's manifest does not name the readers of a dump: the user does (#37).
    hook.install(require_pin=False, recipients=[keys["alice"][1]])
    try:
        loaded = GeneralMemCube.init_from_dir(str(packed))
        loaded.dump(str(tmp_path / "dumped"))
    finally:
        hook.uninstall()
    dumped = (tmp_path / "dumped" / constants.LOCK_FILENAME).read_text()
    assert json.loads(dumped)["encryption"]["hidden_names"] is True
    assert not [item.id for item in items if item.id in dumped], "item ids public in the dump"
