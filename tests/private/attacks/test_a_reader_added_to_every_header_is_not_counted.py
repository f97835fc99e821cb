"""Issue #37 item 3: "the public recipient count is checked against the files' stanzas". A
recipient of an unsigned private cube (bob, who can unwrap every file key) adds a stanza for
mallory to every file's age header, recomputes each header MAC with the file key, and re-seals
the public lock over the new ciphertexts, leaving its recipient count at 2: ``verify`` without
a key passed it, and mallory reads every file. The same for a count changed alone."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from private_keys import age_keys, private_copy, reseal_private, x25519_secret

import cubepack
from cubepack._util import constants


def add_reader(data: bytes, secret, recipient: str) -> bytes:
    """``data`` (an age file ``secret`` opens) with one more X25519 stanza, for ``recipient``,
    and its header MAC recomputed: what any recipient can do to a file."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    from cubepack.trust import _age_stream as stream

    stanzas, covered, _, start = stream._parse_header(data, "file")
    file_key = stream._file_key(stanzas, [secret], "file")
    public = stream.bech32_bytes(recipient, "age")
    ephemeral = X25519PrivateKey.generate()
    share = ephemeral.public_key().public_bytes_raw()
    shared = ephemeral.exchange(X25519PublicKey.from_public_bytes(public))
    wrapped = ChaCha20Poly1305(stream._hkdf(shared, share + public, stream._X25519_LABEL)) \
        .encrypt(bytes(12), file_key, None)
    header = covered[:-len(b"\n---")] + b"\n-> X25519 " + stream._b64(share) + b"\n" + \
        stream._b64(wrapped) + b"\n---"
    mac = hmac.new(stream._hkdf(file_key, b"", b"header"), header, hashlib.sha256).digest()
    return header + b" " + stream._b64(mac) + b"\n" + bytes(data[start:])


def test_a_stanza_added_for_another_reader_is_refused_by_a_keyless_verify(packed, tmp_path):
    pytest.importorskip("pyrage")
    keys = age_keys(tmp_path, "alice", "bob", "mallory")
    cube = private_copy(packed, tmp_path / "cube", [keys["alice"][1], keys["bob"][1]])
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    for name in [*lock["encryption"]["ciphertexts"], lock["encryption"]["manifest"]]:
        path = cube / name
        path.write_bytes(add_reader(path.read_bytes(), x25519_secret(keys["bob"][0]),
                                    keys["mallory"][1]))
    reseal_private(cube)
    from cubepack.trust import _age as age

    manifest = lock["encryption"]["manifest"]  # mallory reads it now, and every other file
    assert age.decrypt((cube / manifest).read_bytes(), age.load_identities(keys["mallory"][0]),
                       manifest)
    report = cubepack.verify(cube, raise_on_failure=False)
    assert not report.ok, "a keyless verify passed a cube whose files name 3 readers, count 2"
    [found] = [c for c in report.failures if c.name == "recipients"]
    assert found.expected == 2 and found.found == 3, found


def test_a_count_changed_alone_is_refused(packed, tmp_path):
    pytest.importorskip("pyrage")
    keys = age_keys(tmp_path, "alice")
    cube = private_copy(packed, tmp_path / "cube", [keys["alice"][1]])
    reseal_private(cube, lambda lock: lock["encryption"]["counts"].update(recipients=3))
    report = cubepack.verify(cube, raise_on_failure=False)
    assert [(c.expected, c.found) for c in report.failures if c.name == "recipients"], \
        report.checks
