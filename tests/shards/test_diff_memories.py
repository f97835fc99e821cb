"""``cubepack diff`` per memory on sharded cubes (issue #40 item 1): memories added, removed
and changed by digest, read from the shard indexes (an index both cubes hold, by digest, is not
read at all) and never from the shards' bytes."""

from __future__ import annotations

import json
import shutil

import cubepack
from cubepack.cli import cli


def _bound(bundle_factory):
    """Two 5-token memories and some to spare: one bound for both cubes."""
    largest = max(path.stat().st_size
                  for path in (bundle_factory(6, tokens=5) / "activations").iterdir())
    return 2 * largest + 100


def _cubes(bundle, bundle_factory, zoo):
    """(old, new): old holds items 000-004, new has item-004 removed, item-005 added and
    item-001 replaced by a 5-token memory; items 002 and 003 the same bytes in the same shard
    (shard 1: the same index in both)."""
    bound = _bound(bundle_factory)
    old = bundle(5)
    cubepack.pack(old, cube_id="me/sharded", model=str(zoo["a"]), shard_size=bound)
    new = bundle(6)
    (new / "activations" / "item-004.kv.safetensors").unlink()
    shutil.copy(bundle_factory(6, tokens=5) / "activations" / "item-001.kv.safetensors",
                new / "activations" / "item-001.kv.safetensors")
    cubepack.pack(new, cube_id="me/sharded", model=str(zoo["a"]), shard_size=bound)
    return old, new


def _without_shards(cube, tmp_path, name):
    """A copy of ``cube`` whose shards are gone: diff must not need their bytes."""
    target = tmp_path / name
    shutil.copytree(cube, target)
    for shard in (target / "shards").glob("*.kvshard"):
        shard.unlink()
    return target


def test_diff_names_each_memory_added_removed_and_changed_by_digest(bundle, bundle_factory,
                                                                    zoo, tmp_path):
    old, new = _cubes(bundle, bundle_factory, zoo)
    assert (old / "shards/activations-00001.index.json").read_bytes() == \
        (new / "shards/activations-00001.index.json").read_bytes()
    found = cubepack.diff(_without_shards(old, tmp_path, "a"),
                          _without_shards(new, tmp_path, "b"))["memories"]
    assert found["added"] == ["item-005"] and found["removed"] == ["item-004"]
    assert list(found["changed"]) == ["item-001"]
    fields = {change["field"] for change in found["changed"]["item-001"]}
    assert {"sha256", "token_count"} <= fields
    assert found["unchanged"] == 3  # item-000, and shard 1's two (its index not read)
    assert found["indexes_read"] == 4  # shards 0 and 2 of each side


def test_the_same_memories_one_file_each_or_sharded_differ_in_nothing(sharded, bundle, zoo):
    plain = bundle(5)
    cubepack.pack(plain, cube_id="me/sharded", model=str(zoo["a"]))
    found = cubepack.diff(plain, sharded)["memories"]
    assert (found["added"], found["removed"], found["changed"]) == ([], [], {})
    assert found["unchanged"] == 5


def test_the_cli_prints_each_memory(bundle, bundle_factory, zoo):
    from click.testing import CliRunner

    old, new = _cubes(bundle, bundle_factory, zoo)
    result = CliRunner().invoke(cli, ["diff", str(old), str(new)])
    assert result.exit_code == 0, result.output
    assert "memory added: item-005" in result.output
    assert "memory removed: item-004" in result.output
    assert "memory changed: item-001" in result.output
    data = json.loads(CliRunner().invoke(cli, ["diff", str(old), str(new),
                                               "--json"]).output)
    assert data["memories"]["added"] == ["item-005"]


def test_two_lock_files_compare_no_memory(sharded, tmp_path):
    """Lock files alone hold no index: the memories are not compared (None), and say so."""
    found = cubepack.diff(sharded / "cubepack.lock", sharded / "cubepack.lock")
    assert found["memories"] is None
