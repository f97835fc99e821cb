"""Attacks on incremental packs (issue #40 item 3), each planted as someone with write access
to the cube would (the lock resealed where the attack needs it): an index whose memory points
into dead bytes, a lock whose dead count lies, a memory listed in two shards after an append,
a version-6 lock with an appended layout, a kept shard whose dead bytes were changed, and the
old bytes of a replaced memory asked for by range."""

from __future__ import annotations

import json
import shutil

import pytest

import cubepack
from cubepack._util import canonical, constants
from cubepack.errors import FormatError, IntegrityError, UsageError
from cubepack.format import _lock as lockfile
from cubepack.format.sections import shards as shardformat

from helpers import reseal_lock

SHARD1 = "shards/activations-00001.kvshard"
INDEX1 = "shards/activations-00001.index.json"


def _sha(data: bytes) -> dict:
    import hashlib

    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _write_index(cube, name, index):
    data = canonical.dumps(index, compact=True).encode()
    (cube / name).write_bytes(data)
    reseal_lock(cube, lambda lock: lock["files"].__setitem__(name, _sha(data)))


def _refused(cube, zoo, match):
    report = cubepack.verify(cube, model=str(zoo["a"]), raise_on_failure=False)
    assert not report.ok
    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    with pytest.raises(FormatError, match=match):
        shardformat.resolved(lock, shardformat.local_fetch(cube))


@pytest.fixture
def removed(sharded, tmp_path, zoo):
    """The 5-memory cube (two a shard) with item-002 removed: shard 1 holds item-003 and
    item-002's bytes, dead; lock version 7."""
    cube = tmp_path / "cube"
    shutil.copytree(sharded, cube)
    cubepack.pack(cube, cube_id="me/sharded", model=str(zoo["a"]), remove=("item-002",))
    assert json.loads((cube / constants.LOCK_FILENAME).read_text())["lock_version"] == 7
    return cube


def test_an_index_pointing_a_memory_into_dead_bytes_is_refused(removed, zoo):
    index = json.loads((removed / INDEX1).read_text())
    dead_at, dead_length = index["dead"][0]
    # item-003 claims the dead range (the removed memory's bytes): two tiles over one range
    index["memories"]["item-003"].update(offset=dead_at, length=dead_length)
    _write_index(removed, INDEX1, index)
    _refused(removed, zoo, "overlap|places memory|ends its last")


def test_an_index_hiding_its_dead_range_is_refused(removed, zoo):
    index = json.loads((removed / INDEX1).read_text())
    del index["dead"]
    index["version"] = 1  # the dead bytes become bytes no record accounts for
    _write_index(removed, INDEX1, index)
    _refused(removed, zoo, "places memory|dead bytes")


def test_a_lock_whose_dead_count_lies_is_refused(removed, zoo):
    reseal_lock(removed, lambda lock: lock["shards"][SHARD1].__setitem__("dead", 0))
    _refused(removed, zoo, "dead bytes")


def _as_version(cube, version, change=lambda lock: None):
    """Reseal the lock at ``version`` (build_lock would pick the version its sections need)."""
    path = cube / constants.LOCK_FILENAME
    lock = json.loads(path.read_text())
    change(lock)
    lock.pop("digest")
    lock["lock_version"] = version
    lock["content_digest"] = lockfile.content_digest(lock)
    lock["digest"] = canonical.digest(lock)
    path.write_text(lockfile.dumps(lock))


def test_a_version_6_lock_with_dead_bytes_or_overlap_is_refused(removed):
    _as_version(removed, 6)
    with pytest.raises(FormatError, match="exactly the keys"):
        lockfile.parse((removed / constants.LOCK_FILENAME).read_bytes())

    def without_dead(lock):
        for entry in lock["shards"].values():
            entry.pop("dead")
        lock["shards"][SHARD1]["first"] = "item-000"  # overlaps shard 0
    _as_version(removed, 6, without_dead)
    with pytest.raises(FormatError, match="disjoint"):
        lockfile.parse((removed / constants.LOCK_FILENAME).read_bytes())


def test_a_version_7_entry_without_its_dead_count_is_refused(removed):
    _as_version(removed, 7, lambda lock: lock["shards"][SHARD1].pop("dead"))
    with pytest.raises(FormatError, match="exactly the keys"):
        lockfile.parse((removed / constants.LOCK_FILENAME).read_bytes())


def test_a_memory_listed_in_two_shards_after_an_append_is_refused(removed, zoo, models,
                                                                  bundle_factory):
    """The appended shard's index lists item-003 (which shard 1 holds) in place of item-002:
    its range and digest still check, only the duplicate is wrong. Verify and a load of that
    memory refuse it, whichever shard the load would have read first."""
    (removed / "activations").mkdir(exist_ok=True)
    shutil.copy(bundle_factory(5) / "activations" / "item-002.kv.safetensors",
                removed / "activations" / "item-002.kv.safetensors")
    cubepack.pack(removed, cube_id="me/sharded", model=str(zoo["a"]))
    lock = json.loads((removed / constants.LOCK_FILENAME).read_text())
    appended = "shards/activations-00003.kvshard"
    assert (lock["shards"][appended]["first"], lock["shards"][appended]["last"]) == \
        ("item-002", "item-002")
    name = lock["shards"][appended]["index"]
    index = json.loads((removed / name).read_text())
    index["memories"] = {"item-003": index["memories"]["item-002"]}
    _write_index(removed, name, index)
    reseal_lock(removed, lambda lk: lk["shards"][appended].update(first="item-003",
                                                                  last="item-003"))
    _refused(removed, zoo, "listed once")
    with pytest.raises(FormatError, match="listed once"):
        cubepack.load_kv_cache(removed, models["a"], item="item-003")


def test_a_kept_shard_whose_dead_bytes_changed_is_not_carried(removed, zoo, bundle_factory):
    data = bytearray((removed / SHARD1).read_bytes())
    data[10] ^= 0xFF  # inside item-002's dead range: no index reads it, the lock hashes it
    (removed / SHARD1).write_bytes(bytes(data))
    (removed / "activations").mkdir(exist_ok=True)
    shutil.copy(bundle_factory(5) / "activations" / "item-002.kv.safetensors",
                removed / "activations" / "item-002.kv.safetensors")
    before = (removed / constants.LOCK_FILENAME).read_bytes()
    with pytest.raises(IntegrityError, match="changed since it was packed"):
        cubepack.pack(removed, cube_id="me/sharded", model=str(zoo["a"]))
    assert (removed / constants.LOCK_FILENAME).read_bytes() == before


def test_a_removed_memory_is_never_loaded_from_its_dead_bytes(removed, zoo, models, hub):
    from data import HUB_TOKEN

    with pytest.raises(UsageError, match="no activation memory 'item-002'"):
        cubepack.load_kv_cache(removed, models["a"], item="item-002")
    cubepack.push(removed, "me/cube", endpoint=hub.url, token=HUB_TOKEN, allow_local_paths=True)
    remote = cubepack.open("me/cube", endpoint=hub.url, token=HUB_TOKEN)
    with pytest.raises(UsageError):
        remote.load("item-002", models["a"])
    assert remote.load("item-003", models["a"]).get_seq_length() > 0


def test_upgrade_leaves_an_appended_cube_as_it_is(removed, zoo):
    """A lock of version 7 is current: upgrade has nothing to do (no re-pack)."""
    folder = removed.stat().st_ino  # a re-pack swaps in a new folder
    result = cubepack.upgrade(removed, str(zoo["a"]))
    assert not result.upgraded
    assert removed.stat().st_ino == folder
