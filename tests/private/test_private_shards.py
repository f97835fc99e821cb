"""Private sharded cubes (issue #40 item 2): encrypt, verify, rekey, pull and load one memory of
a sharded cube encrypted with age. Loading one memory decrypts the manifest, then only its
shard's index and the 64 KiB STREAM chunks its range lies in (locally by pread, remotely by
HTTP Range at the opened commit), each chunk's tag checked, then the memory's sha256 and
checksums before any tensor is built. Requests and bytes are counted."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import cubepack
from cubepack._util import constants
from cubepack.errors import IntegrityError, UsageError
from cubepack.format import _lock as lockfile
from cubepack.kinds import serving
from cubepack.trust import TrustPolicy
from cubepack.trust import _age_range as ranges

from data import HUB_TOKEN
from helpers import build_cache

#: Tokens a memory: ~560 bytes a token of the tiny model, so each memory spans 2-3 chunks
#: and most memories start and end inside a chunk another memory shares.
TOKENS = 150
ITEMS = [f"item-{index:03d}" for index in range(7)]


@pytest.fixture(scope="module")
def clear_sharded(zoo, models, tmp_path_factory):
    """7 memories of model A, ~84 KB each, packed three a shard (shards 0, 1, 2)."""
    cube = tmp_path_factory.mktemp("privshards") / "clear"
    (cube / "activations").mkdir(parents=True)
    producer = cubepack.fingerprint(zoo["a"])
    for index, item in enumerate(ITEMS):
        ids = [(index * 13 + k) % 900 + 1 for k in range(TOKENS)]
        cache = build_cache(models["a"], torch.tensor([ids]))
        cubepack.save_kv_cache(cache, cube / "activations" / f"{item}.kv.safetensors",
                               producer=producer, token_ids=ids, metadata={"id": item})
    size = (cube / "activations" / f"{ITEMS[0]}.kv.safetensors").stat().st_size
    cubepack.pack(cube, cube_id="me/private-shards", model=str(zoo["a"]),
                  shard_size=3 * size + 200)
    assert len(json.loads((cube / constants.LOCK_FILENAME).read_text())["shards"]) == 3
    return cube


@pytest.fixture
def private(clear_sharded, agekeys, tmp_path):
    """``make(hide_names=False)`` -> a fresh copy of the cube, encrypted to alice."""
    def make(**options):
        cube = tmp_path / "private"
        shutil.copytree(clear_sharded, cube)
        cubepack.encrypt(cube, [agekeys["alice"][1]], **options)
        return cube
    return make


def _equal(first, second) -> bool:
    return all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(first.layers, second.layers, strict=True))


def _entries(clear_sharded):
    """item -> (shard path, offset, length) of the clear cube."""
    from cubepack.format.sections import shards

    lock = lockfile.parse((clear_sharded / constants.LOCK_FILENAME).read_bytes())
    resolved = shards.resolved(lock, shards.local_fetch(clear_sharded))
    return {item: entry.locator for item, entry in resolved.activations.items()}


# --- the verbs --------------------------------------------------------------------------------

def test_encrypt_writes_every_shard_and_index_as_a_ciphertext_and_verify_checks_them(
        private, agekeys, clear_sharded):
    cube = private()
    public = json.loads((cube / constants.LOCK_FILENAME).read_text())
    assert "shards" not in public and public["activations"] == {}
    assert sorted(name for name in public["files"] if name.startswith("shards/")) == sorted(
        f"{name}.age" for name in json.loads(
            (clear_sharded / constants.LOCK_FILENAME).read_text())["files"]
        if name.startswith("shards/"))
    assert public["encryption"]["counts"]["activations"] == len(ITEMS)
    assert not list(cube.rglob("*.kvshard")) and not list(cube.rglob("*.index.json"))
    keyless = cubepack.verify(cube)
    assert keyless.ok and not any(c.name == "shards" for c in keyless.checks)
    report = cubepack.verify(cube, decrypt_with=agekeys["alice"][0])
    shards = [c for c in report.checks if c.name == "shards"]
    assert report.ok and len(shards) == 3 and all(c.ok and c.scope == "decrypted"
                                                  for c in shards)
    assert sum(c.name == "kv checksums" and c.ok is True for c in report.checks) == len(ITEMS)


@pytest.mark.parametrize("hide_names", [False, True])
def test_every_memory_loads_alone_from_its_chunks(private, agekeys, clear_sharded, models,
                                                  hide_names):
    cube = private(hide_names=hide_names)
    for item in ITEMS:
        mine = cubepack.load_kv_cache(cube, models["a"], item=item,
                                      decrypt_with=agekeys["alice"][0])
        assert _equal(mine, cubepack.load_kv_cache(clear_sharded, models["a"], item=item))


def test_one_memory_reads_the_manifest_its_index_and_its_own_chunks_only(
        private, agekeys, clear_sharded, models):
    """Counted at the reader: the manifest whole, the index's header and chunks in one read
    (it starts in its first chunk), the shard's header, then exactly the chunks the memory's
    range lies in; a second memory of the same shard reads its chunks alone."""
    from cubepack.ops._private_range import PrivateRanges, local_reader

    cube = private()
    public, read = local_reader(cube)
    reads = []

    def counting(name, offset, length):
        reads.append((name, offset, length))
        return read(name, offset, length)

    source = PrivateRanges(public, counting, agekeys["alice"][0], "cube")
    assert reads == [("cubepack.manifest.age", 0, public.files["cubepack.manifest.age"].size)]
    locators = _entries(clear_sharded)
    item = "item-004"  # the middle memory of shard 1: its chunks shared on both sides
    locator = locators[item]
    reads.clear()
    cubepack.load_kv_cache(cube, models["a"], item=item, decrypt_with=agekeys["alice"][0])
    kind_load = serving("load_kv_cache")
    reads.clear()
    kind_load.load("cube", models["a"], TrustPolicy().recomputation(), item=item,
                   source=source)
    shard = f"{locator.path}.age"
    index = shard.replace(".kvshard.age", ".index.json.age")
    start = source.manifest["headers"][shard][0]
    first, last = locator.offset // 65536, (locator.end - 1) // 65536
    assert locator.offset % 65536 and locator.end % 65536  # shares its first and last chunk
    assert [name for name, _, _ in reads] == [index, shard, shard]
    assert reads[0] == (index, 0, public.files[index].size)  # header and payload: one read
    assert reads[1] == (shard, 0, start)  # the shard's header and nonce
    stride = 65536 + 16
    end = min(start + (last + 1) * stride, public.files[shard].size)  # the last chunk's end
    assert reads[2] == (shard, start + first * stride, end - start - first * stride)
    # the bytes read for the memory: its chunks, less than two chunks more than its length
    assert reads[2][2] < locator.length + 2 * stride
    reads.clear()
    other = next(i for i, loc in locators.items() if loc.path == locator.path and i != item)
    kind_load.load("cube", models["a"], TrustPolicy().recomputation(), item=other,
                   source=source)
    assert [name for name, _, _ in reads] == [shard]  # index and header read once a shard


def test_rekey_and_a_new_reader(private, agekeys, models, clear_sharded):
    cube = private()
    result = cubepack.rekey(cube, agekeys["alice"][0], to=[agekeys["bob"][1]])
    assert result.generation == 2
    assert cubepack.verify(cube, decrypt_with=agekeys["bob"][0]).ok
    mine = cubepack.load_kv_cache(cube, models["a"], item="item-006",
                                  decrypt_with=agekeys["bob"][0])
    assert _equal(mine, cubepack.load_kv_cache(clear_sharded, models["a"], item="item-006"))
    with pytest.raises(cubepack.RefusedError, match="not encrypted to the identity"):
        cubepack.load_kv_cache(cube, models["a"], item="item-006",
                               decrypt_with=agekeys["alice"][0])


def test_an_unknown_item_and_a_clear_cube(private, agekeys, models, clear_sharded):
    cube = private()
    with pytest.raises(UsageError, match="no activation memory 'item-9'"):
        cubepack.load_kv_cache(cube, models["a"], item="item-9",
                               decrypt_with=agekeys["alice"][0])
    with pytest.raises(UsageError, match="not a private cube"):
        cubepack.load_kv_cache(clear_sharded, models["a"], item="item-000",
                               decrypt_with=agekeys["alice"][0])


# --- on demand from the endpoint ------------------------------------------------------------

@pytest.fixture
def hub(tmp_path):
    from cubepack.testing.hub import InstrumentedHub

    with InstrumentedHub(tmp_path / "hub-root", tokens=[HUB_TOKEN]) as server:
        yield server


def _push(hub, cube, repo="me/private"):
    return cubepack.push(cube, repo, endpoint=hub.url, token=HUB_TOKEN,
                         allow_local_paths=True).commit_sha


def _requests(hub) -> int:
    return sum(hub.stats.requests.values())


def test_open_then_load_one_private_memory_counts_requests_and_bytes(
        hub, private, agekeys, models, clear_sharded):
    cube = private()
    commit = _push(hub, cube)
    hub.stats.reset()
    opened = cubepack.open(f"me/private@{commit}", endpoint=hub.url, token=HUB_TOKEN)
    lock_size = (cube / constants.LOCK_FILENAME).stat().st_size
    assert (_requests(hub), hub.stats.sent_bytes) == (1, lock_size)  # a commit: no HEAD
    assert opened.memories == len(ITEMS)
    with pytest.raises(UsageError, match="private cube.*decrypt_with"):
        opened.load("item-004", models["a"])
    hub.stats.reset()
    seen = len(hub._seen)
    cache = opened.load("item-004", models["a"], decrypt_with=agekeys["alice"][0])
    assert _equal(cache, cubepack.load_kv_cache(clear_sharded, models["a"], item="item-004"))
    locator = _entries(clear_sharded)["item-004"]
    shard = f"{locator.path}.age"
    index = shard.replace(".kvshard.age", ".index.json.age")
    public = json.loads((cube / constants.LOCK_FILENAME).read_text())["files"]
    source = next(iter(opened.private.values()))
    start = source.manifest["headers"][shard][0]
    first, last = locator.offset // 65536, (locator.end - 1) // 65536
    chunks = min(start + (last + 1) * 65552, public[shard]["size"]) - start - first * 65552
    # the manifest, the index (header and chunks in one), the shard's header, its chunks
    assert _requests(hub) == 4
    assert hub.stats.sent_bytes == (public["cubepack.manifest.age"]["size"]
                                    + public[index]["size"] + start + chunks)
    assert all(f"/resolve/{commit}/" in line for line in hub._seen[seen:])
    hub.stats.reset()
    other = next(item for item, found in _entries(clear_sharded).items()
                 if found.path == locator.path and item != "item-004")
    opened.load(other, models["a"], decrypt_with=agekeys["alice"][0])
    assert _requests(hub) == 1  # the same shard: its chunks alone


def test_a_chunk_swapped_by_the_endpoint_is_refused(hub, private, agekeys, models,
                                                    clear_sharded):
    """The remote serves a shard whose chunks were reordered (same size, the lock as it was):
    the memory's first chunk fails its tag, before its digest is even taken."""
    cube = private()
    locator = _entries(clear_sharded)["item-004"]
    name = f"{locator.path}.age"
    _push(hub, cube)
    assert locator.offset // 65536 == 1  # its first chunk is swapped with the one before
    _upload(hub, name, _swapped(cube / name, 0))
    opened = cubepack.open("me/private", endpoint=hub.url, token=HUB_TOKEN)
    with pytest.raises(IntegrityError, match="fails authentication at chunk"):
        opened.load("item-004", models["a"], decrypt_with=agekeys["alice"][0])


def test_a_truncated_shard_on_the_endpoint_is_refused(hub, private, agekeys, models,
                                                      clear_sharded):
    """A shard cut one chunk short (the lock as it was): its size is not the lock's, refused
    by the range's Content-Range before a chunk is decrypted."""
    cube = private()
    locator = _entries(clear_sharded)["item-005"]
    name = f"{locator.path}.age"
    _push(hub, cube)
    _upload(hub, name, (cube / name).read_bytes()[:-(65536 + 16)])
    opened = cubepack.open("me/private", endpoint=hub.url, token=HUB_TOKEN)
    with pytest.raises(cubepack.HubError, match="Content-Range"):
        opened.load("item-005", models["a"], decrypt_with=agekeys["alice"][0])


def _upload(hub, name, data, repo="me/private") -> None:
    """Commit ``data`` as ``name`` to ``repo`` as it is (no cubepack check on the way)."""
    from huggingface_hub import CommitOperationAdd

    from cubepack.hub import HubClient

    HubClient(hub.url, HUB_TOKEN).create_commit(
        repo, [CommitOperationAdd(name, data)], repo_type="dataset", branch="main",
        message="planted")


def _swapped(shard, first: int) -> bytes:
    """The age file ``shard`` with chunks ``first`` and ``first + 1`` swapped."""
    data = bytearray(shard.read_bytes())
    start = ranges.head_digest(data)[0]
    stride = 65536 + 16
    a, b = start + first * stride, start + (first + 1) * stride
    data[a:a + stride], data[b:b + stride] = data[b:b + stride], data[a:a + stride]
    return bytes(data)


def test_push_then_pull_with_and_without_the_key(hub, private, agekeys, models, tmp_path,
                                                 clear_sharded):
    cube = private(hide_names=True)
    commit = _push(hub, cube)
    pulled = cubepack.pull(f"me/private@{commit}", endpoint=hub.url, token=HUB_TOKEN,
                           local_dir=tmp_path / "pulled", cache_dir=tmp_path / "hf",
                           decrypt_with=agekeys["alice"][0])
    shards = [c for c in pulled.report.checks if c.name == "shards"]
    assert pulled.report.ok and len(shards) == 3 and all(c.scope == "decrypted" for c in shards)
    keyless = cubepack.pull(f"me/private@{commit}", endpoint=hub.url, token=HUB_TOKEN,
                            local_dir=tmp_path / "keyless", cache_dir=tmp_path / "hf")
    assert keyless.report.ok and not any(c.name == "shards" for c in keyless.report.checks)
    for item in ITEMS:
        mine = cubepack.load_kv_cache(tmp_path / "pulled", models["a"], item=item,
                                      decrypt_with=agekeys["alice"][0])
        assert _equal(mine, cubepack.load_kv_cache(clear_sharded, models["a"], item=item))
