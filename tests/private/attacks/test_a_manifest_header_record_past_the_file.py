"""A private cube's manifest is whoever encrypted it last's word: in an unsigned cube, anyone who
can push encrypts their own to the readers. Its version-3 header records say where each
ciphertext's payload starts; one that starts past the file (2**52 bytes in) must be refused as
a lie about the file, not read: ``pread`` of a length that large allocates it first (a
MemoryError escapes, untyped; at 10**9, a GB is allocated before the header is refused), and a
Range request asks the endpoint for it."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

import cubepack
from cubepack._util import canonical, constants
from cubepack.errors import CubepackError
from cubepack.format import _lock as lockfile
from cubepack.trust import _age as age


def _forge_manifest(cube, identity, recipient, change) -> None:
    """Decrypt the manifest, change it, encrypt it again to ``recipient`` and reseal the
    public lock over it (an unsigned cube: anyone who can push)."""
    name = "cubepack.manifest.age"
    plain = age.decrypt((cube / name).read_bytes(), age.load_identities(identity), name)
    manifest = json.loads(bytes(plain))
    change(manifest)
    data = bytes(age.encrypt(canonical.dumps(manifest).encode(),
                             age.parse_recipients([recipient])))
    (cube / name).write_bytes(data)
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    lock["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (cube / constants.LOCK_FILENAME).write_text(lockfile.dumps(lockfile.build_lock(
        cube_id=lock["cube_id"], files=lock["files"], models=lock["models"],
        cubepack_version=lock["cubepack_version"], encryption=lock["encryption"])))


@pytest.mark.parametrize("start", [2 ** 52, 10 ** 9])
def test_a_payload_start_past_the_file_is_refused_typed(bundle_of_shards, agekeys, models,
                                                        tmp_path, start):
    cube = tmp_path / "cube"
    shutil.copytree(bundle_of_shards, cube)
    cubepack.encrypt(cube, [agekeys["alice"][1]])
    shard = "shards/activations-00000.kvshard.age"

    def change(manifest):
        manifest["headers"][shard][0] = start
    _forge_manifest(cube, agekeys["alice"][0], agekeys["alice"][1], change)
    with pytest.raises(CubepackError, match="payload starts past"):
        cubepack.load_kv_cache(cube, models["a"], item="item-000",
                               decrypt_with=agekeys["alice"][0])


@pytest.fixture(scope="module")
def bundle_of_shards(zoo, models, tmp_path_factory):
    import torch

    from helpers import build_cache

    cube = tmp_path_factory.mktemp("forged") / "clear"
    (cube / "activations").mkdir(parents=True)
    producer = cubepack.fingerprint(zoo["a"])
    for index in range(3):
        ids = [index + k + 1 for k in range(8)]
        cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([ids])),
                               cube / "activations" / f"item-{index:03d}.kv.safetensors",
                               producer=producer, token_ids=ids)
    cubepack.pack(cube, cube_id="me/forged", model=str(zoo["a"]), shards=True)
    return cube
