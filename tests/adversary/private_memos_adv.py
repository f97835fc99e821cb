"""Shared by the issue #37 adversary tests of "private by construction" in the MemOS hook: a
packed cube of tiny model A (two activations and a naive text memory, one of each the secret),
made private to alice, and a check that no file under a folder holds the secret in clear."""

from __future__ import annotations

import shutil
from pathlib import Path

SECRET = "zqxj-adv1-marker: the user's locker code is 7319"
OTHER = "He likes green tea."


def clear_cube(model: Path, folder: Path) -> Path:
    """A packed (clear) cube at ``folder``: activations and a naive text memory of SECRET and
    OTHER, extracted by ``model``, made without the hook."""
    from memos.mem_cube.general import GeneralMemCube

    import cubepack.memos as hook

    from memos_live import cube_config, llm

    hook.uninstall()
    text_mem = {"backend": "naive_text", "config": {"extractor_llm": llm(model)}}
    cube = GeneralMemCube(cube_config(model, cube_id="u1/private_cube", text_mem=text_mem))
    cube.act_mem.add([cube.act_mem.extract(text) for text in (SECRET, OTHER)])
    cube.text_mem.add([{"memory": text, "metadata": {}} for text in (SECRET, OTHER)])
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
