"""Incremental packs and pushes of a sharded cube (issue #40 item 3): adding, replacing or
removing memories and pushing again uploads the new memories' bytes and records whose size
does not grow with the cube; removed memories leave their index (dead bytes, never loadable);
the lock goes to version 7 while ranges overlap or bytes are dead. Counted at the local
endpoint, through the real huggingface_hub client."""

from __future__ import annotations

import json
import shutil

import pytest

import cubepack
from cubepack._util import constants
from cubepack.errors import UsageError

from data import HUB_TOKEN


def _push(hub, cube, repo="me/cube", **kwargs):
    return cubepack.push(cube, repo, endpoint=hub.url, token=HUB_TOKEN,
                         allow_local_paths=True, **kwargs)


def _lock(cube):
    return json.loads((cube / constants.LOCK_FILENAME).read_text())


def _add(cube, source, *items):
    (cube / "activations").mkdir(exist_ok=True)
    for item in items:
        shutil.copy(source / "activations" / f"{item}.kv.safetensors",
                    cube / "activations" / f"{item}.kv.safetensors")


@pytest.fixture
def pushed(bundle, zoo, hub, bundle_factory):
    """8 memories (item-000..item-007 but item-005) packed two a shard and pushed."""
    cube = bundle(8)
    (cube / "activations" / "item-005.kv.safetensors").unlink()
    size = next((cube / "activations").iterdir()).stat().st_size
    cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]), shard_size=2 * size + 100)
    _push(hub, cube)
    hub.stats.reset()
    return cube, size


def test_an_added_memory_uploads_its_bytes_and_small_records(pushed, hub, zoo, bundle_factory):
    cube, size = pushed
    before = _lock(cube)
    _add(cube, bundle_factory(8), "item-005")  # inside an older shard's range
    result = cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]), shard_size=2 * size + 100)
    lock = _lock(cube)
    assert lock["lock_version"] == 7
    old = {name: entry for name, entry in before["shards"].items()}
    for name, entry in old.items():  # every older shard and index kept byte for byte
        assert lock["files"][name] == before["files"][name]
        assert lock["files"][entry["index"]] == before["files"][entry["index"]]
        assert lock["shards"][name]["dead"] == 0
    new = sorted(set(lock["shards"]) - set(old))
    assert new == ["shards/activations-00004.kvshard"]
    assert lock["shards"][new[0]]["first"] == "item-005"
    pushed_result = _push(hub, cube)
    uploaded = sum(hub.stats.uploaded_bytes.values())
    assert sorted(pushed_result.uploaded) == sorted(
        [new[0], lock["shards"][new[0]]["index"], "cubepack.lock", "cubepack.yaml", "README.md"])
    assert uploaded <= 1.1 * size + 512 * 1024
    assert result.activations == [f"item-{i:03d}" for i in range(8)]
    report = cubepack.verify(cube)
    assert report.ok


def test_a_removed_memory_leaves_its_index_and_is_not_loadable(pushed, hub, zoo, models):
    cube, size = pushed
    before = _lock(cube)
    cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]), remove=("item-002",))
    lock = _lock(cube)
    assert lock["lock_version"] == 7
    shard = "shards/activations-00001.kvshard"
    assert lock["files"][shard] == before["files"][shard]  # the bytes stay, dead
    assert lock["shards"][shard]["dead"] == size and lock["shards"][shard]["memories"] == 1
    index = json.loads((cube / lock["shards"][shard]["index"]).read_text())
    assert index["version"] == 2 and index["dead"] == [[0, size]]
    assert "item-002" not in index["memories"]
    with pytest.raises(UsageError):
        cubepack.load_kv_cache(cube, models["a"], item="item-002")
    result = _push(hub, cube)
    assert shard not in result.uploaded
    assert cubepack.verify(cube).ok
    remote = cubepack.open("me/cube@main", endpoint=hub.url, token=HUB_TOKEN)
    with pytest.raises(UsageError):
        remote.load("item-002", models["a"])
    remote.load("item-003", models["a"])
