"""A replay met by ``cubepack.open``: the owner rekeyed a private sharded cube (generation 2,
signed, recorded on their machine as seen), and someone who can push pushes generation 1 back
(validly signed by the same key, still readable by whoever generation 2 removed). Pull and
verify refuse it against the generations this client has seen; ``open(trusted_keys=...)``
must too, before any memory is fetched, rather than load the older memories."""

from __future__ import annotations

import shutil

import pytest
import torch

import cubepack
from cubepack.errors import RefusedError

from data import HUB_TOKEN
from helpers import build_cache, make_key


def test_open_refuses_a_generation_older_than_one_seen(zoo, models, agekeys, tmp_path,
                                                       monkeypatch):
    pytest.importorskip("model_signing")
    from cubepack.testing.hub import InstrumentedHub

    monkeypatch.setenv("CUBEPACK_CACHE", str(tmp_path / "owner-cache"))
    signer, signer_pub = make_key(tmp_path, "owner")
    cube = tmp_path / "cube"
    (cube / "activations").mkdir(parents=True)
    producer = cubepack.fingerprint(zoo["a"])
    for index in range(3):
        ids = [index + k + 1 for k in range(8)]
        cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([ids])),
                               cube / "activations" / f"item-{index:03d}.kv.safetensors",
                               producer=producer, token_ids=ids)
    cubepack.pack(cube, cube_id="me/replayed", model=str(zoo["a"]), shards=True)
    cubepack.encrypt(cube, [agekeys["alice"][1], agekeys["bob"][1]], sign_key=str(signer))
    older = tmp_path / "generation-1"
    shutil.copytree(cube, older)
    cubepack.rekey(cube, agekeys["alice"][0], remove=[agekeys["bob"][1]],
                   sign_key=str(signer), trusted_keys=[str(signer_pub)])
    with InstrumentedHub(tmp_path / "hub-root", tokens=[HUB_TOKEN]) as hub:
        cubepack.push(older, "me/replayed", endpoint=hub.url, token=HUB_TOKEN,
                      allow_local_paths=True)
        with pytest.raises(RefusedError, match="older than generation 2"):
            opened = cubepack.open("me/replayed", endpoint=hub.url, token=HUB_TOKEN,
                                   trusted_keys=[str(signer_pub)])
            opened.load("item-001", models["a"], decrypt_with=agekeys["alice"][0])
