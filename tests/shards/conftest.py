"""Sharded cubes (issue #40): a plain bundle of N small KV files of model A, built once; the
same 5 memories packed two a shard; a loopback endpoint that counts requests and bytes."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def bundle_factory(tmp_path_factory, zoo, models):
    """``make(count, *, tokens=4)`` -> a folder of ``count`` KV files (not packed), built once
    per session per request: copy it before changing it."""
    import torch

    import cubepack
    from helpers import build_cache

    built = {}

    def make(count: int, *, tokens: int = 4):
        if (count, tokens) not in built:
            folder = tmp_path_factory.mktemp("bundle") / "cube"
            (folder / "activations").mkdir(parents=True)
            identity = cubepack.fingerprint(zoo["a"])
            for index in range(count):
                ids = [(index * 7 + k) % 50 + 1 for k in range(tokens)]
                cache = build_cache(models["a"], torch.tensor([ids]))
                name = f"item-{index:03d}.kv.safetensors"
                cubepack.save_kv_cache(cache, folder / "activations" / name, producer=identity,
                                       token_ids=ids, metadata={"id": f"item-{index:03d}"})
            built[(count, tokens)] = folder
        return built[(count, tokens)]

    return make


@pytest.fixture
def bundle(bundle_factory, tmp_path):
    """A fresh copy of a 5-memory bundle."""
    def copy(count: int = 5, **kwargs):
        target = tmp_path / f"cube-{count}"
        shutil.copytree(bundle_factory(count, **kwargs), target)
        return target
    return copy


@pytest.fixture
def hub(tmp_path):
    """A fresh instrumented endpoint (it counts requests and the bytes it sends)."""
    from cubepack.testing.hub import InstrumentedHub
    from data import HUB_TOKEN

    with InstrumentedHub(tmp_path / "hub-root", tokens=[HUB_TOKEN]) as server:
        yield server


@pytest.fixture(scope="module")
def sharded(bundle_factory, zoo, tmp_path_factory):
    """5 memories packed two a shard (shards 0, 1, 2), once per module: copy it before changing
    it (a module may define its own ``sharded``, packed otherwise)."""
    import cubepack

    cube = tmp_path_factory.mktemp("sharded") / "cube"
    shutil.copytree(bundle_factory(5), cube)
    size = next((cube / "activations").iterdir()).stat().st_size
    cubepack.pack(cube, cube_id="me/sharded", model=str(zoo["a"]), shard_size=2 * size + 100)
    return cube


@pytest.fixture
def partial(hub, sharded, tmp_path):
    """``sharded`` pushed to ``me/cube`` and pulled in part (``--include item-002``, a sparse
    shard 1) into ``tmp_path / "p"``."""
    import cubepack
    from data import HUB_TOKEN

    cubepack.push(sharded, "me/cube", endpoint=hub.url, token=HUB_TOKEN,
                  allow_local_paths=True)
    target = tmp_path / "p"
    cubepack.pull("me/cube", endpoint=hub.url, token=HUB_TOKEN, local_dir=target,
                  include=["item-002"])
    return target
