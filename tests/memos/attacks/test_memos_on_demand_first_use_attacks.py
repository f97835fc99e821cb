"""Attacks on the hook's load on first use (issue #40 item 2) by someone who did not build it:
the endpoint gone (not HF_HUB_OFFLINE: stopped), the model swapped between open and first use,
a memory loaded on demand used by another model, a cube dump refused half-way, MemOS's plain
pickle dump after ``uninstall()``, ``get_all`` under ``on_mismatch="drop"``, a memory replaced
by an incremental push then loaded on demand at the new commit. Real MemoryOS, the real
huggingface_hub client, the local endpoint."""

from __future__ import annotations

import copy
import shutil

import pytest

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack
import cubepack.memos as hook
from cubepack import HubError, IdentityMismatch
from cubepack.hub import push
from cubepack.testing.hub import InstrumentedHub, upload_folder

from helpers import all_equal, continue_greedy, memos_kv_config

TEXTS = ["The user likes green tea.", "He walks every morning.", "Paris is lovely in May.",
         "Her cat is called Miso."]
QUESTION = [{"role": "user", "content": "What does the user drink?"}]


memos_config = memos_kv_config  # one owner: tests/support/helpers.py


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with InstrumentedHub(tmp_path_factory.mktemp("hub-root")) as server:
        yield server


def _publish(hub, zoo, tmp_path_factory, repo="ns/cube"):
    """Model A on ``hub``; a 4-memory MemOS cube packed two a shard and pushed to ``repo``."""
    from huggingface_hub import snapshot_download
    from memos.mem_cube.general import GeneralMemCube

    model_commit = upload_folder(hub.url, "tiny-org/model-a", zoo["a"])
    snapshot = snapshot_download("tiny-org/model-a", revision=model_commit, endpoint=hub.url)
    cube = GeneralMemCube(memos_config(snapshot))
    items = [cube.act_mem.extract(text) for text in TEXTS]
    for number, one in enumerate(items):
        one.id = f"item-{number}"
    cube.act_mem.add(items)
    folder = hook.pack_cube(cube, tmp_path_factory.mktemp("plain") / "cube")
    largest = max(path.stat().st_size for path in (folder / "activations").iterdir())
    cubepack.pack(folder, shard_size=2 * largest + 200)
    return {"cube": cube, "folder": folder, "snapshot": snapshot,
            "items": {one.id: one for one in items},
            "sha": push(folder, repo, endpoint=hub.url).commit_sha}


@pytest.fixture(scope="module")
def published(hub, zoo, tmp_path_factory):
    hook.uninstall()
    hook.install(require_pin=False)
    yield _publish(hub, zoo, tmp_path_factory)
    hook.uninstall()


def _open(hub, published, **options):
    return hook.init_from_remote_repo(f"ns/cube@{published['sha']}", endpoint=hub.url,
                                      on_demand=True, **options)


def test_the_endpoint_stopped_after_open_names_the_memory(zoo, published, tmp_path_factory):
    """Not HF_HUB_OFFLINE: the endpoint itself went away (connection refused). A typed
    HubError naming the memory, the memory absent (never empty), a later use tries again."""
    with InstrumentedHub(tmp_path_factory.mktemp("gone")) as gone:
        data = _publish(gone, zoo, tmp_path_factory, repo="ns/gone")
        loaded = hook.init_from_remote_repo(f"ns/gone@{data['sha']}", endpoint=gone.url,
                                            on_demand=True)
        loaded.act_mem.get("item-0")  # shard 0's index held
    from huggingface_hub.utils import reset_sessions

    reset_sessions()  # a stopped server's kept-alive connections die with its process
    for wanted in ("item-1", "item-2"):  # its index held / its index to fetch too
        with pytest.raises(HubError, match=f"'{wanted}' of ns/gone@"):
            loaded.act_mem.get(wanted)
    assert loaded.cubepack.loaded == ["item-0"]
    assert len(loaded.act_mem.kv_cache_memories) == 4


def test_a_model_swapped_between_open_and_first_use_is_the_one_checked(hub, published, zoo):
    """The cube opened with model A; MemOS's LLM then holds model B (a user swapped it): the
    first use checks the memory against B, the model that will use it, and refuses."""
    from memos.mem_cube.general import GeneralMemCube

    loaded = _open(hub, published)
    other = GeneralMemCube(memos_config(zoo["b"])).act_mem.llm
    loaded.act_mem.llm = other
    with pytest.raises(IdentityMismatch, match="'item-0'"):
        loaded.act_mem.get("item-0")
    assert loaded.cubepack.loaded == []


def test_a_memory_loaded_on_demand_keeps_its_producer_at_use(hub, published, zoo):
    """Its producer travels with it: model B's chat with it is refused by name."""
    from memos.mem_cube.general import GeneralMemCube

    loaded = _open(hub, published)
    item = loaded.act_mem.get("item-1")
    other = GeneralMemCube(memos_config(zoo["b"])).act_mem.llm
    with pytest.raises(IdentityMismatch):
        other.generate(QUESTION, past_key_values=copy.deepcopy(item.memory))
    model = loaded.act_mem.llm.model
    assert all_equal(continue_greedy(published["cube"].act_mem.llm.model,
                                     published["items"]["item-1"].memory, 40, 2),
                     continue_greedy(model, item.memory, 40, 2))


def test_a_cube_dump_refused_on_first_use_leaves_its_target_as_it_was(hub, published,
                                                                     tmp_path, monkeypatch):
    """GeneralMemCube.dump after a partial first use, offline: refused before anything is
    written (no config.json, no half cube)."""
    loaded = _open(hub, published)
    loaded.act_mem.get("item-0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target = tmp_path / "new"
    with pytest.raises(HubError, match="of ns/cube@"):
        loaded.dump(str(target))
    assert not target.exists() or not any(target.iterdir()), sorted(target.rglob("*"))


def test_get_all_under_drop_leaves_a_refused_memory_out_and_says_so(hub, published, zoo):
    dropped = _open(hub, published, default_config=memos_config(zoo["b"]),
                    on_mismatch="drop")
    assert dropped.act_mem.get_all() == []
    assert sorted(dropped.cubepack.dropped) == sorted(published["items"])
    assert len(dropped.act_mem.kv_cache_memories) == 0


def test_plain_memos_dump_after_uninstall_writes_no_empty_or_partial_pickle(hub, published,
                                                                             tmp_path):
    """uninstall() with an on-demand memory held: MemOS's own dump pickles
    ``kv_cache_memories``. It must not leave a pickle of absent memories (or a truncated file);
    refused, or the memories written whole."""
    loaded = _open(hub, published)
    loaded.act_mem.get("item-0")
    hook.uninstall()
    try:
        target = tmp_path / "plain"
        target.mkdir()
        try:
            loaded.act_mem.dump(str(target))
        except Exception:  # refused: nothing may be left behind
            assert not any(target.iterdir()), sorted(target.iterdir())
        else:
            import pickle

            written = next(target.iterdir())
            held = pickle.loads(written.read_bytes())  # our own file, from this process
            assert sorted(held["kv_cache_memories"]) == sorted(published["items"])
            assert type(held["kv_cache_memories"]) is dict
    finally:
        hook.install(require_pin=False)


def test_a_memory_replaced_by_an_incremental_push_loads_the_new_bytes(hub, published, zoo,
                                                                      tmp_path):
    """item-1 replaced (another text's cache) in the pushed cube, pushed again: opened at the
    new commit, item-1 is the new memory (never the old shard's dead bytes), and at the old
    commit the old one."""
    from memos.mem_cube.general import GeneralMemCube

    folder = tmp_path / "cube"
    shutil.copytree(published["folder"], folder)
    cube = GeneralMemCube(memos_config(published["snapshot"]))
    new = cube.act_mem.extract("They met in Lyon, long ago.")
    new.id = "item-1"
    single = tmp_path / "single"
    cube.act_mem.add([new])
    hook.pack_cube(cube, single)
    (folder / "activations").mkdir()
    shutil.copy(single / "activations" / "item-1.kv.safetensors",
                folder / "activations" / "item-1.kv.safetensors")
    cubepack.pack(folder, remove=("item-1",))
    sha = push(folder, "ns/cube", endpoint=hub.url).commit_sha
    newer = hook.init_from_remote_repo(f"ns/cube@{sha}", endpoint=hub.url, on_demand=True)
    model = newer.act_mem.llm.model
    assert all_equal(continue_greedy(model, newer.act_mem.get("item-1").memory, 40, 2),
                     continue_greedy(model, new.memory, 40, 2))
    older = _open(hub, published)
    assert all_equal(continue_greedy(model, older.act_mem.get("item-1").memory, 40, 2),
                     continue_greedy(model, published["items"]["item-1"].memory, 40, 2))


def test_adding_a_new_memory_offline_needs_no_remote_index(hub, published, monkeypatch):
    """MemOS's add of a memory of its own (an id the cube may not hold) is no use of the
    cube's memories: offline it is added, never a lookup error about a remote memory. Whether
    it replaces one of the cube's (what ``len`` needs) is settled by a lookup when one can be
    made: offline ``len`` is refused naming that id, never a guess; online again it counts."""
    loaded = _open(hub, published)
    own = loaded.act_mem.extract("The user now drinks coffee.")
    # MemOS's ids are uuid4s, as a real cube's are: a new one falls inside some shard's range
    # (here: between item-0 and item-1, shard 0's)
    own.id = "item-05"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded.act_mem.add([own])
    assert loaded.act_mem.get(own.id) is own
    with pytest.raises(cubepack.HubError, match="'item-05'"):
        len(loaded.act_mem.kv_cache_memories)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert len(loaded.act_mem.kv_cache_memories) == 5
    assert loaded.act_mem.get(own.id) is own


def test_a_dump_meeting_a_swapped_range_writes_nothing(hub, published, tmp_path):
    """A partial first use, then one remaining memory's bytes swapped on the endpoint: the
    dump (KVCacheMemory's and the cube's) is refused naming that memory, nothing written."""
    import hashlib
    import json

    folder = published["folder"]
    index = json.loads((folder / "shards/activations-00001.index.json").read_text())
    name = "shards/activations-00001.kvshard"
    blob = hub.store.root / "blobs" / hashlib.sha256((folder / name).read_bytes()).hexdigest()
    loaded = _open(hub, published)
    loaded.act_mem.get("item-0")
    data = blob.read_bytes()
    changed = bytearray(data)
    changed[index["memories"]["item-3"]["offset"] + 50] ^= 0x01
    blob.chmod(0o644)
    blob.write_bytes(bytes(changed))
    try:
        with pytest.raises(cubepack.IntegrityError, match="'item-3'"):
            loaded.act_mem.dump(str(tmp_path / "act"))
        assert not (tmp_path / "act" / "activations").exists()
        with pytest.raises(cubepack.IntegrityError, match="'item-3'"):
            loaded.dump(str(tmp_path / "cube"))
        assert not (tmp_path / "cube").exists() or not any((tmp_path / "cube").iterdir())
    finally:
        blob.write_bytes(data)
    assert sorted(loaded.cubepack.loaded) == ["item-0", "item-1", "item-2"]


def test_a_cube_file_swapped_on_the_endpoint_refuses_the_open(hub, published):
    """config.json's bytes swapped on the endpoint (same length): the open refuses it by the
    lock's sha256, through verify (the one face), before MemOS builds anything."""
    import hashlib

    folder = published["folder"]
    blob = hub.store.root / "blobs" / hashlib.sha256(
        (folder / "config.json").read_bytes()).hexdigest()
    data = blob.read_bytes()
    blob.chmod(0o644)
    blob.write_bytes(data.replace(b"u1", b"u2", 1))
    try:
        with pytest.raises((cubepack.VerificationFailed, cubepack.FormatError),
                           match="config.json"):
            _open(hub, published)
    finally:
        blob.write_bytes(data)


def test_the_hook_hashes_no_file_itself():
    """The hook keeps no checker of its own: what it fetches is checked by verify (and by the
    activations kind's load), never by a digest comparison in cubepack/memos/."""
    import ast
    from pathlib import Path

    import cubepack.memos._ondemand as ondemand

    tree = ast.parse(Path(ondemand.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    assert "hashlib" not in imported


def test_rebuild_on_first_use_gives_the_live_models_prefill(hub, published, zoo):
    """on_mismatch="rebuild" with model B: the first use rebuilds the memory with B (its
    producer B's at use, B's chat accepts it), recorded in the report, never A's tensors."""
    loaded = _open(hub, published, default_config=memos_config(zoo["b"]),
                   on_mismatch="rebuild")
    item = loaded.act_mem.get("item-2")
    assert "item-2" in loaded.cubepack.rebuilt

    hook.uninstall()  # B's chat under the strictest policy: the cache must be registered B's
    hook.install(require_pin=False)
    answer = loaded.act_mem.llm.generate(QUESTION, past_key_values=copy.deepcopy(item.memory))
    assert isinstance(answer, str)
