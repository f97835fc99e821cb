"""Shared by the issue #37 adversary tests of "private by construction" in the MemOS hook: a
packed cube of tiny model A (two activations and a naive text memory, one of each the secret),
made private to alice, and a check that no file under a folder holds the secret in clear.

Each cube's texts carry a fresh suffix: the hook remembers caches by content, so a cache made
of the same text by the same model in an earlier test would be taken for that test's (private)
cache (test_memos_a_clear_cache_equal_to_a_private_one_is_sealed.py)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

SECRET = "zqxj-adv1-marker: the user's locker code is 7319"
OTHER = "He likes green tea."


def unique(text: str) -> str:
    """``text`` with a suffix no other test's cache holds."""
    return f"{text} [{uuid.uuid4().hex[:12]}]"


def clear_cube(model: Path, folder: Path) -> Path:
    """A packed (clear) cube at ``folder``: activations and a naive text memory of SECRET and
    OTHER (each made unique), extracted by ``model``, made without the hook."""
    from memos.mem_cube.general import GeneralMemCube

    import cubepack.memos as hook

    from memos_live import cube_config, llm

    hook.uninstall()
    text_mem = {"backend": "naive_text", "config": {"extractor_llm": llm(model)}}
    cube = GeneralMemCube(cube_config(model, cube_id="u1/private_cube", text_mem=text_mem))
    texts = (unique(SECRET), unique(OTHER))
    cube.act_mem.add([cube.act_mem.extract(text) for text in texts])
    cube.text_mem.add([{"memory": text, "metadata": {}} for text in texts])
    return hook.pack_cube(cube, folder)


def private_copy(clear: Path, folder: Path, recipients: list[str], **options) -> Path:
    from cubepack.ops._encrypt import encrypt

    shutil.copytree(clear, folder)
    encrypt(folder, recipients, **options)
    return folder


def clear_files(folder: Path) -> list[str]:
    """The files under ``folder`` that hold the secret in clear (a KV header's source text, a
    text memory's JSON, a MemOS pickle)."""
    folder = Path(folder)
    if not folder.exists():
        return []
    needle = SECRET.encode()
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and needle in p.read_bytes())


def alices_private_cube(model: Path, tmp_path: Path, monkeypatch) -> tuple[dict, Path]:
    """(keys, a private copy of :func:`clear_cube` for alice), with alice's identity in the
    environment and the MemOS hook installed afresh to dump to her (the caller uninstalls)."""
    import cubepack.memos as hook
    from private_keys import age_keys

    keys = age_keys(tmp_path, "alice")
    clear = clear_cube(model, tmp_path / "clear")
    private = private_copy(clear, tmp_path / "private", [keys["alice"][1]])
    monkeypatch.setenv("CUBEPACK_IDENTITY", str(keys["alice"][0]))
    hook.uninstall()
    hook.install(require_pin=False, recipients=[keys["alice"][1]])
    return keys, private
