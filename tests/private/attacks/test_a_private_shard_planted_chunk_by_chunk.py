"""Attacks on one memory of a private sharded cube loaded on demand: someone with write access
to the repo plants, at a new commit, a shard whose chunks were reordered, taken from another
shard (another file key), forged under the shard's own key (a reader knows it), cut short (the
public lock left as it was, or resealed over it), a shard or a manifest from an older rekey of
the same cube (the public lock resealed over it). Each is refused before any tensor is built:
by a chunk's tag, by the header the manifest records, by the sizes the locks record, or by the
memory's own sha256."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch

import cubepack
from cubepack._util import constants
from cubepack.errors import CubepackError, HubError, IntegrityError
from cubepack.format import _lock as lockfile
from cubepack.trust import _age as age
from cubepack.trust import _age_range as ranges

from data import HUB_TOKEN
from helpers import build_cache

STRIDE = 65536 + 16
ITEM = "item-004"


@pytest.fixture(scope="module")
def clear_cube(zoo, models, tmp_path_factory):
    """7 memories of ~84 KB, three a shard: each shard spans 3-4 chunks."""
    cube = tmp_path_factory.mktemp("planted") / "clear"
    (cube / "activations").mkdir(parents=True)
    producer = cubepack.fingerprint(zoo["a"])
    for index in range(7):
        ids = [(index * 13 + k) % 900 + 1 for k in range(150)]
        cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([ids])),
                               cube / "activations" / f"item-{index:03d}.kv.safetensors",
                               producer=producer, token_ids=ids)
    size = (cube / "activations" / "item-000.kv.safetensors").stat().st_size
    cubepack.pack(cube, cube_id="me/planted", model=str(zoo["a"]), shard_size=3 * size + 200)
    return cube


@pytest.fixture
def setup(clear_cube, agekeys, tmp_path):
    """(the private cube, its shard holding ITEM, the other shard, the endpoint)."""
    from cubepack.format.sections import shards
    from cubepack.testing.hub import InstrumentedHub

    cube = tmp_path / "cube"
    shutil.copytree(clear_cube, cube)
    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    held = shards.resolved(lock, shards.local_fetch(cube)).activations[ITEM].locator
    other = next(name for name in lock.shards if name != held.path)
    cubepack.encrypt(cube, [agekeys["alice"][1]])
    with InstrumentedHub(tmp_path / "hub-root", tokens=[HUB_TOKEN]) as hub:
        cubepack.push(cube, "me/cube", endpoint=hub.url, token=HUB_TOKEN,
                      allow_local_paths=True)
        yield cube, f"{held.path}.age", f"{other}.age", held, hub


def _upload(hub, files: dict[str, bytes]) -> None:
    from huggingface_hub import CommitOperationAdd

    from cubepack.hub import HubClient

    HubClient(hub.url, HUB_TOKEN).create_commit(
        "me/cube", [CommitOperationAdd(name, data) for name, data in files.items()],
        repo_type="dataset", branch="main", message="planted")


def _load(hub, agekeys, models):
    opened = cubepack.open("me/cube", endpoint=hub.url, token=HUB_TOKEN)
    return opened.load(ITEM, models["a"], decrypt_with=agekeys["alice"][0])


def _resealed_lock(cube, files: dict[str, bytes]) -> bytes:
    """The public lock with ``files``' entries rewritten over their new bytes (unsigned: anyone
    who can push can do this)."""
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    for name, data in files.items():
        lock["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    return lockfile.dumps(lockfile.build_lock(
        cube_id=lock["cube_id"], files=lock["files"], models=lock["models"],
        cubepack_version=lock["cubepack_version"], encryption=lock["encryption"])).encode()


def _chunk(data: bytes, index: int) -> tuple[int, int]:
    start = ranges.head_digest(data)[0]
    return start + index * STRIDE, start + (index + 1) * STRIDE


def test_sound_it_loads(setup, agekeys, models):
    assert _load(setup[4], agekeys, models).get_seq_length() == 150


def test_chunks_reordered(setup, agekeys, models):
    cube, shard, _, held, hub = setup
    data = bytearray((cube / shard).read_bytes())
    first = held.offset // 65536
    full = (len(data) - ranges.head_digest(data)[0]) // STRIDE  # whole chunks: same length
    pair = (first, first + 1) if first + 1 < full else (first - 1, first)
    (a, b), (c, d) = _chunk(data, pair[0]), _chunk(data, pair[1])
    data[a:b], data[c:d] = data[c:d], data[a:b]
    _upload(hub, {shard: bytes(data)})
    with pytest.raises(IntegrityError, match=f"fails authentication at chunk {first}"):
        _load(hub, agekeys, models)


def test_a_chunk_from_another_shard_at_the_same_index(setup, agekeys, models):
    cube, shard, other, held, hub = setup
    data = bytearray((cube / shard).read_bytes())
    donor = (cube / other).read_bytes()
    first = held.offset // 65536
    a, b = _chunk(data, first)
    c, d = _chunk(donor, first)
    data[a:b] = donor[c:d]
    _upload(hub, {shard: bytes(data)})
    with pytest.raises(IntegrityError, match=f"fails authentication at chunk {first}"):
        _load(hub, agekeys, models)


def test_a_chunk_forged_under_the_shards_own_key(setup, agekeys, models):
    """A reader knows a shard's file key: a chunk it encrypts under that key, at the right index,
    passes its tag. The memory's sha256 (its index's, which the manifest's lock commits to)
    refuses it."""
    cube, shard, _, held, hub = setup
    data = bytearray((cube / shard).read_bytes())
    head = ranges.open_head(data, age.load_identities(agekeys["alice"][0]), shard, len(data))
    first = held.offset // 65536
    a, b = _chunk(data, first)
    forged = head.aead.encrypt(first.to_bytes(11, "big") + b"\x00", bytes(65536), None)
    assert len(forged) == b - a
    data[a:b] = forged
    _upload(hub, {shard: bytes(data)})
    with pytest.raises(IntegrityError, match=f"memory '{ITEM}'.*its index says"):
        _load(hub, agekeys, models)


def test_a_shard_cut_short_the_lock_as_it_was(setup, agekeys, models):
    cube, shard, _, _, hub = setup
    _upload(hub, {shard: (cube / shard).read_bytes()[:-STRIDE // 2]})
    with pytest.raises(HubError, match="Content-Range"):
        _load(hub, agekeys, models)


@pytest.mark.parametrize("cut", ["last chunk", "whole chunk"])
def test_a_shard_cut_short_the_public_lock_resealed(setup, agekeys, models, cut):
    """The public lock resealed over a shorter shard: the plaintext it would hold is not the
    size the private lock records (and a chunk flagged last where it is not fails its tag)."""
    cube, shard, _, _, hub = setup
    data = (cube / shard).read_bytes()
    start = ranges.head_digest(data)[0]
    full = (len(data) - start) // STRIDE
    cut_at = start + full * STRIDE if cut == "last chunk" else start + (full - 1) * STRIDE
    short = data[:cut_at]
    _upload(hub, {shard: short, constants.LOCK_FILENAME: _resealed_lock(cube, {shard: short})})
    with pytest.raises(IntegrityError, match="plaintext, its private lock records"):
        _load(hub, agekeys, models)


def test_the_last_chunk_flag_is_checked(setup, agekeys):
    """At the STREAM level: a file read as one chunk shorter than it is (the chunk before the
    real last one taken as last) fails that chunk's tag."""
    cube, shard, _, _, _ = setup
    data = (cube / shard).read_bytes()
    start = ranges.head_digest(data)[0]
    full = (len(data) - start) // STRIDE
    short = data[:start + full * STRIDE]  # the real last (partial) chunk dropped
    head = ranges.open_head(short, age.load_identities(agekeys["alice"][0]), shard, len(short))
    offset = (full - 1) * 65536
    first, last, begin, end = ranges.chunk_span(head, offset, 65536)
    assert first == last == full - 1
    with pytest.raises(IntegrityError, match=f"fails authentication at chunk {full - 1}"):
        ranges.decrypt_span(head, offset, 65536, short[begin:end], bytearray(65536), shard)


def test_a_shard_and_a_manifest_from_an_older_rekey(setup, agekeys, models, tmp_path):
    """Generation 1's shard planted beside generation 2's manifest: its header is not the one
    the manifest records (same plaintext, another file key), refused before it is opened. And
    generation 1's manifest planted beside generation 2's shards (the public lock resealed to
    list it): the shards' headers are not the ones it records."""
    cube, shard, _, _, hub = setup
    older = tmp_path / "older"
    shutil.copytree(cube, older)
    cubepack.rekey(cube, agekeys["alice"][0], to=[agekeys["alice"][1], agekeys["bob"][1]])
    cubepack.push(cube, "me/cube", endpoint=hub.url, token=HUB_TOKEN, allow_local_paths=True)
    assert _load(hub, agekeys, models).get_seq_length() == 150
    old_shard = (older / shard).read_bytes()
    _upload(hub, {shard: old_shard, constants.LOCK_FILENAME: _resealed_lock(
        cube, {shard: old_shard})})
    with pytest.raises(IntegrityError, match="another age header than the one its manifest"):
        _load(hub, agekeys, models)
    # back to generation 2, then generation 1's manifest under a resealed public lock
    cubepack.push(cube, "me/cube", endpoint=hub.url, token=HUB_TOKEN, allow_local_paths=True)
    manifest = (older / "cubepack.manifest.age").read_bytes()
    _upload(hub, {"cubepack.manifest.age": manifest, constants.LOCK_FILENAME: _resealed_lock(
        cube, {"cubepack.manifest.age": manifest})})
    with pytest.raises(CubepackError) as refused:
        _load(hub, agekeys, models)
    # refused by the manifest's own checks (its generation is not the public lock's), or else
    # by the headers it records
    assert isinstance(refused.value, IntegrityError), refused.value
