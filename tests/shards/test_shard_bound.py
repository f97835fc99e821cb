"""A cube's shard bound (``--shard-size``) is the cube's: recorded in ``cubepack.yaml``'s
``pack`` by the pack given it, and kept by every later pack, append, removal, compact and
upgrade unless a new ``--shard-size`` replaces it (docs/reference/cubepack-yaml.md,
docs/reference/shards.md). Here the bound holds two memories a shard, so any step that lays
three memories out at the default 2 GiB puts them in one shard past it."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from click.testing import CliRunner

import cubepack
from cubepack._util import constants
from cubepack.cli import cli
from cubepack.errors import FormatError, UsageError


def _lock(cube):
    return json.loads((cube / constants.LOCK_FILENAME).read_text())


def _recorded(cube):
    config = yaml.safe_load((cube / constants.CONFIG_FILENAME).read_text())
    return (config.get("pack") or {}).get("shard_size")


def _within(cube, bound):
    """Every shard of ``cube`` is within ``bound``, or a lone memory larger than it."""
    lock = _lock(cube)
    for path, entry in lock["shards"].items():
        size = lock["files"][path]["size"]
        assert size <= bound or entry["memories"] == 1, (path, size, bound)
    return lock


def _memory_size(cube):
    return next((cube / "activations").iterdir()).stat().st_size


def _append(cube, source, ids):
    (cube / "activations").mkdir(exist_ok=True)
    for item in ids:
        name = f"{item}.kv.safetensors"
        shutil.copy(source / "activations" / name, cube / "activations" / name)


def _held_back(bundle, ids):
    """A bundle of 8 memories without ``ids``, and a folder that keeps them."""
    cube = bundle(8)
    spare = cube.parent / "spare"
    (spare / "activations").mkdir(parents=True)
    for item in ids:
        shutil.move(cube / "activations" / f"{item}.kv.safetensors", spare / "activations")
    return cube, spare


LATER = ["pack", "append", "remove", "replace", "compact", "shards"]


@pytest.mark.parametrize("step", LATER)
def test_every_later_pack_keeps_the_bound_it_was_packed_with(bundle, zoo, step):
    later = ["item-005", "item-006", "item-007"]
    cube, spare = _held_back(bundle, later)
    bound = 2 * _memory_size(cube) + 100
    model = str(zoo["a"])
    cubepack.pack(cube, cube_id="me/cube", model=model, shard_size=bound)
    assert _recorded(cube) == bound
    if step == "pack":
        cubepack.pack(cube, cube_id="me/cube", model=model, shards=False)
        _append(cube, spare, later)
        cubepack.pack(cube, cube_id="me/cube", model=model, shard_size=bound)
        cubepack.pack(cube, cube_id="me/cube", model=model)
    elif step == "append":
        _append(cube, spare, later)  # three new memories: two shards at this bound
        cubepack.pack(cube, cube_id="me/cube", model=model)
    elif step == "remove":
        cubepack.pack(cube, cube_id="me/cube", model=model, remove=("item-000",))
        _append(cube, spare, later)
        cubepack.pack(cube, cube_id="me/cube", model=model)
    elif step == "replace":
        (cube / "activations").mkdir()
        shutil.copy(spare / "activations" / "item-005.kv.safetensors",
                    cube / "activations" / "item-001.kv.safetensors")
        shutil.copy(spare / "activations" / "item-006.kv.safetensors",
                    cube / "activations" / "item-002.kv.safetensors")
        shutil.copy(spare / "activations" / "item-007.kv.safetensors",
                    cube / "activations" / "item-003.kv.safetensors")
        cubepack.pack(cube, cube_id="me/cube", model=model,
                      remove=("item-001", "item-002", "item-003"))
    elif step == "compact":
        _append(cube, spare, later)
        cubepack.pack(cube, cube_id="me/cube", model=model,
                      remove=("item-000", "item-002", "item-004"))
        result = cubepack.compact(cube, above=0)
        assert result.changed and result.written
    else:
        _append(cube, spare, later)
        cubepack.pack(cube, cube_id="me/cube", model=model, shards=True)
    lock = _within(cube, bound)
    assert len(lock["shards"]) >= 3
    assert _recorded(cube) == bound
    assert cubepack.verify(cube, model=model).ok


def test_upgrade_to_shards_records_the_bound_a_later_pack_keeps(bundle, zoo):
    later = ["item-005", "item-006", "item-007"]
    cube, spare = _held_back(bundle, later)
    bound = 2 * _memory_size(cube) + 100
    model = str(zoo["a"])
    cubepack.pack(cube, cube_id="me/cube", model=model)
    cubepack.upgrade(cube, model, shard_size=bound)
    assert _recorded(cube) == bound
    _within(cube, bound)
    _append(cube, spare, later)
    cubepack.pack(cube, cube_id="me/cube", model=model)
    _within(cube, bound)
    assert _recorded(cube) == bound


def test_a_new_shard_size_replaces_the_bound_and_no_shards_drops_it(bundle, zoo):
    later = ["item-005", "item-006", "item-007"]
    cube, spare = _held_back(bundle, later)
    size = _memory_size(cube)
    model = str(zoo["a"])
    cubepack.pack(cube, cube_id="me/cube", model=model, shard_size=3 * size + 200)
    cubepack.pack(cube, cube_id="me/cube", model=model, shard_size=size)  # one a shard now
    assert _recorded(cube) == size
    _append(cube, spare, later)
    cubepack.pack(cube, cube_id="me/cube", model=model)
    lock = _lock(cube)
    assert [entry["memories"] for path, entry in sorted(lock["shards"].items())][-3:] == [1] * 3
    cubepack.pack(cube, cube_id="me/cube", model=model, shards=False)
    assert _recorded(cube) is None and "shards" not in _lock(cube)
    cubepack.pack(cube, cube_id="me/cube", model=model, shards=True)  # the default again
    assert _recorded(cube) is None and len(_lock(cube)["shards"]) == 1


def test_a_cube_packed_at_the_default_records_no_bound(bundle, zoo):
    cube = bundle(5)
    cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]), shards=True)
    assert _recorded(cube) is None
    assert "pack" not in yaml.safe_load((cube / constants.CONFIG_FILENAME).read_text())


def test_compact_with_a_smaller_shard_size_rewrites_the_shards_past_it(bundle, zoo):
    cube = bundle(8)
    size = _memory_size(cube)
    model = str(zoo["a"])
    cubepack.pack(cube, cube_id="me/cube", model=model, shard_size=4 * size + 300)
    assert len(_lock(cube)["shards"]) == 2
    nothing = cubepack.compact(cube)  # within its own bound: nothing to do
    assert not nothing.changed
    bound = 2 * size + 100
    result = CliRunner().invoke(cli, ["compact", str(cube), "--shard-size", str(bound),
                                      "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["changed"] and len(data["removed"]) == 2 and len(data["written"]) == 4
    _within(cube, bound)
    assert _recorded(cube) == bound
    assert cubepack.verify(cube, model=model).ok


def test_compact_keeps_a_lone_memory_larger_than_the_bound(bundle, zoo):
    cube = bundle(3)
    model = str(zoo["a"])
    cubepack.pack(cube, cube_id="me/cube", model=model, shard_size=1)  # one a shard
    before = _lock(cube)
    result = cubepack.compact(cube)
    assert not result.changed and _lock(cube) == before


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "'1GiB'", "true", "[1]"])
def test_a_recorded_bound_that_is_not_a_size_is_refused_naming_the_fix(bundle, zoo, value):
    cube = bundle(3)
    model = str(zoo["a"])
    cubepack.pack(cube, cube_id="me/cube", model=model, shard_size=10**6)
    path = cube / constants.CONFIG_FILENAME
    path.write_text(path.read_text().replace("shard_size: 1000000", f"shard_size: {value}"))
    before = {p.name: p.read_bytes() for p in cube.rglob("*") if p.is_file()}
    with pytest.raises(FormatError, match=r"--shard-size SIZE"):
        cubepack.pack(cube, cube_id="me/cube", model=model)
    assert {p.name: p.read_bytes() for p in cube.rglob("*") if p.is_file()} == before
    cubepack.pack(cube, cube_id="me/cube", model=model, shard_size=2 * 10**6)  # the fix
    assert _recorded(cube) == 2 * 10**6


def test_a_pack_mapping_that_is_not_a_mapping_is_refused(bundle, zoo):
    cube = bundle(3)
    model = str(zoo["a"])
    cubepack.pack(cube, cube_id="me/cube", model=model, shard_size=10**6)
    path = cube / constants.CONFIG_FILENAME
    text = path.read_text()
    path.write_text(text.replace("pack:\n  shard_size: 1000000\n", "pack: 1000000\n"))
    assert path.read_text() != text
    with pytest.raises(FormatError, match="'pack' must be a mapping"):
        cubepack.pack(cube, cube_id="me/cube", model=model)


def test_compact_refuses_a_shard_size_that_is_not_a_size(bundle, zoo):
    cube = bundle(3)
    cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]), shards=True)
    with pytest.raises(UsageError, match="positive number of bytes"):
        cubepack.compact(cube, shard_size=0)
