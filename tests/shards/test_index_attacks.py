"""A shard's index is refused when it points outside its shard, overlaps two memories, lists a
memory twice, or disagrees with the lock's digest (issue #40): each planted, as someone with
write access to the cube would (the lock resealed where the attack needs it)."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

import cubepack
from cubepack._util import canonical, constants
from cubepack.errors import FormatError, IntegrityError
from cubepack.format import _lock as lockfile
from cubepack.format.sections import shards as shardformat
from cubepack.kinds.activations._shards import memory_bytes
from helpers import reseal_lock

INDEX0 = "shards/activations-00000.index.json"
INDEX1 = "shards/activations-00001.index.json"
SHARD0 = "shards/activations-00000.kvshard"


@pytest.fixture
def cube(sharded, tmp_path):
    target = tmp_path / "cube"
    shutil.copytree(sharded, target)
    return target


def _file_entry(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def plant(cube, name: str, text: str | bytes, *, reseal: bool = True) -> None:
    """Write ``text`` as the cube's file ``name``; with ``reseal``, the lock lists its bytes."""
    data = text.encode() if isinstance(text, str) else text
    (cube / name).write_bytes(data)
    if reseal:
        reseal_lock(cube, lambda lock: lock["files"].__setitem__(name, _file_entry(data)))


def edit_index(cube, name: str, change, **kwargs) -> None:
    index = json.loads((cube / name).read_text())
    change(index)
    plant(cube, name, canonical.dumps(index, compact=True), **kwargs)


def refusal(cube, zoo) -> str:
    """The shards check's refusal in verify's report, and the resolver's, which must agree."""
    report = cubepack.verify(cube, model=str(zoo["a"]), raise_on_failure=False)
    assert not report.ok
    failed = [c for c in report.checks if c.ok is False]
    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    with pytest.raises(FormatError) as caught:
        shardformat.resolved(lock, shardformat.local_fetch(cube))
    assert failed, report.to_dict()
    return " | ".join(f"{c.name}: {c.detail}" for c in failed) + " || " + str(caught.value)


def test_the_planted_cube_is_sound(cube, zoo):
    assert cubepack.verify(cube, model=str(zoo["a"])).ok


def test_index_pointing_outside_its_shard(cube, zoo):
    def outside(index):
        last = max(index["memories"].values(), key=lambda m: m["offset"])
        last["length"] += 64
    edit_index(cube, INDEX0, outside)
    assert "points outside its shard" in refusal(cube, zoo)


def test_index_overlapping_two_memories(cube, zoo):
    def overlap(index):
        second = max(index["memories"].values(), key=lambda m: m["offset"])
        second["offset"] -= 64
    edit_index(cube, INDEX0, overlap)
    assert "overlap memory 'item-000'" in refusal(cube, zoo)


def test_index_hiding_bytes_between_memories(cube, zoo):
    def gap(index):
        first = min(index["memories"].values(), key=lambda m: m["offset"])
        first["length"] -= 64
    edit_index(cube, INDEX0, gap)
    found = refusal(cube, zoo)
    assert "places memory 'item-001'" in found or "hashes to" in found


def test_index_listing_a_memory_twice(cube, zoo):
    text = (cube / INDEX0).read_text()
    entry = json.dumps(json.loads(text)["memories"]["item-000"], separators=(",", ":"),
                       sort_keys=True)
    doubled = text.replace('"memories":{', '"memories":{"item-000":' + entry + ",", 1)
    assert doubled != text
    plant(cube, INDEX0, doubled)
    assert "lists each memory once" in refusal(cube, zoo)


def test_a_memory_in_two_shards(cube, zoo):
    """Shard 1's index relabels its first memory with an id shard 0 holds: refused by the
    lock's id ranges (disjoint) before any load could pick either."""
    def steal(index):
        memories = index["memories"]
        memories["item-001"] = memories.pop("item-002")
    edit_index(cube, INDEX1, steal)
    assert "holds ids 'item-001' to 'item-003'; the lock says 'item-002' to 'item-003'" \
        in refusal(cube, zoo)


def test_lock_with_overlapping_shard_ranges(cube):
    def overlap(lock):
        lock["shards"]["shards/activations-00001.kvshard"]["first"] = "item-001"
    reseal_lock(cube, overlap)
    with pytest.raises(FormatError, match="inside shard 'shards/activations-00000.kvshard'"):
        lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())


def test_index_disagreeing_with_the_lock_digest(cube, zoo):
    edit_index(cube, INDEX0, lambda index: index["memories"]["item-000"].update(
        token_count=99), reseal=False)
    report = cubepack.verify(cube, model=str(zoo["a"]), raise_on_failure=False)
    assert not report.ok
    assert any(c.name in ("size", "sha256") and c.subject == INDEX0 and c.ok is False
               for c in report.checks)
    assert any(c.name == "shards" and c.ok is None for c in report.checks)
    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    with pytest.raises(FormatError, match=f"{INDEX0} .* hashes to .*, expected"):
        shardformat.resolved(lock, shardformat.local_fetch(cube))


def test_index_naming_another_shard_digest(cube, zoo):
    edit_index(cube, INDEX0, lambda index: index["shard"].update(sha256="0" * 64))
    assert "disagrees with the lock on its shard" in refusal(cube, zoo)


def test_memories_swapped_inside_a_shard(cube, zoo):
    """Two memories' bytes swapped (same length) and every digest above them resealed but the
    index's memory digests: each range's sha256 refuses it."""
    index = json.loads((cube / INDEX0).read_text())
    first, second = sorted(index["memories"].values(), key=lambda m: m["offset"])
    assert first["length"] == second["length"]
    data = bytearray((cube / SHARD0).read_bytes())
    a = bytes(data[first["offset"]:first["offset"] + first["length"]])
    b = bytes(data[second["offset"]:second["offset"] + second["length"]])
    data[first["offset"]:first["offset"] + first["length"]] = b
    data[second["offset"]:second["offset"] + second["length"]] = a
    plant(cube, SHARD0, bytes(data))
    edit_index(cube, INDEX0, lambda index: index["shard"].update(
        sha256=hashlib.sha256(bytes(data)).hexdigest()))
    report = cubepack.verify(cube, model=str(zoo["a"]), raise_on_failure=False)
    failed = [f"{c.name}: {c.detail}" for c in report.checks if c.ok is False]
    assert len(failed) == 1 and failed[0].startswith("shards: memory 'item-000'") \
        and "hashes to" in failed[0], failed
    lock = shardformat.resolved(lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes()),
                                shardformat.local_fetch(cube))
    with pytest.raises(IntegrityError, match="memory 'item-000'.*its index says"):
        memory_bytes(cube, lock.activations["item-000"])


def test_ids_one_once_normalised_across_shards(cube, zoo):
    """Shard 2's memory renamed item-00３ (a fullwidth digit): NFKC makes it item-003, which
    shard 1 holds. The ranges stay disjoint (code points), so only the id rule refuses it."""
    odd = "item-00\uff13"
    edit_index(cube, "shards/activations-00002.index.json",
               lambda index: index["memories"].__setitem__(odd,
                                                           index["memories"].pop("item-004")))
    reseal_lock(cube, lambda lock: lock["shards"]["shards/activations-00002.kvshard"].update(
        first=odd, last=odd))
    assert "differ only by Unicode normalisation" in refusal(cube, zoo)


def test_an_index_too_large_is_never_fetched(cube):
    """The lock says the index is above the limit: refused before a byte is fetched."""
    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    shard = next(iter(lock.shards.values()))
    big = shardformat.Shard(shard.path, shard.index, shard.first, shard.last, shard.memories,
                            shard.locator, shardformat.Locator(
                                shard.index, 0, shardformat.MAX_INDEX_BYTES + 1, "0" * 64))
    fetched = []
    with pytest.raises(FormatError, match="above the .*-byte limit of an index"):
        shardformat.load_index(big, lambda locator: fetched.append(locator) or b"",
                               lock.models)
    assert fetched == []


def test_a_lock_counting_more_memories_than_a_shard_holds(cube):
    reseal_lock(cube, lambda lock: lock["shards"][SHARD0].update(memories=1001))
    with pytest.raises(FormatError, match="memories must be an integer from 1 to 1000"):
        lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())


def test_a_stray_shard_in_an_unsharded_folder_is_refused_by_pack(bundle, zoo, sharded):
    """A shard file no lock lists (copied in from another cube) is never sealed as this
    cube's: pack refuses it, naming it, and the folder is left as it was."""
    from helpers import tree_bytes

    folder = bundle(3)
    (folder / "shards").mkdir()
    shutil.copy(sharded / SHARD0, folder / SHARD0)
    before = tree_bytes(folder)
    with pytest.raises(cubepack.UsageError, match="activations-00000.kvshard is a shard .* "
                       "that no lock of this cube lists"):
        cubepack.pack(folder, cube_id="me/stray", model=str(zoo["a"]))
    assert tree_bytes(folder) == before


@pytest.mark.parametrize("bad", [
    "0" * 15, "0" * 17, "0" * 16 + "\n", "A" * 16, "g" * 16, 7, None, ["0" * 16],
    ("0" * 8, "0" * 24),  # two values whose lengths add up to two checksums' (joined: 32)
], ids=repr)
def test_an_index_tensor_checksum_that_is_not_16_hex_digits_is_refused(cube, zoo, bad):
    def change(index):
        tensors = next(iter(index["memories"].values()))["checksums"]["tensors"]
        names = sorted(tensors)
        if isinstance(bad, tuple):
            tensors[names[0]], tensors[names[1]] = bad
        else:
            tensors[names[-1]] = bad
    edit_index(cube, INDEX0, change)
    assert "checksums must be the KV header's record" in refusal(cube, zoo)
