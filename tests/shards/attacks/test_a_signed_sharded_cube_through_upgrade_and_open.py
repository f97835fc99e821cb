"""Compositions: a sharded cube signed, then ``upgrade --no-shards`` (its lock changes: the
signature must not be presented as covering it), a no-op upgrade (the signature still holds),
and a signed sharded cube opened with ``trusted_keys`` after its memories were unsharded by
someone else (the signature no longer covers the lock)."""

from __future__ import annotations

import pytest

import cubepack
from cubepack._util import constants

pytest.importorskip("model_signing")


@pytest.fixture
def signed(cube, zoo, tmp_path):
    from helpers import make_key

    private, public = make_key(tmp_path, "signer")
    cubepack.sign(cube, key=str(private), model=str(zoo["a"]))
    assert cubepack.verify(cube, model=str(zoo["a"]), trusted_keys=[str(public)]).ok
    return cube, public


def test_upgrade_no_shards_leaves_no_signature_claiming_the_new_lock(signed, zoo):
    cube, public = signed
    result = cubepack.upgrade(cube, str(zoo["a"]), shards=False)
    assert result.unsigned and result.sign_again
    assert not any((cube / name).exists() for name in result.unsigned)
    report = cubepack.verify(cube, model=str(zoo["a"]), trusted_keys=[str(public)],
                             raise_on_failure=False)
    assert not report.ok
    assert cubepack.verify(cube, model=str(zoo["a"])).ok  # unsigned, but sound


def test_a_no_op_upgrade_keeps_the_signature(signed, zoo):
    cube, public = signed
    result = cubepack.upgrade(cube, str(zoo["a"]))
    assert result.upgraded == []
    assert cubepack.verify(cube, model=str(zoo["a"]), trusted_keys=[str(public)]).ok


def test_open_refuses_a_signed_cube_unsharded_by_another(hub, signed, remote, zoo):
    """The signer's signature and attestation stay in the repo; someone unshards the cube and
    uploads its new lock and files beside them: open(trusted_keys) refuses it."""
    cube, public = signed
    remote.push(hub, cube)
    signing = {name: (cube / name).read_bytes() for name in (constants.SIGNATURE_FILENAME,
                                                            constants.ATTESTATION_FILENAME)}
    cubepack.upgrade(cube, str(zoo["a"]), shards=False)
    for name, data in signing.items():
        (cube / name).write_bytes(data)
    names = [p.relative_to(cube).as_posix() for p in cube.rglob("*") if p.is_file()]
    remote.upload(hub, cube, names)
    with pytest.raises(cubepack.SignatureError):
        remote.open(hub, trusted_keys=[str(public)])


def test_pack_sharded_sign_open_trusted_load(hub, signed, remote, models):
    cube, public = signed
    remote.push(hub, cube)
    opened = remote.open(hub, trusted_keys=[str(public)])
    assert opened.signed_by == str(public)
    for index in range(5):
        assert opened.load(f"item-{index:03d}", models["a"]).get_seq_length() == 4
