"""pack shards a cube's activation memories (issue #40 item 1): the layout, the lock, the
index; verify checks them."""

from __future__ import annotations

import json
import shutil

import pytest

import cubepack
from cubepack._util import constants
from cubepack.format import _lock as lockfile
from cubepack.format.sections import shards as shardformat

from helpers import without_kv_id


def test_pack_shards_and_verifies(bundle, zoo):
    cube = bundle(5)
    sizes = sorted((cube / "activations").iterdir())
    bound = sizes[0].stat().st_size * 2 + 100  # two memories a shard
    result = cubepack.pack(cube, cube_id="me/sharded", model=str(zoo["a"]), shard_size=bound)
    assert sorted(result.activations) == [f"item-{i:03d}" for i in range(5)]
    assert not (cube / "activations").exists() or not any((cube / "activations").iterdir())
    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    assert lock.version == 6 and not lock.activations
    assert [s.memories for s in lock.shards.values()] == [2, 2, 1]
    assert [(s.first, s.last) for s in lock.shards.values()] == [
        ("item-000", "item-001"), ("item-002", "item-003"), ("item-004", "item-004")]
    report = cubepack.verify(cube, model=str(zoo["a"]))
    assert report.ok, report.to_dict()


def test_verify_checks_each_shard_and_memory(bundle, zoo):
    cube = bundle(5)
    cubepack.pack(cube, cube_id="me/sharded", model=str(zoo["a"]), shards=True)
    report = cubepack.verify(cube, model=str(zoo["a"]))
    assert report.ok
    names = [(c.name, c.subject, c.ok) for c in report.checks]
    assert ("shards", "shards/activations-00000.index.json (shards/activations-00000.kvshard)",
            True) in names
    headers = [s for n, s, ok in names if n == "kv header" and ok]
    assert len(headers) == 5
    assert len([1 for n, s, ok in names if n == "kv checksums" and ok]) == 5


def test_pack_shards_only_above_100_memories_unasked(bundle, zoo, tmp_path):
    """The documented default (docs/reference/shards.md): more than 100 memories, sharded;
    100 or fewer, one file a memory (lock version 4, read by older cubepacks)."""
    from cubepack.kinds.activations._shards import SHARD_ABOVE

    assert SHARD_ABOVE == 100
    small = bundle(5)
    cubepack.pack(small, cube_id="me/small", model=str(zoo["a"]))
    assert lockfile.parse((small / constants.LOCK_FILENAME).read_bytes()).version == 4
    many = tmp_path / "many"
    (many / "activations").mkdir(parents=True)
    template = next((small / "activations").iterdir())
    for count in (100, 101):
        shutil.rmtree(many / "activations")
        (many / "activations").mkdir()
        for index in range(count):  # one cache under many names: ids from the file names
            data = template.read_bytes()
            (many / "activations" / f"m{index:03d}.kv.safetensors").write_bytes(
                without_kv_id(data))
        for stale in ("cubepack.lock", "cubepack.yaml", "README.md"):
            (many / stale).unlink(missing_ok=True)
        shutil.rmtree(many / "shards", ignore_errors=True)
        cubepack.pack(many, cube_id="me/many", model=str(zoo["a"]))
        lock = lockfile.parse((many / constants.LOCK_FILENAME).read_bytes())
        assert (lock.version, len(lock.shards)) == ((4, 0) if count == 100 else (6, 1))


def test_a_memory_above_the_bound_gets_a_shard_of_its_own(bundle_factory, zoo, tmp_path):
    cube = tmp_path / "cube"
    shutil.copytree(bundle_factory(3), cube)
    big = bundle_factory(1, tokens=40)
    shutil.copy(next((big / "activations").iterdir()),
                cube / "activations" / "big.kv.safetensors")
    small = (cube / "activations" / "item-001.kv.safetensors").stat().st_size
    large = (cube / "activations" / "big.kv.safetensors").stat().st_size
    assert large > 3 * small
    (cube / "activations" / "item-000.kv.safetensors").unlink()  # big's id is item-000 too
    result = cubepack.pack(cube, cube_id="me/big", model=str(zoo["a"]),
                           shard_size=2 * small + 64)
    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    assert [(s.first, s.memories) for s in lock.shards.values()] == [
        ("item-000", 1), ("item-001", 2)]
    assert lock.files["shards/activations-00000.kvshard"].size == large
    assert len(result.activations) == 3
    assert cubepack.verify(cube, model=str(zoo["a"])).ok


def test_no_shards_turns_a_sharded_cube_back(bundle, zoo):
    from helpers import tree_bytes

    cube = bundle(5)
    before = tree_bytes(cube / "activations")
    cubepack.pack(cube, cube_id="me/back", model=str(zoo["a"]), shards=True)
    again = cubepack.pack(cube, model=str(zoo["a"]))  # sharded already: stays sharded
    assert not again.changed
    cubepack.pack(cube, model=str(zoo["a"]), shards=False)
    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    assert lock.version == 4 and not (cube / "shards").exists()
    assert tree_bytes(cube / "activations") == before  # each memory's bytes, unchanged
    assert cubepack.verify(cube, model=str(zoo["a"])).ok


def test_the_cli_takes_a_shard_size(bundle, zoo):
    from click.testing import CliRunner

    from cubepack.cli import cli

    cube = bundle(5)
    size = next((cube / "activations").iterdir()).stat().st_size
    run = CliRunner().invoke(cli, ["pack", str(cube), "--cube-id", "me/cli", "--model",
                                   str(zoo["a"]), "--shard-size", f"{size * 3}B", "--json"])
    assert run.exit_code == 0, run.output
    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    assert [s.memories for s in lock.shards.values()] == [2, 2, 1]
    bad = CliRunner().invoke(cli, ["pack", str(cube), "--shard-size", "lots"])
    assert bad.exit_code == 2 and "is no size" in bad.output


def test_a_shard_holds_at_most_max_memories(bundle, zoo, monkeypatch):
    """The count bound (docs/reference/shards.md: at most 1,000 a shard), lowered to 2 here."""
    monkeypatch.setattr(shardformat, "MAX_SHARD_MEMORIES", 2)
    cube = bundle(5)
    cubepack.pack(cube, cube_id="me/count", model=str(zoo["a"]), shards=True)
    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    assert [s.memories for s in lock.shards.values()] == [2, 2, 1]
    monkeypatch.undo()
    assert shardformat.MAX_SHARD_MEMORIES == 1000


def test_a_kv_file_beside_the_shard_holding_its_item_is_refused(bundle, zoo):
    """A sharded cube with a KV file added under the name of an item a shard holds: pack
    neither keeps the shard's nor silently takes the new one; it refuses, naming both, and
    the folder is left as it was."""
    from helpers import tree_bytes

    cube = bundle(3)
    spare = (cube / "activations" / "item-001.kv.safetensors").read_bytes()
    cubepack.pack(cube, cube_id="me/both", model=str(zoo["a"]), shards=True)
    (cube / "activations").mkdir(exist_ok=True)
    (cube / "activations" / "item-001.kv.safetensors").write_bytes(spare)
    before = tree_bytes(cube)
    with pytest.raises(cubepack.UsageError, match="item-001.*both"):
        cubepack.pack(cube, model=str(zoo["a"]))
    assert tree_bytes(cube) == before


def test_shard_size_with_no_shards_is_a_contradiction(bundle, zoo):
    cube = bundle(3)
    with pytest.raises(cubepack.UsageError, match="shard_size"):
        cubepack.pack(cube, cube_id="me/x", model=str(zoo["a"]), shards=False, shard_size=4096)
