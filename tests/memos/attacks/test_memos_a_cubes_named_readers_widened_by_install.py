"""Issue #37 item 1, who reads a dump. ``cubepack.memos.init_from_dir`` /
``init_from_remote_repo`` docstrings: "recipients: who a dump of this cube's memories is
encrypted to". private-cubes.md: "or recipients you name: `cubepack.memos.install(recipients=
[...])` for every dump (`CUBEPACK_MEMOS_RECIPIENTS` ... for a server), or `init_from_dir(...,
recipients=[...])` / `init_from_remote_repo(..., recipients=[...])` for one cube's memories."

The chain: a server runs the hook with readers for its dumps in general
(``CUBEPACK_MEMOS_RECIPIENTS`` / ``install(recipients=[alice, bob])``). It loads one more
sensitive private cube naming its own, narrower, readers (``init_from_dir(cube,
recipients=[alice])``), then dumps that cube's memories (``KVCacheMemory.dump``: what the
scheduler calls; ``GeneralMemCube.dump``). A load's names win over the hook's when the cube is
opened (``named.merged(in_force())``), but every dump encrypts to the hook's instead: bob, whom
the user left out of this cube's readers, opens its dumps (the secret's source text, token
ids and tensors)."""

from __future__ import annotations

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pytest.importorskip("pyrage")

from private_keys import age_keys  # noqa: E402
from private_memos_adv import clear_cube, private_copy  # noqa: E402

import cubepack  # noqa: E402
import cubepack.memos as hook  # noqa: E402
from cubepack import CubepackError  # noqa: E402


def opens(folder, key) -> bool:
    try:
        return cubepack.verify(folder, decrypt_with=key, raise_on_failure=False).ok
    except CubepackError:
        return False


def test_a_cubes_own_readers_decide_its_dumps_over_the_hooks(zoo, tmp_path, monkeypatch):
    keys = age_keys(tmp_path, "alice", "bob")
    clear = clear_cube(zoo["a"], tmp_path / "clear")
    private = private_copy(clear, tmp_path / "private", [keys["alice"][1]])
    monkeypatch.setenv("CUBEPACK_IDENTITY", str(keys["alice"][0]))
    hook.uninstall()
    hook.install(require_pin=False, recipients=[keys["alice"][1], keys["bob"][1]])
    try:
        cube = hook.init_from_dir(private, recipients=[keys["alice"][1]])
        cube.act_mem.dump(str(tmp_path / "act"))
        cube.dump(str(tmp_path / "whole"))
    finally:
        hook.uninstall()
    readable = [name for name in ("act", "whole") if opens(tmp_path / name, keys["bob"][0])]
    assert readable == [], (f"bob, not among the readers named for this cube, opens its dumps "
                            f"{readable}")
