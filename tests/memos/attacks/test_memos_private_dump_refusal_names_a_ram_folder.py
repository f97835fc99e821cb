"""Adversary #37 item 1 (a new user's messages): reloading a private lone-memory dump.

Promise (principle 1): an error says what differed and what to do, and names what the user
gave. A hooked lone-memory dump of a private cube (``NaiveTextMemory.dump``,
``KVCacheMemory.dump``) is a private cube folder; a user loads it back the way they load a cube.

Attack: dump a private cube's text memory and its activation memory (readers named), then load
each dump with ``cubepack.memos.init_from_dir`` and with MemOS's hooked
``GeneralMemCube.init_from_dir``, without a default_config.

What happened: each refusal names a RAM folder that no longer exists
("/dev/shm/cubepack-private-<pid>.<random> holds no MemOS config.json"), not the folder the
user gave, and calls the activation dump "a text-memory export". The same RAM path appears in
the vLLM prompts refusal (test_memos_vllm_dump_of_prompts_crashes.py) and in a cube replaced by
its own activations (test_memos_sealed_dump_replaces_any_private_cube.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pytest.importorskip("pyrage")

from private_memos_adv import alices_private_cube  # noqa: E402

import cubepack.memos as hook  # noqa: E402
from cubepack import CubepackError  # noqa: E402


def test_a_refused_private_dump_is_named_by_its_own_folder(zoo, tmp_path, monkeypatch):
    from memos.mem_cube.general import GeneralMemCube

    _, private = alices_private_cube(zoo["a"], tmp_path, monkeypatch)
    messages = {}
    try:
        cube = hook.init_from_dir(private)
        cube.text_mem.dump(str(tmp_path / "text"))
        cube.act_mem.dump(str(tmp_path / "act"))
        for name in ("text", "act"):
            for how, load in (("cubepack.memos.init_from_dir", hook.init_from_dir),
                              ("GeneralMemCube.init_from_dir",
                               lambda folder: GeneralMemCube.init_from_dir(str(folder)))):
                try:
                    load(tmp_path / name)
                except CubepackError as exc:
                    messages[name, how] = str(exc)
    finally:
        hook.uninstall()
    assert messages, "every load of a lone-memory dump without a default_config is refused"
    wrong = {key: text[:120] for key, text in messages.items()
             if "/dev/shm" in text or str(tmp_path / key[0]) not in text
             or (key[0] == "act" and "text-memory export" in text)}
    assert wrong == {}
