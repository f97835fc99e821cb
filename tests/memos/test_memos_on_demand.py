"""The MemOS hook loads a remote cube's activations on first use (issue #40 item 2), with the
real MemoryOS package and the real huggingface_hub client against the local endpoint:
``init_from_remote_repo(..., on_demand=True)`` fetches the lock and the cube's other files, no
memory; each memory is fetched (its index once a shard, its range) when MemOS first uses it,
and checked as a whole load checks it. Requests and bytes are counted at the endpoint."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack
import cubepack.memos as hook
from cubepack import HubError, IdentityMismatch, IntegrityError, UsageError
from cubepack._util import canonical, constants
from cubepack.format import _lock as lockfile
from cubepack.hub import push
from cubepack.testing.hub import InstrumentedHub, upload_folder

from helpers import all_equal, continue_greedy, memos_kv_config

TEXTS = ["The user likes green tea.", "He walks every morning.", "Paris is lovely in May.",
         "Her cat is called Miso.", "They met in Lyon."]
QUESTION = [{"role": "user", "content": "What does the user drink?"}]


memos_config = memos_kv_config  # one owner: tests/support/helpers.py


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with InstrumentedHub(tmp_path_factory.mktemp("hub-root")) as server:
        yield server


@pytest.fixture(scope="module")
def published(hub, zoo, tmp_path_factory):
    """Model A on the endpoint; a MemOS cube of 5 memories built from its snapshot, packed
    two a shard (shards 0, 1, 2) and pushed; the same cube one file a memory, pushed too."""
    from huggingface_hub import snapshot_download
    from memos.mem_cube.general import GeneralMemCube

    hook.uninstall()
    hook.install(require_pin=False)
    model_commit = upload_folder(hub.url, "tiny-org/model-a", zoo["a"])
    snapshot = snapshot_download("tiny-org/model-a", revision=model_commit, endpoint=hub.url)
    cube = GeneralMemCube(memos_config(snapshot))
    items = [cube.act_mem.extract(text) for text in TEXTS]
    for number, item in enumerate(items):
        item.id = f"item-{number}"
    cube.act_mem.add(items)
    plain = hook.pack_cube(cube, tmp_path_factory.mktemp("plain") / "cube")
    sharded = tmp_path_factory.mktemp("sharded") / "cube"
    shutil.copytree(plain, sharded)
    largest = max(path.stat().st_size for path in (plain / "activations").iterdir())
    cubepack.pack(sharded, shard_size=2 * largest + 200)
    lock = lockfile.parse((sharded / constants.LOCK_FILENAME).read_bytes())
    assert len(lock.shards) == 3
    yield {"cube": cube, "items": {item.id: item for item in items}, "sharded": sharded,
           "plain": plain, "sha": push(sharded, "ns/cube", endpoint=hub.url).commit_sha,
           "plain_sha": push(plain, "ns/plain", endpoint=hub.url).commit_sha}
    hook.uninstall()


def _requests(hub, part: str = "") -> int:
    return sum(count for key, count in hub.stats.requests.items() if part in key)


def _open(hub, published, repo="ns/cube", sha=None, **options):
    return hook.init_from_remote_repo(f"{repo}@{sha or published['sha']}", endpoint=hub.url,
                                      on_demand=True, **options)


def _size(folder, name):
    return (folder / name).stat().st_size


def test_opening_fetches_no_memory_and_a_get_fetches_its_index_and_range(hub, published):
    folder = published["sharded"]
    hub.stats.reset()
    loaded = _open(hub, published)
    lock = lockfile.parse((folder / constants.LOCK_FILENAME).read_bytes())
    others = [name for name in lock.files if not name.startswith("shards/")]
    # the lock (one GET at the commit the hook resolved: no HEAD) and each other file
    # (config.json, cubepack.yaml...): no shard byte; and, as a whole load, the pinned
    # model's snapshot (its revision asked of the API)
    assert _requests(hub, "/ns/cube/") == 1 + len(others)
    assert _requests(hub) == 2 + len(others) and not _requests(hub, "shards/")
    expected = _size(folder, constants.LOCK_FILENAME) + sum(_size(folder, name)
                                                            for name in others)
    assert expected <= hub.stats.sent_bytes < expected + 4096  # + the model API's answer
    assert loaded.cubepack.loaded == [] and loaded.cubepack.commit_sha == published["sha"]
    assert len(loaded.act_mem.kv_cache_memories) == 5  # the lock's count: nothing fetched
    assert _requests(hub) == 2 + len(others)

    hub.stats.reset()
    item = loaded.act_mem.get("item-2")
    shard = lock.shards["shards/activations-00001.kvshard"]
    index = json.loads((folder / shard.index).read_text())
    assert _requests(hub) == 2  # its shard's index, its range
    assert hub.stats.sent_bytes == _size(folder, shard.index) + \
        index["memories"]["item-2"]["length"]
    assert loaded.cubepack.loaded == ["item-2"]
    original = published["items"]["item-2"]
    model = loaded.act_mem.llm.model
    assert all_equal(continue_greedy(published["cube"].act_mem.llm.model, original.memory, 40, 4),
                     continue_greedy(model, item.memory, 40, 4))
    hub.stats.reset()
    assert loaded.act_mem.get("item-2") is item  # used once, fetched once
    loaded.act_mem.get("item-3")  # the same shard: its index is not fetched again
    assert _requests(hub) == 1
    assert loaded.act_mem.get("item-9") is None and _requests(hub) == 1  # not in any range


def test_every_use_path_of_memos_fetches_and_checks(hub, published):
    """get, get_by_ids, get_cache, get_all and the dict MemOS's chat reads directly."""
    loaded = _open(hub, published)
    memory = loaded.act_mem
    assert memory.get_by_ids(["item-0", "nope"])[1] is None
    assert loaded.cubepack.loaded == ["item-0"]
    merged = memory.get_cache(["item-0", "item-1"])
    assert merged is not None and loaded.cubepack.loaded == ["item-0", "item-1"]
    first = next(iter(memory.kv_cache_memories.values()))  # SimpleMemChat's read
    assert first.id == "item-0"
    assert sorted(item.id for item in memory.get_all()) == sorted(published["items"])
    assert sorted(loaded.cubepack.loaded) == sorted(published["items"])
    answer = memory.llm.generate(QUESTION, past_key_values=copy.deepcopy(
        memory.get("item-0").memory))
    assert isinstance(answer, str)


def test_a_cube_of_one_file_a_memory_loads_on_demand_too(hub, published):
    loaded = _open(hub, published, repo="ns/plain", sha=published["plain_sha"])
    hub.stats.reset()
    loaded.act_mem.get("item-4")
    assert _requests(hub) == 1  # its file's range
    assert hub.stats.sent_bytes == _size(published["plain"],
                                         "activations/item-4.kv.safetensors")


# --- attacks ---------------------------------------------------------------------------------

def _blob(hub, folder, name):
    """The endpoint's stored blob of the cube file ``name`` (its sha256's)."""
    digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    path = hub.store.root / "blobs" / digest
    assert path.is_file(), name
    return path


@pytest.fixture
def restore(hub, published):
    """Blobs changed on the endpoint by a test, put back after it."""
    saved = []

    def flip(name, at):
        path = _blob(hub, published["sharded"], name)
        data = path.read_bytes()
        saved.append((path, data))
        changed = bytearray(data)
        changed[at] ^= 0x01
        path.chmod(0o644)
        path.write_bytes(bytes(changed))

    yield flip
    for path, data in saved:
        path.write_bytes(data)


def test_a_first_use_offline_names_the_memory_and_leaves_it_absent(hub, published,
                                                                   monkeypatch):
    loaded = _open(hub, published)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.stats.reset()
    with pytest.raises(HubError, match="'item-1' of ns/cube@.*HF_HUB_OFFLINE is set"):
        loaded.act_mem.get("item-1")
    assert _requests(hub) == 0 and loaded.cubepack.loaded == []
    assert len(loaded.act_mem.kv_cache_memories) == 5  # absent, never empty or dropped
    with pytest.raises(HubError, match="'item-1'"):  # whether it is there needs its index
        "item-1" in loaded.act_mem.kv_cache_memories
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert loaded.act_mem.get("item-1").id == "item-1"


@pytest.mark.parametrize("fault", ["drop", "403", "500"])
def test_a_network_failure_or_refusal_on_first_use_names_the_memory(hub, published, fault):
    loaded = _open(hub, published)
    loaded.act_mem.get("item-0")  # shard 0's index is fetched
    hub.add_fault(fault, path=r".*activations-00000\.kvshard", method="GET", times=9)
    try:
        with pytest.raises(HubError, match="activation memory 'item-1' of ns/cube@"):
            loaded.act_mem.get("item-1")
    finally:
        hub.faults.clear()
    assert loaded.cubepack.loaded == ["item-0"]
    assert loaded.act_mem.get("item-1").id == "item-1"  # a later use tries again


def test_a_range_swapped_on_the_remote_after_open_is_refused(hub, published, restore):
    """The endpoint serves other bytes for the opened commit after open (as one that swapped
    a blob would): the memory's sha256 in its index refuses it, by name, every time."""
    loaded = _open(hub, published)
    index = json.loads((published["sharded"] / "shards/activations-00001.index.json").read_text())
    restore("shards/activations-00001.kvshard", index["memories"]["item-3"]["offset"] + 100)
    for _ in range(2):
        with pytest.raises(IntegrityError, match="memory 'item-3'"):
            loaded.act_mem.get("item-3")
    assert loaded.act_mem.get("item-2").id == "item-2"  # its neighbour's bytes are intact
    assert loaded.cubepack.loaded == ["item-2"]
    with pytest.raises(IntegrityError, match="memory 'item-3'"):
        loaded.act_mem.get_all()


def test_an_index_swapped_on_the_remote_after_open_is_refused(hub, published, restore):
    loaded = _open(hub, published)
    restore("shards/activations-00002.index.json", 40)
    with pytest.raises(cubepack.FormatError, match="'item-4' of ns/cube@"):
        loaded.act_mem.get("item-4")
    assert loaded.cubepack.loaded == []


def test_main_moved_after_open_changes_nothing(hub, published, tmp_path):
    """Every first use reads the commit opened, whatever main names since."""
    loaded = _open(hub, published, sha="main")
    other = tmp_path / "other"
    shutil.copytree(published["sharded"], other)
    cubepack.pack(other, shards=False)
    push(other, "ns/cube", endpoint=hub.url)
    hub.stats.reset()
    loaded.act_mem.get("item-1")
    assert all(published["sha"] in line for line in hub._seen[-2:])


def test_another_model_is_refused_on_first_use_by_name(hub, published, zoo):
    other = memos_config(zoo["b"])
    loaded = _open(hub, published, default_config=other)
    with pytest.raises(IdentityMismatch, match="'item-0'"):
        loaded.act_mem.get("item-0")
    dropped = _open(hub, published, default_config=other, on_mismatch="drop")
    assert dropped.act_mem.get("item-0") is None and "item-0" in dropped.cubepack.dropped
    assert "item-0" not in dropped.act_mem.kv_cache_memories


def test_a_first_use_through_the_scheduler(hub, published, tmp_path):
    """MemOS's scheduler reads every memory (get_all), deletes them, adds its own and dumps:
    each memory is fetched and checked on the way; offline, it logs the typed error and the
    memory is left as it was, never emptied."""
    from memos.mem_scheduler.memory_manage_modules.activation_memory_manager import (
        ActivationMemoryManager,
    )

    def manager(path):
        return ActivationMemoryManager(str(path), None, None, lambda **kwargs: None)

    loaded = _open(hub, published)
    import os
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        manager(tmp_path / "offline").update_activation_memory(
            ["The user drinks tea."], "label", "u1", "u1/tiny_cube", loaded)
    finally:
        del os.environ["HF_HUB_OFFLINE"]
    assert len(loaded.act_mem.kv_cache_memories) == 5 and loaded.cubepack.loaded == []
    assert not (tmp_path / "offline").exists()
    manager(tmp_path / "dump").update_activation_memory(
        ["The user drinks tea."], "label", "u1", "u1/tiny_cube", loaded)
    assert sorted(loaded.cubepack.loaded) == sorted(published["items"])  # all read first
    held = loaded.act_mem.get_all()
    assert len(held) == 1 and held[0].id not in published["items"]
    assert len(list((tmp_path / "dump" / "activations").iterdir())) == 1


def test_a_dump_after_partial_first_use_writes_every_memory_checked(hub, published, tmp_path,
                                                                   monkeypatch):
    loaded = _open(hub, published)
    loaded.act_mem.get("item-0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match="'item-2' to 'item-3' of ns/cube@.*HF_HUB_OFFLINE"):
        loaded.act_mem.dump(str(tmp_path / "refused"))  # item-1's index is held: the next
    assert not (tmp_path / "refused" / "activations").exists()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    loaded.act_mem.dump(str(tmp_path / "dumped"))
    written = sorted(path.name for path in (tmp_path / "dumped" / "activations").iterdir())
    assert written == [f"item-{n}.kv.safetensors" for n in range(5)]
    model = loaded.act_mem.llm.model
    for item_id, item in published["items"].items():
        cache = cubepack.load_kv_cache(tmp_path / "dumped" / "activations" /
                                       f"{item_id}.kv.safetensors", model)
        assert all_equal(continue_greedy(model, item.memory, 40, 2),
                         continue_greedy(model, cache, 40, 2))
    loaded.dump(str(tmp_path / "cube"))  # GeneralMemCube.dump: a packed cube
    assert cubepack.verify(tmp_path / "cube").ok


def test_what_cannot_be_checked_on_demand_is_refused(hub, published):
    with pytest.raises(UsageError, match="model identity"):
        _open(hub, published, strict_models=True)
    with pytest.raises(UsageError, match="trusted_keys"):
        _open(hub, published, require_signature=True)
    with pytest.raises(UsageError, match="local_dir"):
        _open(hub, published, local_dir="somewhere")


def test_provenance_and_recomputation_apply_on_first_use(hub, published):
    """Unsigned, a label is the lock's claim: required provenance refuses the memory at its
    first use, by name, as a whole load refuses the cube; recompute proves it there."""
    claimed = _open(hub, published, require_provenance="recorded")
    with pytest.raises(cubepack.RecomputationFailed, match="'item-2'"):
        claimed.act_mem.get("item-2")
    assert claimed.cubepack.loaded == []
    with pytest.raises(cubepack.RecomputationFailed, match="required"):
        hook.init_from_remote_repo(f"ns/cube@{published['sha']}", endpoint=hub.url,
                                   require_provenance="recorded")
    proved = _open(hub, published, require_provenance="recorded", recompute=True)
    assert proved.act_mem.get("item-2").id == "item-2"
    assert proved.cubepack.recomputed["item-2"]["full"]
    assert proved.cubepack.provenance["item-2"]["basis"] == "proved"


def test_listing_the_ids_fetches_the_indexes_only(hub, published):
    loaded = _open(hub, published)
    hub.stats.reset()
    assert list(loaded.act_mem.kv_cache_memories) == sorted(published["items"])
    assert _requests(hub) == 3 and _requests(hub, ".index.json") == 3  # one a shard
    assert "item-4" in loaded.act_mem.kv_cache_memories and _requests(hub) == 3
    assert loaded.cubepack.loaded == []
    del loaded.act_mem.kv_cache_memories["item-3"]  # a memory never used: nothing fetched
    assert _requests(hub) == 3 and len(loaded.act_mem.kv_cache_memories) == 4
    # MemOS's delete pops it, and a pop returns the memory: fetched (checked) as a dict's would
    loaded.act_mem.delete(["item-4"])
    assert _requests(hub) == 4 and len(loaded.act_mem.kv_cache_memories) == 3
    assert "item-4" not in loaded.act_mem.kv_cache_memories
    assert loaded.act_mem.get("item-4") is None and loaded.act_mem.get("item-3") is None
    assert _requests(hub) == 4
    assert sorted(item.id for item in loaded.act_mem.get_all()) == ["item-0", "item-1",
                                                                    "item-2"]
