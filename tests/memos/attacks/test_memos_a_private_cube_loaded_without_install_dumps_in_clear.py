"""Adversary #39: a private preference cube loaded by ``cubepack.memos.init_from_dir`` in a
process that never installed the hook is dumped in clear by MemOS's own dump.

Promise (SECURITY.md, "Private by construction in MemOS"): the hook seals each memory that
takes a private cube's memories, and every MemOS writer of a sealed memory (the text and
preference memories' dumps, ``GeneralMemCube.dump``...) writes a private cube or refuses;
docs/how-to/private-cubes.md shows ``cubepack.memos.init_from_remote_repo(...,
decrypt_with=...)`` loading a private cube with no ``install()``. The guard that keeps a sealed
memory from MemOS's own dump after ``uninstall()`` is placed by ``uninstall`` only.

Attack: never install; load the private cube with ``init_from_dir(decrypt_with=...)`` (its
memories sealed), then ``cube.dump`` and ``cube.pref_mem.dump``. What happened: MemOS's own
dumps ran and wrote ``textual_memory.json``, the preferences, in clear.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pyrage = pytest.importorskip("pyrage")

from preferences_memos import cube_config, dump_cube, memos_or_skip  # noqa: E402

import cubepack  # noqa: E402
import cubepack.memos as hook  # noqa: E402
from cubepack.testing.embeddings import EmbeddingServer, build_encoder  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with EmbeddingServer(build_encoder(tmp_path_factory.mktemp("enc") / "e", seed=0)) as running:
        yield running


def test_a_sealed_memory_is_never_dumped_in_clear_without_install(tmp_path, server):
    memos_or_skip()
    folder = dump_cube(tmp_path / "cube", server)
    cubepack.pack(folder)
    identity = pyrage.x25519.Identity.generate()
    key = tmp_path / "alice.key"
    key.write_text(f"{identity}\n")
    os.chmod(key, 0o600)
    cubepack.encrypt(folder, [str(identity.to_public())])
    hook.uninstall()  # a process that never installed it
    store = tmp_path / "p.db"
    cube = hook.init_from_dir(folder, memory_types=["pref_mem"], decrypt_with=key,
                              default_config=cube_config(store, server),
                              stores=[f"milvus:{store}"])
    leaked = {}
    for name, dump in (("cube", cube.dump), ("pref_mem", cube.pref_mem.dump)):
        target = tmp_path / f"dump-{name}"
        try:
            dump(str(target))
        except cubepack.CubepackError:
            continue  # refused: nothing written
        clear = [p.name for p in target.rglob("*") if p.is_file() and b"green tea" in p.read_bytes()]
        if clear:
            leaked[name] = clear
    assert leaked == {}, "a private cube's preferences were dumped in clear"
