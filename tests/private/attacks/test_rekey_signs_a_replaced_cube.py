"""Promise 5 and SECURITY.md's "unsigned replacement": ``rekey --sign-key`` re-signs whatever
sits in the folder. It verifies the cube without any trusted key, so a signed private cube
whose content an attacker replaced (their own cube encrypted to the same public recipient;
the owner's signature left behind, now failing) is re-encrypted and signed with the owner's
key. The owner never sees the plaintext they sign (it is encrypted), and afterwards
``verify --trusted-key owner`` passes on the attacker's memories: a claim gained strength.
A rekey that signs must first check the signature it replaces (with the signing key's own
public half), or refuse."""

from __future__ import annotations

import shutil

import pytest
from private_keys import age_keys, private_copy

import cubepack
from cubepack._util import constants
from cubepack.errors import CubepackError
from cubepack.format import _fileset as fileset
from cubepack.ops._encrypt import rekey

from helpers import make_key


def test_rekey_does_not_sign_an_attackers_replacement(packed_cube_factory, tmp_path):
    pytest.importorskip("pyrage")
    pytest.importorskip("model_signing")
    keys = age_keys(tmp_path, "alice", "bob")
    owner, owner_pub = make_key(tmp_path, "owner")
    cube = private_copy(packed_cube_factory(), tmp_path / "cube", [keys["alice"][1]],
                        sign_key=owner)
    assert cubepack.verify(cube, trusted_keys=[owner_pub]).ok
    # Mallory: her own memories, encrypted to alice's public key, swapped in for the cube's
    # files; the owner's signing files stay (they no longer verify).
    forged = private_copy(packed_cube_factory({"planted": [7, 7, 7]}), tmp_path / "forged",
                          [keys["alice"][1]])
    for path in list(cube.iterdir()):
        if path.name not in fileset.SIGNING:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for path in forged.iterdir():
        (shutil.copytree if path.is_dir() else shutil.copy2)(path, cube / path.name)
    assert not cubepack.verify(cube, trusted_keys=[owner_pub], raise_on_failure=False).ok
    assert (cube / constants.SIGNATURE_FILENAME).is_file()
    # The owner adds bob and re-signs, as the docs show.
    try:
        rekey(cube, keys["alice"][0], add=[keys["bob"][1]], sign_key=owner)
    except CubepackError:
        return  # refused: what a signing rekey must do here
    report = cubepack.verify(cube, trusted_keys=[owner_pub], decrypt_with=keys["alice"][0],
                             raise_on_failure=False)
    assert not report.ok, ("rekey signed the attacker's memories with the owner's key: "
                           f"{sorted(report.private_lock.activations)}")
