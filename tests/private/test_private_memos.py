"""The MemOS hook on a private cube: init_from_remote_repo, init_from_dir and install() open it
with the identity given (or CUBEPACK_IDENTITY), in memory only."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack.memos as hook
from cubepack import UsageError
from cubepack.hub import push
from cubepack.ops._encrypt import encrypt
from cubepack.testing.hub import InstrumentedHub, upload_folder

SECRET = "zqxj-memos-marker: the user's bank PIN is 4242"


def memos_config(model_path):
    from memos.configs.mem_cube import GeneralMemCubeConfig

    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(model_path),
                                                 "max_tokens": 6}}
    return GeneralMemCubeConfig.model_validate({
        "user_id": "u1", "cube_id": "u1/private_cube", "text_mem": {"backend": "uninitialized"},
        "act_mem": {"backend": "kv_cache", "config": {"extractor_llm": llm}}})


def digests_under(folder: Path) -> set[str]:
    return {hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*")
            if p.is_file() and not p.is_symlink()} if folder.exists() else set()


def test_the_hook_opens_a_private_cube_in_memory_only(zoo, tmp_path, agekeys, monkeypatch):
    from huggingface_hub import snapshot_download
    from memos.mem_cube.general import GeneralMemCube

    spool = tmp_path / "tmpdir"
    spool.mkdir()
    monkeypatch.setenv("TMPDIR", str(spool))
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    monkeypatch.delenv("CUBEPACK_IDENTITY", raising=False)
    with InstrumentedHub(tmp_path / "hub-root") as hub:
        commit = upload_folder(hub.url, "tiny-org/model-a", zoo["a"])
        snapshot = snapshot_download("tiny-org/model-a", revision=commit, endpoint=hub.url,
                                     cache_dir=tmp_path / "model-cache")
        cube = GeneralMemCube(memos_config(snapshot))
        items = [cube.act_mem.extract(text) for text in (SECRET, "He likes green tea.")]
        cube.act_mem.add(items)
        packed = hook.pack_cube(cube, tmp_path / "packed" / "cube")
        clear = digests_under(packed)
        encrypt(packed, [agekeys["alice"][1]])
        sha = push(packed, "ns/private", endpoint=hub.url).commit_sha
        loaded = hook.init_from_remote_repo(f"ns/private@{sha}", endpoint=hub.url,
                                            decrypt_with=agekeys["alice"][0],
                                            local_dir=tmp_path / "pulled")
        assert sorted(loaded.cubepack.loaded) == sorted(item.id for item in items)
        with pytest.raises(UsageError, match="private cube"):
            hook.init_from_dir(tmp_path / "pulled")
        monkeypatch.setenv("CUBEPACK_IDENTITY", str(agekeys["alice"][0]))
        hook.uninstall()
        # The cube is unsigned: the readers of its dumps are named by the user (issue #37).
        hook.install(require_pin=False, recipients=[agekeys["alice"][1]])
        try:
            again = GeneralMemCube.init_from_dir(str(tmp_path / "pulled"))
            assert len(again.act_mem.get_all()) == 2
            memory = GeneralMemCube(memos_config(snapshot))
            memory.act_mem.load(str(tmp_path / "pulled"))  # KVCacheMemory.load, hooked
            assert len(memory.act_mem.get_all()) == 2
            # MemOS's dump of a loaded private cube is private again, to the named readers.
            again.dump(str(tmp_path / "dumped"))
            reloaded = hook.init_from_dir(tmp_path / "dumped")  # CUBEPACK_IDENTITY: alice
            assert sorted(reloaded.cubepack.loaded) == sorted(item.id for item in items)
            assert reloaded.cubepack.private_recipients == [agekeys["alice"][1]]
        finally:
            hook.uninstall()
    cubepack_cache = Path(os.environ["CUBEPACK_CACHE"])
    for folder in (tmp_path / "pulled", tmp_path / "dumped", packed, spool, cubepack_cache,
                   Path(os.environ["HF_HUB_CACHE"]), tmp_path / "hub-root"):
        leaked = clear & digests_under(folder) - {hashlib.sha256(b"").hexdigest()}
        assert not leaked, folder
