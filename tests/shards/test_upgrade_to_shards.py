"""``cubepack upgrade CUBE --model M --shards`` converts a cube of one file a memory to shards
(and ``--no-shards`` back), verified first, every memory's bytes unchanged (issue #40)."""

from __future__ import annotations

import cubepack
from cubepack._util import constants
from cubepack.format import _lock as lockfile
from cubepack.format.sections import shards as shardformat

from helpers import tree_bytes


def _lock(cube):
    return lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())


def test_upgrade_converts_to_shards_and_back(bundle, zoo, models):
    cube = bundle(5)
    cubepack.pack(cube, cube_id="me/up", model=str(zoo["a"]))
    memories = tree_bytes(cube / "activations")
    assert _lock(cube).version == 4
    result = cubepack.upgrade(cube, str(zoo["a"]), shards=True)
    lock = _lock(cube)
    assert lock.version == 6 and [s.memories for s in lock.shards.values()] == [5]
    assert not (cube / "activations").exists()
    resolved = shardformat.resolved(lock, shardformat.local_fetch(cube))
    assert sorted(resolved.activations) == sorted(n[:-len(constants.KV_SUFFIX)]
                                                  for n in memories)
    assert cubepack.verify(cube, model=str(zoo["a"])).ok
    assert result.unsigned == []
    again = cubepack.upgrade(cube, str(zoo["a"]))  # a sharded cube is current
    assert again.upgraded == [] and _lock(cube).digest == lock.digest
    cubepack.upgrade(cube, str(zoo["a"]), shards=False)
    assert _lock(cube).version == 4 and tree_bytes(cube / "activations") == memories


def test_the_cli_upgrades_to_shards(bundle, zoo):
    from click.testing import CliRunner

    from cubepack.cli import cli

    cube = bundle(5)
    cubepack.pack(cube, cube_id="me/up", model=str(zoo["a"]))
    run = CliRunner().invoke(cli, ["upgrade", str(cube), "--model", str(zoo["a"]),
                                   "--shard-size", "9KiB", "--json"])
    assert run.exit_code == 0, run.output
    assert len(_lock(cube).shards) == 3
