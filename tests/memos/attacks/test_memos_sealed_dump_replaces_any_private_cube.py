"""Adversary #37 item 1: a sealed dump's target that already holds a private cube.

Promise (docs/how-to/private-cubes.md "Private in MemOS", Folders; ``_dump.dump_private``): "A
sealed dump goes to an empty folder, or replaces an earlier private cube there" ("an earlier
private dump, which it replaces"); principle 1: never guess, a command that does not do what
was asked leaves everything as it was. MemOS's own ``KVCacheMemory.dump(dir)`` writes its one
file into ``dir`` and leaves the rest of the folder alone (``GeneralMemCube.dump`` dumps each
memory into the same folder that way).

Attack: with a private cube loaded and its readers named, ``KVCacheMemory.dump`` into
(a) bob's private cube, which this user cannot even open; (b) a folder its own text memory was
just dumped to (``NaiveTextMemory.dump(dir)`` then ``KVCacheMemory.dump(dir)``, MemOS's
memory-by-memory layout); (c) the private cube folder it was loaded from.

What happened: ``check_dump_target`` lets any folder holding a private cube be replaced whole.
(a) bob's cube is deleted and replaced by alice's activations, silently; (b) the text memory's
dump is gone: the folder holds the activations only; (c) the source cube loses its config.json
and text memory, and its next ``init_from_dir`` fails naming a RAM folder that no longer
exists ("/dev/shm/cubepack-private-... holds no MemOS config.json").
"""

from __future__ import annotations

import hashlib

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pytest.importorskip("pyrage")

from private_keys import age_keys  # noqa: E402
from private_memos_adv import SECRET, clear_cube, private_copy  # noqa: E402

import cubepack.memos as hook  # noqa: E402
from cubepack import CubepackError  # noqa: E402


def _digests(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_sealed_dump_never_destroys_a_private_cube_it_was_not_asked_to_replace(
        zoo, tmp_path, monkeypatch):
    from memos.mem_cube.general import GeneralMemCube

    from memos_live import cube_config, llm

    keys = age_keys(tmp_path, "alice", "bob")
    clear = clear_cube(zoo["a"], tmp_path / "clear")
    private = private_copy(clear, tmp_path / "private", [keys["alice"][1]])
    bobs = private_copy(clear, tmp_path / "bobs", [keys["bob"][1]])
    bobs_before, private_before = _digests(bobs), _digests(private)
    monkeypatch.setenv("CUBEPACK_IDENTITY", str(keys["alice"][0]))
    hook.uninstall()
    hook.install(require_pin=False, recipients=[keys["alice"][1]])
    broken = []
    try:
        cube = hook.init_from_dir(private)
        # (a) someone else's private cube
        try:
            cube.act_mem.dump(str(bobs))
        except CubepackError:
            pass
        if _digests(bobs) != bobs_before:
            broken.append("(a) bob's private cube was replaced by alice's activations")
        # (b) MemOS's layout: each memory dumped into one folder
        layout = tmp_path / "layout"
        cube.text_mem.dump(str(layout))
        try:
            cube.act_mem.dump(str(layout))
        except CubepackError:
            pass
        text = GeneralMemCube(cube_config(zoo["a"], text_mem={
            "backend": "naive_text", "config": {"extractor_llm": llm(zoo["a"])}})).text_mem
        try:
            text.load(str(layout))
        except CubepackError as exc:
            broken.append(f"(b) the text memory's dump cannot be read back: {exc}")
        else:
            if len([m for m in text.get_all() if SECRET in m.memory]) != 1:
                broken.append("(b) the text memory's dump was replaced by the activations'")
        # (c) the cube it was loaded from
        try:
            cube.act_mem.dump(str(private))
        except CubepackError:
            pass
        if _digests(private) != private_before:
            try:
                again = hook.init_from_dir(private)
                if again.text_mem is None or len(again.text_mem.get_all()) != 2:
                    broken.append("(c) the source cube lost its text memory")
            except CubepackError as exc:
                broken.append(f"(c) the source cube no longer loads: {exc}")
    finally:
        hook.uninstall()
    assert broken == []
