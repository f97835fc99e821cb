"""Incremental pushes on the wire (issue #40 item 3): racing pushes (every commit names its
parent; the local endpoint answers a stale one 412; the loser gets PushConflict and the remote
stays as the winner left it), a push of more than 100 files in several commits whose
intermediate states are never presented as the cube, and a changed signed cube that is
re-signed or refused unsigned. Through the real huggingface_hub client."""

from __future__ import annotations

import json
import shutil

import pytest

import cubepack
from cubepack._util import constants
from cubepack.errors import PushConflict, SignatureError, VerificationFailed
from cubepack.hub import _incremental
from cubepack.hub._client import HubClient

from data import HUB_TOKEN
from helpers import make_key


def _push(hub, cube, repo="me/cube", **kwargs):
    return cubepack.push(cube, repo, endpoint=hub.url, token=HUB_TOKEN,
                         allow_local_paths=True, **kwargs)


def _add(cube, source, *items):
    (cube / "activations").mkdir(exist_ok=True)
    for item in items:
        shutil.copy(source / "activations" / f"{item}.kv.safetensors",
                    cube / "activations" / f"{item}.kv.safetensors")


@pytest.fixture
def pushed(bundle, zoo, hub):
    """6 memories (item-000..item-005), two a shard, pushed; with a copy of it (another user's
    pull of the same commit)."""
    cube = bundle(8)
    for item in ("item-006", "item-007"):
        (cube / "activations" / f"{item}.kv.safetensors").unlink()
    size = next((cube / "activations").iterdir()).stat().st_size
    cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]), shard_size=2 * size + 100)
    _push(hub, cube)
    other = cube.parent / "other-copy"
    shutil.copytree(cube, other)
    hub.stats.reset()
    return cube, other


def _remote_lock(hub, revision="main"):
    remote = cubepack.open(f"me/cube@{revision}", endpoint=hub.url, token=HUB_TOKEN)
    return remote.lock


def test_a_racing_push_loses_with_push_conflict_and_the_winner_stays(pushed, zoo, hub,
                                                                    bundle_factory,
                                                                    monkeypatch):
    mine, theirs = pushed
    source = bundle_factory(8)
    _add(mine, source, "item-006")
    cubepack.pack(mine, cube_id="me/cube", model=str(zoo["a"]))
    _add(theirs, source, "item-007")
    cubepack.pack(theirs, cube_id="me/cube", model=str(zoo["a"]))
    real = HubClient.create_commit
    raced = []

    def racing(self, *args, **kwargs):
        if not raced:  # the other push lands between this push's plan and its commit
            raced.append(None)
            raced[0] = _push(hub, theirs)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(HubClient, "create_commit", racing)
    with pytest.raises(PushConflict, match="Pull it .*re-pack your changes onto it"):
        _push(hub, mine)
    assert hub.stats.requests.get("POST /api/datasets/me/cube/commit/main", 0) >= 2
    winner = raced[0]
    lock = _remote_lock(hub)
    assert cubepack.open("me/cube@main", endpoint=hub.url, token=HUB_TOKEN).commit == \
        winner.commit_sha
    assert lock.digest == json.loads((theirs / constants.LOCK_FILENAME).read_text())["digest"]
    pulled = cubepack.pull("me/cube", endpoint=hub.url, token=HUB_TOKEN,
                           local_dir=mine.parent / "pulled")
    assert pulled.commit_sha == winner.commit_sha  # the winner's cube, whole and verified
    assert sorted(cubepack.verify(mine.parent / "pulled").lock.shards) == sorted(
        json.loads((theirs / constants.LOCK_FILENAME).read_text())["shards"])


def test_a_push_racing_an_identical_cube_retries_and_lands(pushed, zoo, hub, monkeypatch,
                                                          bundle_factory):
    mine, theirs = pushed
    source = bundle_factory(8)
    for cube in (mine, theirs):
        _add(cube, source, "item-006")
        cubepack.pack(cube, cube_id="me/cube", model=str(zoo["a"]))
    real = HubClient.create_commit
    raced = []

    def racing(self, *args, **kwargs):
        if not raced:
            raced.append(None)
            raced[0] = _push(hub, theirs, commit_message="theirs")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(HubClient, "create_commit", racing)
    # the other push landed the very cube this one pushes: huggingface_hub finds every file
    # already there and makes no commit (it returns the head's), and the branch holds the cube
    result = _push(hub, mine)
    assert result.commit_sha == raced[0].commit_sha
    assert _remote_lock(hub).digest == json.loads(
        (mine / constants.LOCK_FILENAME).read_text())["digest"]


def test_more_than_the_commit_bound_lands_in_commits_the_lock_last(pushed, zoo, hub,
                                                                  bundle_factory, monkeypatch):
    mine, _ = pushed
    monkeypatch.setattr(_incremental, "COMMIT_FILES", 2)
    source = bundle_factory(8)
    _add(mine, source, "item-006", "item-007")
    size = (source / "activations" / "item-006.kv.safetensors").stat().st_size
    cubepack.pack(mine, cube_id="me/cube", model=str(zoo["a"]), shard_size=size + 10,
                  remove=("item-000",))
    old = _remote_lock(hub)
    real = HubClient.create_commit
    seen = []

    def watching(self, *args, **kwargs):
        if seen and not watching.inside:  # an intermediate state: never presented as the cube
            watching.inside = True
            remote = cubepack.open("me/cube@main", endpoint=hub.url, token=HUB_TOKEN)
            assert remote.lock.digest == old.digest
            with pytest.raises(VerificationFailed, match="not listed in the lock"):
                cubepack.pull("me/cube", endpoint=hub.url, token=HUB_TOKEN,
                              local_dir=mine.parent / f"mid-{len(seen)}")
            watching.inside = False
        commit = real(self, *args, **kwargs)
        seen.append([op.path_in_repo for op in args[1]])
        return commit

    watching.inside = False
    monkeypatch.setattr(HubClient, "create_commit", watching)
    result = _push(hub, mine)
    assert len(result.commits) == len(seen) >= 2
    assert all(len(ops) <= 2 for ops in seen[:-1])
    assert constants.LOCK_FILENAME in seen[-1] and all(
        constants.LOCK_FILENAME not in ops for ops in seen[:-1])
    assert all(op.endswith((".kvshard", ".index.json")) for ops in seen[:-1] for op in ops)
    assert _remote_lock(hub).digest == json.loads(
        (mine / constants.LOCK_FILENAME).read_text())["digest"]


def test_a_changed_signed_cube_is_re_signed_or_refused_unsigned(pushed, zoo, hub, tmp_path,
                                                                bundle_factory):
    pytest.importorskip("model_signing")
    mine, _ = pushed
    private, public = make_key(tmp_path, "signer")
    cubepack.sign(mine, key=str(private))
    _push(hub, mine)
    _add(mine, bundle_factory(8), "item-006")
    cubepack.pack(mine, cube_id="me/cube", model=str(zoo["a"]))
    assert not (mine / constants.SIGNATURE_FILENAME).exists()
    head = _remote_lock(hub).digest
    with pytest.raises(SignatureError, match="--allow-unsigned"):
        _push(hub, mine)
    assert _remote_lock(hub).digest == head  # nothing pushed
    result = _push(hub, mine, sign_key=str(private))
    assert constants.SIGNATURE_FILENAME in result.uploaded
    assert cubepack.verify(mine, trusted_keys=[str(public)]).ok
    cubepack.pack(mine, cube_id="me/cube", model=str(zoo["a"]), remove=("item-006",))
    assert _push(hub, mine, allow_unsigned=True).changed


def test_an_interrupted_push_in_commits_is_completed_by_pushing_again(pushed, zoo, hub,
                                                                      bundle_factory,
                                                                      monkeypatch):
    mine, _ = pushed
    monkeypatch.setattr(_incremental, "COMMIT_FILES", 2)
    source = bundle_factory(8)
    _add(mine, source, "item-006", "item-007")
    size = (source / "activations" / "item-006.kv.safetensors").stat().st_size
    cubepack.pack(mine, cube_id="me/cube", model=str(zoo["a"]), shard_size=size + 10)
    old = _remote_lock(hub)
    real = HubClient.create_commit
    calls = []

    def failing(self, *args, **kwargs):
        calls.append([op.path_in_repo for op in args[1]])
        if len(calls) == 2:
            raise ConnectionError("the link went down")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(HubClient, "create_commit", failing)
    with pytest.raises(Exception):
        _push(hub, mine)
    assert _remote_lock(hub).digest == old.digest  # the old cube, never a mix
    with pytest.raises(VerificationFailed, match="not listed in the lock"):
        cubepack.pull("me/cube", endpoint=hub.url, token=HUB_TOKEN,
                      local_dir=mine.parent / "half")
    monkeypatch.setattr(HubClient, "create_commit", real)
    hub.stats.reset()
    result = _push(hub, mine)  # the first commit's files are there: not uploaded again
    assert constants.LOCK_FILENAME in result.uploaded
    assert calls[0] and not set(calls[0]) & set(result.uploaded)
    assert _remote_lock(hub).digest == json.loads(
        (mine / constants.LOCK_FILENAME).read_text())["digest"]
    pulled = cubepack.pull("me/cube", endpoint=hub.url, token=HUB_TOKEN,
                           local_dir=mine.parent / "whole")
    assert pulled.commit_sha == result.commit_sha


def test_a_push_racing_between_its_commits_leaves_the_winners_cube(pushed, zoo, hub,
                                                                  bundle_factory, monkeypatch):
    """The other push lands after this push's first commit (new shards, no lock): it plans on
    top of them and deletes them; this push's next commit is stale, the lock changed, so it
    stops with PushConflict; the branch is exactly the winner's cube (pull takes it whole)."""
    mine, theirs = pushed
    monkeypatch.setattr(_incremental, "COMMIT_FILES", 2)
    source = bundle_factory(8)
    _add(mine, source, "item-006", "item-007")
    size = (source / "activations" / "item-006.kv.safetensors").stat().st_size
    cubepack.pack(mine, cube_id="me/cube", model=str(zoo["a"]), shard_size=size + 10)
    cubepack.pack(theirs, cube_id="me/cube", model=str(zoo["a"]), remove=("item-000",))
    real = HubClient.create_commit
    calls, won = [], []

    def racing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # this push's second commit: the other lands first
            won.append(_push(hub, theirs))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(HubClient, "create_commit", racing)
    with pytest.raises(PushConflict):
        _push(hub, mine)
    winner = won[0]
    remote = cubepack.open("me/cube@main", endpoint=hub.url, token=HUB_TOKEN)
    assert remote.commit == winner.commit_sha
    assert remote.lock.digest == json.loads(
        (theirs / constants.LOCK_FILENAME).read_text())["digest"]
    pulled = cubepack.pull("me/cube", endpoint=hub.url, token=HUB_TOKEN,
                           local_dir=mine.parent / "pulled")  # no stray file of the loser
    assert pulled.commit_sha == winner.commit_sha
