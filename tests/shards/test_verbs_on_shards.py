"""The other verbs on a sharded cube (issue #40): sign then verify under the signer's key;
migrate to another model; encrypt (private sharded cubes are a later item: refused, naming the
way to unshard)."""

from __future__ import annotations

import shutil

import pytest

import cubepack
from cubepack._util import constants
from cubepack.format import _lock as lockfile

from helpers import make_key


@pytest.fixture(scope="module")
def sharded(bundle_factory, zoo, tmp_path_factory):
    cube = tmp_path_factory.mktemp("sharded") / "cube"
    shutil.copytree(bundle_factory(3), cube)
    cubepack.pack(cube, cube_id="me/verbs", model=str(zoo["a"]), shards=True)
    return cube


@pytest.fixture
def cube(sharded, tmp_path):
    return shutil.copytree(sharded, tmp_path / "cube")


def test_sign_then_verify_under_the_signers_key(cube, zoo, tmp_path):
    pytest.importorskip("model_signing")
    private, public = make_key(tmp_path, "signer")
    cubepack.sign(cube, key=str(private), model=str(zoo["a"]))
    report = cubepack.verify(cube, model=str(zoo["a"]), trusted_keys=[str(public)])
    assert report.ok, [str(c) for c in report.failures]
    assert sorted(report.provenance) == ["item-000", "item-001", "item-002"]


def test_migrate_a_sharded_cube(cube, zoo, tmp_path):
    out = tmp_path / "migrated"
    cubepack.migrate(cube, out=out, model=str(zoo["b"]))
    lock = lockfile.parse((out / constants.LOCK_FILENAME).read_bytes())
    assert lock.shards and cubepack.verify(out, model=str(zoo["b"])).ok


def test_encrypt_takes_a_sharded_cube(cube):
    """Each shard and index a ciphertext, the shards section in the encrypted manifest only
    (tests/private/test_private_shards.py decrypts, rekeys, pulls and loads them)."""
    recipient = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"
    result = cubepack.encrypt(cube, [recipient])
    public = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    assert not public.shards and public.encryption.counts.of("activations") == 3
    assert not list(cube.rglob("*.kvshard")) and result.ciphertexts == len(
        [name for name in public.files if name.endswith(".age")]) - 1  # the manifest
    assert cubepack.verify(cube).ok
