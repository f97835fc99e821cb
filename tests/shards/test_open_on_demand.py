"""Memories on demand (issue #40 item 2): ``cubepack.open("owner/cube@REV")`` resolves the
revision once and fetches only the lock; ``.load(item, model)`` fetches that memory's shard
index and byte range at the resolved commit (HTTP Range, 206 and Content-Range checked), checks
them before any tensor is built, and checks the producer. Requests and bytes are counted at the
local endpoint, through the real huggingface_hub client."""

from __future__ import annotations

import shutil

import pytest
import torch

import cubepack
from cubepack._util import constants
from cubepack.errors import HubError, IdentityMismatch, IntegrityError, UsageError

from data import HUB_TOKEN
from helpers import without_kv_id


def _push(hub, cube, repo="me/cube"):
    return cubepack.push(cube, repo, endpoint=hub.url, token=HUB_TOKEN,
                         allow_local_paths=True).commit_sha


def _requests(hub) -> int:
    return sum(hub.stats.requests.values())


def test_open_fetches_the_lock_at_one_commit_then_one_memory(hub, sharded, bundle_factory,
                                                            models):
    commit = _push(hub, sharded)
    hub.stats.reset()
    cube = cubepack.open("me/cube@main", endpoint=hub.url, token=HUB_TOKEN)
    assert cube.commit == commit and cube.memories == 5
    lock_size = (sharded / constants.LOCK_FILENAME).stat().st_size
    assert (_requests(hub), hub.stats.sent_bytes) == (2, lock_size)
    hub.stats.reset()
    seen = len(hub._seen)
    cache = cube.load("item-002", models["a"])
    index = cube.lock.shards["shards/activations-00001.kvshard"]
    memory = cube.entry("item-002").locator  # no request: its index read once
    assert _requests(hub) == 2  # the index, the range
    assert hub.stats.sent_bytes == index.index_locator.length + memory.length
    assert all(f"/resolve/{commit}/" in line for line in hub._seen[seen:])
    alone = cubepack.load_kv_cache(
        bundle_factory(5) / "activations" / "item-002.kv.safetensors", models["a"])
    for layer, other in zip(cache.layers, alone.layers):
        assert torch.equal(layer.keys, other.keys)
    hub.stats.reset()
    cube.load("item-003", models["a"])  # the same shard: its index is fetched once
    assert _requests(hub) == 1


def test_a_branch_moved_after_open_changes_nothing(hub, sharded, bundle, zoo, models):
    _push(hub, sharded)
    cube = cubepack.open("me/cube", endpoint=hub.url, token=HUB_TOKEN)
    other = bundle(3)
    cubepack.pack(other, cube_id="me/other", model=str(zoo["a"]), shards=True)
    _push(hub, other)  # main now holds another cube
    assert cube.load("item-004", models["a"]).get_seq_length() == 4


def test_another_model_is_refused(hub, sharded, models):
    _push(hub, sharded)
    cube = cubepack.open("me/cube", endpoint=hub.url, token=HUB_TOKEN)
    with pytest.raises(IdentityMismatch):
        cube.load("item-000", models["b"])


def test_an_unknown_item(hub, sharded):
    _push(hub, sharded)
    cube = cubepack.open("me/cube", endpoint=hub.url, token=HUB_TOKEN)
    with pytest.raises(UsageError, match="no activation memory 'item-9'"):
        cube.load("item-9", None)


def test_a_range_whose_bytes_changed_in_transit_is_refused(hub, sharded, models):
    _push(hub, sharded)
    cube = cubepack.open("me/cube", endpoint=hub.url, token=HUB_TOKEN)
    cube.entry("item-001")  # its index fetched intact
    hub.add_fault("corrupt", path="kvshard")
    with pytest.raises(IntegrityError, match="memory 'item-001'.*its index says"):
        cube.load("item-001", models["a"])


def test_an_answer_that_is_not_206_is_refused(hub, sharded, models, monkeypatch):
    _push(hub, sharded)
    cube = cubepack.open("me/cube", endpoint=hub.url, token=HUB_TOKEN)
    original = type(cube)._get

    def no_range(self, path, headers, **kwargs):  # a server that ignores Range: 200, whole
        return original(self, path, {}, **kwargs)
    monkeypatch.setattr(type(cube), "_get", no_range)
    with pytest.raises(HubError, match="with 200, not 206"):
        cube.load("item-001", models["a"])


def test_an_answer_for_another_range_is_refused(hub, sharded, models, monkeypatch):
    _push(hub, sharded)
    cube = cubepack.open("me/cube", endpoint=hub.url, token=HUB_TOKEN)
    original = type(cube)._get

    def shifted(self, path, headers, **kwargs):  # a 206 for a range one byte later
        first, last = map(int, headers["Range"][6:].split("-"))
        return original(self, path, {"Range": f"bytes={first + 1}-{last + 1}"}, **kwargs)
    monkeypatch.setattr(type(cube), "_get", shifted)
    with pytest.raises(HubError, match="not the range asked for"):
        cube.load("item-001", models["a"])


def test_the_local_endpoint_serves_ranges(hub, sharded):
    """The endpoint's answer to a Range request, as huggingface_hub's session gets it."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    _push(hub, sharded)
    url = hf_hub_url("me/cube", "shards/activations-00000.kvshard", repo_type="dataset",
                     endpoint=hub.url)
    response = get_session().get(url, headers={**build_hf_headers(token=HUB_TOKEN),
                                               "Range": "bytes=10-19"})
    size = (sharded / "shards/activations-00000.kvshard").stat().st_size
    assert response.status_code == 206
    assert response.headers["Content-Range"] == f"bytes 10-19/{size}"
    assert response.content == (sharded / "shards/activations-00000.kvshard").read_bytes()[10:20]


def test_opening_a_10k_memory_cube_takes_two_requests_and_its_lock(hub, zoo, models,
                                                                   bundle_factory, tmp_path):
    """The brief's bound: at most 3 requests and 1 MiB to open a 10,000-memory cube."""
    template = next((bundle_factory(1) / "activations").iterdir()).read_bytes()
    data = without_kv_id(template)
    cube = tmp_path / "big"
    (cube / "activations").mkdir(parents=True)
    for index in range(10_000):
        (cube / "activations" / f"m{index:05d}{constants.KV_SUFFIX}").write_bytes(data)
    cubepack.pack(cube, cube_id="me/big", model=str(zoo["a"]), progress=False)
    _push(hub, cube, "me/big")
    hub.stats.reset()
    opened = cubepack.open("me/big", endpoint=hub.url, token=HUB_TOKEN)
    assert opened.memories == 10_000 and len(opened.lock.shards) == 10
    lock_size = (cube / constants.LOCK_FILENAME).stat().st_size
    # docs/how-to/hub.md: two requests and the lock's bytes (about 7 KB)
    assert (_requests(hub), hub.stats.sent_bytes) == (2, lock_size) and lock_size < 8 * 1024
    hub.stats.reset()
    assert opened.load("m07777", models["a"]).get_seq_length() == 4
    # two more: the index (at most about half a MiB), then the memory's bytes
    assert _requests(hub) == 2 and hub.stats.sent_bytes < 600 * 1024


def test_a_cube_of_one_file_a_memory_opens_too(hub, bundle, zoo, models):
    cube = bundle(3)
    cubepack.pack(cube, cube_id="me/plain", model=str(zoo["a"]))
    _push(hub, cube, "me/plain")
    opened = cubepack.open("me/plain", endpoint=hub.url, token=HUB_TOKEN)
    hub.stats.reset()
    assert opened.load("item-001", models["a"]).get_seq_length() == 4
    size = (cube / "activations" / "item-001.kv.safetensors").stat().st_size
    assert (_requests(hub), hub.stats.sent_bytes) == (1, size)


def test_a_private_cube_opens_and_its_memories_need_an_identity(hub, bundle, zoo):
    """(tests/private/test_private_shards.py loads them with one.)"""
    cube = bundle(3)
    cubepack.pack(cube, cube_id="me/secret", model=str(zoo["a"]))
    cubepack.encrypt(cube, ["age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"])
    _push(hub, cube, "me/secret")
    opened = cubepack.open("me/secret", endpoint=hub.url, token=HUB_TOKEN)
    assert opened.memories == 3
    with pytest.raises(UsageError, match="private cube.*decrypt_with"):
        opened.load("item-001", None)


def test_open_checks_the_signature_when_asked(hub, sharded, zoo, models, tmp_path):
    """trusted_keys: the signature and its attestation fetched at the commit too (two more
    requests), checked over the lock's digests; an unsigned cube, another key, or a lock that
    is not the one signed is refused before any memory is fetched."""
    pytest.importorskip("model_signing")
    from helpers import make_key, reseal_lock

    cube = tmp_path / "signed"
    shutil.copytree(sharded, cube)
    private, public = make_key(tmp_path, "signer")
    _, other = make_key(tmp_path, "other")
    cubepack.sign(cube, key=str(private), model=str(zoo["a"]))
    _push(hub, cube, "me/signed")
    hub.stats.reset()
    opened = cubepack.open("me/signed", endpoint=hub.url, token=HUB_TOKEN,
                           trusted_keys=[str(public)])
    assert opened.signed_by == str(public) and _requests(hub) == 4
    assert opened.load("item-001", models["a"]).get_seq_length() == 4
    with pytest.raises(cubepack.SignatureError, match="not trusted"):
        cubepack.open("me/signed", endpoint=hub.url, token=HUB_TOKEN, trusted_keys=[str(other)])
    _push(hub, sharded, "me/unsigned")
    with pytest.raises(cubepack.SignatureError, match="unsigned"):
        cubepack.open("me/unsigned", endpoint=hub.url, token=HUB_TOKEN,
                      trusted_keys=[str(public)])
    # the lock changed after signing (resealed, uploaded by someone not using cubepack): the
    # signature refuses it
    reseal_lock(cube, lambda lock: lock.update(cubepack_version="9.9.9"))
    from huggingface_hub import CommitOperationAdd

    from cubepack.hub import HubClient

    HubClient(hub.url, HUB_TOKEN).create_commit(
        "me/signed", [CommitOperationAdd(constants.LOCK_FILENAME,
                                         (cube / constants.LOCK_FILENAME).read_bytes())],
        repo_type="dataset", branch="main", message="a lock resealed after signing")
    with pytest.raises(cubepack.SignatureError, match="does not cover"):
        cubepack.open("me/signed", endpoint=hub.url, token=HUB_TOKEN,
                      trusted_keys=[str(public)])


def test_a_remote_memory_can_be_proved_by_recomputation(hub, sharded, models):
    _push(hub, sharded)
    cube = cubepack.open("me/cube", endpoint=hub.url, token=HUB_TOKEN)
    cache = cube.load("item-001", models["a"], recompute=True)
    assert cache.get_seq_length() == 4


def test_opening_at_a_commit_takes_one_request(hub, sharded, models):
    """A 40-hex commit needs no resolution: the lock fetched at it (the resolve URL is
    content-addressed by the commit) proves the commit exists; a branch is still resolved."""
    commit = _push(hub, sharded)
    hub.stats.reset()
    cube = cubepack.open(f"me/cube@{commit}", endpoint=hub.url, token=HUB_TOKEN)
    lock_size = (sharded / constants.LOCK_FILENAME).stat().st_size
    assert cube.commit == commit and (_requests(hub), hub.stats.sent_bytes) == (1, lock_size)
    assert cube.load("item-002", models["a"]).get_seq_length() == 4


@pytest.mark.parametrize("missing", ["0" * 40, "f" * 40])
def test_opening_at_a_commit_the_repo_does_not_hold_is_refused(hub, sharded, missing):
    _push(hub, sharded)
    with pytest.raises(HubError, match=missing[:12]):
        cubepack.open(f"me/cube@{missing}", endpoint=hub.url, token=HUB_TOKEN)
