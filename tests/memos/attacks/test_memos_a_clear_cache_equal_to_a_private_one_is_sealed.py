"""Adversary #37 item 1 (an honest CLEAR flow): a seal found by content.

Promise (issue #37: "regressions matter as much as leaks"; docs/how-to/private-cubes.md):
seals mark what holds a private cube's memories; a cube of the user's own clear memories is
dumped and packed in clear, as before the seals (``pack_cube``: "A cube holding a private
cube's memories ... is written as a private cube"; one that holds none is not).

Attack: in one process, load a private cube (its readers named at the load, so it is sealed
with trusted recipients), then, as the user's own work, build a fresh clear cube whose model
extracts the same text as one of the private cube's memories (a common sentence, "He likes
green tea."; nothing of the private cube is read), and ``pack_cube`` it, with the hook
uninstalled, then installed.

What happened: the hook remembers caches by content (``_use._BY_CONTENT``), and a record
carries its seals, so the user's fresh cache, equal bit for bit to the private one (same model,
same text), is found as a "copy" of it and inherits its seal: ``pack_cube`` writes the user's
clear cube as a private cube encrypted to the other cube's readers, under that cube's id (and
without readers named, refuses it). Found when this round's tests, run together, made each
other's clear cubes private.

Resolved: under the hook, the user's extraction registers the cache object as the user's own
(its record has no seal; only the content record keeps the private one's), so it packs clear.
Without the hook nothing tells an identical cache from a copy of the private one (a deepcopy is
the same bytes, and must stay private), so it is taken as private: the conservative side,
said in docs/how-to/private-cubes.md. The test holds both.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pytest.importorskip("pyrage")

from private_keys import age_keys  # noqa: E402
from private_memos_adv import unique  # noqa: E402

import cubepack.memos as hook  # noqa: E402
from cubepack._util import constants  # noqa: E402
from cubepack.ops._encrypt import encrypt  # noqa: E402


def test_the_users_own_cache_equal_to_a_private_one_is_packed_in_clear(zoo, tmp_path,
                                                                      monkeypatch):
    from memos.mem_cube.general import GeneralMemCube

    from memos_live import cube_config

    common = unique("He likes green tea.")  # a sentence both cubes happen to hold
    keys = age_keys(tmp_path, "alice")
    hook.uninstall()
    theirs = GeneralMemCube(cube_config(zoo["a"], cube_id="them/private_cube"))
    theirs.act_mem.add([theirs.act_mem.extract(common)])
    private = hook.pack_cube(theirs, tmp_path / "theirs")
    encrypt(private, [keys["alice"][1]])
    monkeypatch.setenv("CUBEPACK_IDENTITY", str(keys["alice"][0]))
    hook.init_from_dir(private, recipients=[keys["alice"][1]])  # loaded, sealed

    lock_of = {}
    for hooked in (False, True):
        hook.uninstall()
        if hooked:
            hook.install(require_pin=False)
        try:
            mine = GeneralMemCube(cube_config(zoo["a"], cube_id="me/my_cube"))
            mine.act_mem.add([mine.act_mem.extract(common)])  # my own text, my own model
            out = hook.pack_cube(mine, tmp_path / f"mine-{hooked}")
            lock_of[hooked] = json.loads((out / constants.LOCK_FILENAME).read_text())
        finally:
            hook.uninstall()
    made_private = {hooked: lock.get("cube_id") for hooked, lock in lock_of.items()
                    if "encryption" in lock}
    # Under the hook, the user's extraction is registered as the user's own cache: clear.
    # Without it (uninstalled), nothing tells that cache from a copy of the private one (the
    # same bytes): it is taken as private, the conservative side (docs/how-to/private-cubes.md).
    assert True not in made_private, "the user's hooked cube was packed private"
    assert made_private.get(False) == "me/my_cube", "an unhooked copy by content left clear"
