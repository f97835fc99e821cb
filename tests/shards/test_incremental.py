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


def test_a_replaced_memory_goes_to_a_new_shard_and_its_old_bytes_die(pushed, zoo, models,
                                                                     bundle_factory, tmp_path):
    cube, size = pushed
    other = bundle_factory(8, tokens=5)  # item-003 of 5 tokens: other bytes, same id
    _add(cube, other, "item-003")
    cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]), remove=("item-003",))
    lock = _lock(cube)
    holder = [name for name, entry in lock["shards"].items()
              if entry["first"] <= "item-003" <= entry["last"]]
    assert holder == ["shards/activations-00004.kvshard"]  # its old shard's range shrank
    old = lock["shards"]["shards/activations-00001.kvshard"]
    assert (old["first"], old["last"], old["memories"], old["dead"]) == \
        ("item-002", "item-002", 1, size)
    cache = cubepack.load_kv_cache(cube, models["a"], item="item-003")
    assert cache.get_seq_length() == 5  # the new memory, never the old bytes


def test_pack_refuses_a_file_beside_its_shards_memory_without_remove(pushed, zoo,
                                                                     bundle_factory):
    cube, _ = pushed
    _add(cube, bundle_factory(8, tokens=5), "item-003")
    before = (cube / constants.LOCK_FILENAME).read_bytes()
    with pytest.raises(UsageError, match="--remove item-003"):
        cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]))
    assert (cube / constants.LOCK_FILENAME).read_bytes() == before


def test_remove_of_a_memory_no_shard_holds_is_refused(pushed, zoo):
    cube, _ = pushed
    before = (cube / constants.LOCK_FILENAME).read_bytes()
    with pytest.raises(UsageError, match="item-099"):
        cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]), remove=("item-099",))
    assert (cube / constants.LOCK_FILENAME).read_bytes() == before


def test_compact_rewrites_dead_and_overlapping_shards_only(pushed, zoo, bundle_factory, hub):
    cube, size = pushed
    _add(cube, bundle_factory(8), "item-005")
    cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]), remove=("item-000",))
    before = _lock(cube)
    assert before["lock_version"] == 7
    _push(hub, cube)
    hub.stats.reset()
    result = cubepack.compact(cube)
    after = _lock(cube)
    # shard 0 (item-000 dead: half its bytes), shard 2 (item-004, item-006) and shard 4
    # (item-005, inside shard 2's range) are laid out anew; shards 1 and 3 stay.
    assert result.removed == ["shards/activations-00000.kvshard",
                              "shards/activations-00002.kvshard",
                              "shards/activations-00004.kvshard"]
    for name in ("shards/activations-00001.kvshard", "shards/activations-00003.kvshard"):
        assert after["files"][name] == before["files"][name]
    assert result.dead_after == 0 and after["lock_version"] == 6  # disjoint, nothing dead
    firsts = sorted((e["first"], e["last"]) for e in after["shards"].values())
    assert all(b[0] > a[1] for a, b in zip(firsts, firsts[1:]))
    assert cubepack.verify(cube).ok
    assert cubepack.compact(cube).changed is False  # nothing left to do
    pushed_result = _push(hub, cube)
    assert "shards/activations-00001.kvshard" not in pushed_result.uploaded
    assert sorted(p for p in pushed_result.deleted if p.endswith(".kvshard")) == \
        result.removed


def test_compact_keeps_shards_under_the_bound(pushed, zoo):
    cube, _ = pushed
    cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]), remove=("item-000",))
    before = (cube / constants.LOCK_FILENAME).read_bytes()
    result = cubepack.compact(cube, above=0.9)  # half of shard 0 is dead: under 0.9
    assert result.changed is False and (cube / constants.LOCK_FILENAME).read_bytes() == before
    with pytest.raises(UsageError):
        cubepack.compact(cube, above=1.5)


def test_an_interrupted_compact_leaves_the_cube_as_it_was(pushed, zoo, monkeypatch):
    from cubepack.kinds.activations import _shards

    cube, _ = pushed
    cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]), remove=("item-000",))
    listing = sorted((p.relative_to(cube).as_posix(), p.read_bytes())
                     for p in cube.rglob("*") if p.is_file())

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_shards, "_write_shard", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cubepack.compact(cube)
    assert sorted((p.relative_to(cube).as_posix(), p.read_bytes())
                  for p in cube.rglob("*") if p.is_file()) == listing


@pytest.mark.parametrize("count", [150, 1100])
def test_an_incremental_push_uploads_new_bytes_plus_a_bound_at_any_size(count, bundle, zoo,
                                                                       hub, bundle_factory):
    """The bench line of issue #40: bytes uploaded by an incremental push within 1.1 times the
    new memories' bytes plus 512 KiB, at cube sizes around one shard and above it."""
    cube = bundle(count)
    added = sorted((cube / "activations").iterdir())[count // 2:count // 2 + 3]
    aside = cube.parent / "aside"
    aside.mkdir()
    for path in added:  # three memories from the middle of the ids, added back later
        path.rename(aside / path.name)
    cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]))
    _push(hub, cube)
    hub.stats.reset()
    (cube / "activations").mkdir(exist_ok=True)
    for path in added:
        shutil.copy(aside / path.name, cube / "activations" / path.name)
    new_bytes = sum(path.stat().st_size for path in added)
    cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]))
    result = _push(hub, cube)
    uploaded = sum(hub.stats.uploaded_bytes.values())
    assert uploaded <= 1.1 * new_bytes + 512 * 1024, (uploaded, new_bytes, result.uploaded)
    assert not any(path.endswith(".kvshard") and path != "shards/activations-"
                   f"{len(_lock(cube)['shards']) - 1:05d}.kvshard" for path in result.uploaded)
    print(f"{count} memories: uploaded {uploaded} bytes for {new_bytes} new "
          f"({sorted(result.uploaded)})")


def test_a_relabelled_memory_keeps_its_shard_and_only_its_index_is_rewritten(bundle, zoo):
    """A re-pack establishes its labels anew (a recomputed cube re-packed without --recompute
    is labelled recorded): the label is the index's to change, never a reason to move bytes."""
    cube = bundle(4)
    cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]), recompute=True, shards=True)
    before = _lock(cube)
    cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]))
    lock = _lock(cube)
    assert sorted(lock["shards"]) == sorted(before["shards"])
    for name, entry in lock["shards"].items():
        assert lock["files"][name] == before["files"][name]  # the shard: the same bytes
        index = json.loads((cube / entry["index"]).read_text())
        assert {m["provenance"]["kind"] for m in index["memories"].values()} == {"recorded"}
    assert lock["lock_version"] == 6


def test_a_remote_load_reads_each_index_whose_range_holds_the_id(pushed, hub, zoo, models,
                                                                bundle_factory):
    """After an append inside an older shard's range, one memory on demand costs one index per
    shard whose range holds its id, and its range: never the whole cube; compact brings it
    back to one index."""
    cube, size = pushed
    _add(cube, bundle_factory(8), "item-005")  # shard 4 [item-005] inside shard 2's range
    cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]))
    _push(hub, cube)
    remote = cubepack.open("me/cube@main", endpoint=hub.url, token=HUB_TOKEN)
    hub.stats.reset()
    remote.load("item-005", models["a"])
    assert sum(hub.stats.requests.values()) == 3  # shard 2's index, shard 4's, the range
    hub.stats.reset()
    remote.load("item-001", models["a"])  # a range no append reached: one index
    assert sum(hub.stats.requests.values()) == 2
    cubepack.compact(cube)
    _push(hub, cube)
    remote = cubepack.open("me/cube@main", endpoint=hub.url, token=HUB_TOKEN)
    hub.stats.reset()
    remote.load("item-005", models["a"])
    assert sum(hub.stats.requests.values()) == 2
