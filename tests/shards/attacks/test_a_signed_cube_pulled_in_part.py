"""A signed cube pulled in part: its signature binds its lock, whose digests bind every file
and index, and every byte present is checked against them; so a trusted key's signature
verifies on the partial cube (``--require-signature`` applies to what is here), while a
signature over another lock, or a lock changed after the pull, is still refused."""

from __future__ import annotations

import shutil

import pytest

import cubepack
from cubepack.errors import VerificationFailed

from data import HUB_TOKEN

pytest.importorskip("model_signing")


@pytest.fixture
def signed(sharded, tmp_path, zoo, hub):
    from helpers import make_key

    cube = tmp_path / "cube"
    shutil.copytree(sharded, cube)
    private, public = make_key(tmp_path, "signer")
    cubepack.sign(cube, key=str(private), model=str(zoo["a"]))
    cubepack.push(cube, "me/cube", endpoint=hub.url, token=HUB_TOKEN, allow_local_paths=True)
    target = tmp_path / "p"
    cubepack.pull("me/cube", endpoint=hub.url, token=HUB_TOKEN, local_dir=target,
                  include=["item-002"], trusted_keys=[str(public)], require_signature=True)
    return target, public, tmp_path


def test_the_signature_verifies_on_the_memories_present(signed):
    target, public, _ = signed
    report = cubepack.verify(target, trusted_keys=[str(public)], require_signature=True)
    assert report.ok and report.signed_by and report.partial["checked"] == 1


def test_another_key_is_still_refused(signed):
    from helpers import make_key

    target, _, tmp_path = signed
    _, other = make_key(tmp_path, "other")
    with pytest.raises(VerificationFailed, match="signature"):
        cubepack.verify(target, trusted_keys=[str(other)], require_signature=True)
