"""SECURITY.md, "Unsigned replacement": "Sign private cubes and verify with --trusted-key: ...
a swapped ciphertext ... is refused before anything is decrypted." It is refused only when
the swap leaves the lock's sha256 behind. An attacker who replaces the whole cube (their own
memories encrypted to the reader's public key, a consistent public lock) fails the trusted
signature, yet ``verify --trusted-key K --identity KEY`` (and ``pull``, ``init_from_dir``
through it) still decrypts every one of the attacker's files with the reader's key into RAM
and runs the clear cube's parsers on them: the sender the reader asked to authenticate was
not, and the attacker's plaintext is handled first. Decryption must wait for the signature
the policy requires."""

from __future__ import annotations

import pytest
from private_keys import age_keys, private_copy

import cubepack
from cubepack.format import _fileset as fileset
from cubepack.trust import _age as age

from helpers import make_key


def test_nothing_is_decrypted_when_the_trusted_signature_fails(packed_cube_factory, tmp_path,
                                                               monkeypatch):
    pytest.importorskip("pyrage")
    pytest.importorskip("model_signing")
    keys = age_keys(tmp_path, "alice")
    _, owner_pub = make_key(tmp_path, "owner")
    mallory, _ = make_key(tmp_path, "mallory")
    cube = private_copy(packed_cube_factory({"planted": [7, 7, 7]}), tmp_path / "cube",
                        [keys["alice"][1]], sign_key=mallory)
    assert (cube / fileset.SIGNING[0]).is_file()
    decrypted = []
    real = age.decrypt

    def spy(data, identities, what):
        decrypted.append(what)
        return real(data, identities, what)

    monkeypatch.setattr(age, "decrypt", spy)
    report = cubepack.verify(cube, trusted_keys=[owner_pub], decrypt_with=keys["alice"][0],
                             raise_on_failure=False)
    assert not report.ok and any(c.name == "signature" and c.ok is False for c in report.checks)
    assert decrypted == [], f"decrypted before the signature held: {decrypted}"
