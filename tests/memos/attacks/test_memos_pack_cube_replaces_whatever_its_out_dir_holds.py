"""Adversary #37 item 1 (clear memories, private folders): ``pack_cube``'s ``out_dir``.

Promise (docs/how-to/private-cubes.md "Private in MemOS", Folders): "A memory that is not
private never writes into a private cube's folder"; the writers table lists
``cubepack.memos.pack_cube``. Principle 1: a command never guesses; migrate's rule for its
``--out`` (absent or empty: "never over files"), MemOS's own ``GeneralMemCube.dump`` (refuses a
non-empty folder).

Attack: ``pack_cube`` of a cube holding only clear memories (hook installed, and not) into
(a) a folder holding bob's private cube; (b) a folder holding the user's own files (a
project: ``thesis.tex``, ``src/main.py``).

What happened: the clear path of ``pack_cube`` never calls ``refuse_clear_into_private`` nor
looks at ``out_dir``: ``atomic.replace_dir`` swaps the new cube in and deletes whatever was
there. (a) bob's private cube is gone, a clear cube in its place; (b) the user's files are
deleted, silently, and the call returns the folder as if all went well.
"""

from __future__ import annotations

import hashlib

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pytest.importorskip("pyrage")

from private_keys import age_keys  # noqa: E402
from private_memos_adv import OTHER, clear_cube, private_copy, unique  # noqa: E402

import cubepack.memos as hook  # noqa: E402
from cubepack import CubepackError  # noqa: E402


def _digests(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("hooked", [False, True])
def test_pack_cube_never_replaces_a_private_cube_or_the_users_files(hooked, zoo, tmp_path):
    from memos.mem_cube.general import GeneralMemCube

    from memos_live import cube_config

    keys = age_keys(tmp_path, "bob")
    bobs = private_copy(clear_cube(zoo["a"], tmp_path / "clear"), tmp_path / "bobs",
                        [keys["bob"][1]])
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "thesis.tex").write_text("years of work\n")
    (project / "src" / "main.py").write_text("print('hello')\n")
    before = {"bob's private cube": _digests(bobs), "the user's files": _digests(project)}
    hook.uninstall()
    if hooked:
        hook.install(require_pin=False)
    try:
        cube = GeneralMemCube(cube_config(zoo["a"]))
        cube.act_mem.add([cube.act_mem.extract(unique(OTHER))])
        for folder in (bobs, project):
            try:
                hook.pack_cube(cube, folder)
            except CubepackError:
                pass
    finally:
        hook.uninstall()
    after = {"bob's private cube": _digests(bobs), "the user's files": _digests(project)}
    assert [name for name in before if before[name] != after[name]] == []
