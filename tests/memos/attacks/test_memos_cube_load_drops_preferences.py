"""Adversary #39: a hooked ``GeneralMemCube.load`` (so ``MOSCore.load``) of a packed preference
cube loads none of its preferences, and says nothing.

Promise (docs/how-to/share-memos-cube.md, "Loaded by the hook, item by item"): MemOS's own
``PreferenceTextMemory.load`` loads nothing from its own dump (its validation error swallowed),
so the hook loads the items itself: "``cubepack.memos.init_from_dir``, ``init_from_remote_repo``,
and a hooked ``PreferenceTextMemory.load`` of a packed folder".

Attack: build a cube from MemOS's own config and call its ``load`` on a packed folder, as
``MOSCore.load`` does (clear and private). What happened: the hooked cube load verifies the
folder, marks it verified and hands it to MemOS's ``GeneralMemCube.load``; that calls
``pref_mem.load(dir)``, whose hook sees the folder already verified and runs MemOS's own load,
the one that loads nothing: an empty preference memory, no error.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

from preferences_memos import PREFERENCES, cube_config, dump_cube, memos_or_skip  # noqa: E402

import cubepack  # noqa: E402
import cubepack.memos as hook  # noqa: E402
from cubepack.testing.embeddings import EmbeddingServer, build_encoder  # noqa: E402

COLLECTIONS = ("explicit_preference", "implicit_preference")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with EmbeddingServer(build_encoder(tmp_path_factory.mktemp("enc") / "e", seed=0)) as running:
        yield running


def _held(memory):
    return sorted(item.memory for name in COLLECTIONS for item in memory.vector_db.get_all(name))


@pytest.mark.parametrize("private", [False, True], ids=["clear", "private"])
def test_a_hooked_cube_load_loads_every_preference(tmp_path, server, monkeypatch, private):
    memos_or_skip()
    from memos.mem_cube.general import GeneralMemCube

    folder = dump_cube(tmp_path / "cube", server)
    cubepack.pack(folder)
    stores = []
    if private:
        pyrage = pytest.importorskip("pyrage")
        identity = pyrage.x25519.Identity.generate()
        key = tmp_path / "alice.key"
        key.write_text(f"{identity}\n")
        os.chmod(key, 0o600)
        cubepack.encrypt(folder, [str(identity.to_public())])
        monkeypatch.setenv("CUBEPACK_IDENTITY", str(key))
        stores = [f"milvus:{tmp_path / 'load.db'}"]
    hook.uninstall()
    hook.install(require_pin=False, stores=stores)
    try:
        cube = GeneralMemCube(cube_config(tmp_path / "load.db", server))
        try:
            cube.load(str(folder), ["pref_mem"])
        except cubepack.CubepackError:
            return  # a refusal is honest; an empty memory is not
        assert _held(cube.pref_mem) == sorted(p[1] for p in PREFERENCES)
    finally:
        hook.uninstall()
