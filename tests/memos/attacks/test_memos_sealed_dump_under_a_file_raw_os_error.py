"""Adversary #37 item 1 (odd folders as dump targets): a target whose parent is a file.

Promise (docs/reference/errors-targets.md): every writer, "the MemOS hook (... MemOS's dump of
activations), cubepack.memos.pack_cube", builds beside the target and renames it into place;
"If the operating system will not let it, you get one UsageError (exit status 2)" naming the
user's folder, saying why and what to do. ``check_dump_target`` refuses a target that is a
file or a symlink with a UsageError ("Nothing was written").

Attack: with a private cube loaded and its readers named, dump its memories to ``notes.txt/out``
(a path through a regular file: a typo, or a name reused): ``KVCacheMemory.dump``,
``GeneralMemCube.dump``, ``cubepack.memos.pack_cube``.

What happened: raw ``FileExistsError`` / ``NotADirectoryError`` from ``mkdir`` (no
CubepackError, no word of what to do): ``check_dump_target`` looks at the target only, and the
placing step does not map ENOTDIR / EEXIST. The same holds for a clear memory's hooked dumps.
"""

from __future__ import annotations

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pytest.importorskip("pyrage")

from private_keys import age_keys  # noqa: E402
from private_memos_adv import clear_cube, private_copy  # noqa: E402

import cubepack.memos as hook  # noqa: E402
from cubepack import UsageError  # noqa: E402


def test_a_sealed_dump_through_a_file_is_a_usage_error_naming_it(zoo, tmp_path, monkeypatch):
    keys = age_keys(tmp_path, "alice")
    private = private_copy(clear_cube(zoo["a"], tmp_path / "clear"), tmp_path / "private",
                           [keys["alice"][1]])
    monkeypatch.setenv("CUBEPACK_IDENTITY", str(keys["alice"][0]))
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    hook.uninstall()
    hook.install(require_pin=False, recipients=[keys["alice"][1]])
    raw = {}
    try:
        cube = hook.init_from_dir(private)
        for name, write in (("KVCacheMemory.dump", cube.act_mem.dump),
                            ("GeneralMemCube.dump", cube.dump),
                            ("pack_cube", lambda target: hook.pack_cube(cube, target))):
            try:
                write(str(notes / "out"))
            except UsageError as exc:
                assert "notes.txt" in str(exc), str(exc)
            except OSError as exc:
                raw[name] = f"{type(exc).__name__}: {exc}"
    finally:
        hook.uninstall()
    assert notes.read_text() == "my notes\n"
    assert raw == {}
