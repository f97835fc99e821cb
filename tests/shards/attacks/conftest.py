"""Attacks on sharded cubes and memories on demand (issue #40): a sound sharded cube pushed
to the local endpoint, then changed there as someone with write access to the repo would
(files uploaded as they are, with no cubepack check on the way)."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

import cubepack
from cubepack._util import canonical

from data import HUB_TOKEN
from helpers import reseal_lock

INDEX0 = "shards/activations-00000.index.json"
SHARD0 = "shards/activations-00000.kvshard"
INDEX1 = "shards/activations-00001.index.json"
SHARD1 = "shards/activations-00001.kvshard"


@pytest.fixture
def cube(sharded, tmp_path):
    target = tmp_path / "cube"
    shutil.copytree(sharded, target)
    return target


def push(hub, cube, repo="me/cube"):
    return cubepack.push(cube, repo, endpoint=hub.url, token=HUB_TOKEN,
                         allow_local_paths=True).commit_sha


def upload(hub, cube, names, repo="me/cube", message="planted"):
    """Upload ``names`` of ``cube`` as they are (a commit made without cubepack)."""
    from huggingface_hub import CommitOperationAdd

    from cubepack.hub import HubClient

    return HubClient(hub.url, HUB_TOKEN).create_commit(
        repo, [CommitOperationAdd(name, (cube / name).read_bytes()) for name in names],
        repo_type="dataset", branch="main", message=message)


def file_entry(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def plant(cube, name: str, data: bytes | str) -> None:
    """Write ``data`` as the cube's file ``name`` and reseal the lock over its bytes."""
    data = data.encode() if isinstance(data, str) else data
    (cube / name).write_bytes(data)
    reseal_lock(cube, lambda lock: lock["files"].__setitem__(name, file_entry(data)))


def edit_index(cube, name: str, change) -> None:
    index = json.loads((cube / name).read_text())
    change(index)
    plant(cube, name, canonical.dumps(index, compact=True))


def open_cube(hub, repo="me/cube", **kwargs):
    return cubepack.open(repo, endpoint=hub.url, token=HUB_TOKEN, **kwargs)


@pytest.fixture
def remote():
    """The helpers above, for the attacks' tests (a conftest is not imported by name)."""
    from types import SimpleNamespace

    return SimpleNamespace(push=push, upload=upload, plant=plant, edit_index=edit_index,
                           open=open_cube, file_entry=file_entry, INDEX0=INDEX0, SHARD0=SHARD0,
                           INDEX1=INDEX1, SHARD1=SHARD1)
