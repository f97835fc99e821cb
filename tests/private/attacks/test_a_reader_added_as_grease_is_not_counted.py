"""Issue #37 item 3: "The public recipient count is checked against the files' stanzas".
SECURITY.md: "Anyone can check without a key that every ciphertext's age header names as many
recipients as the public lock counts (`recipients`): a reader a recipient added to every file
of an unsigned cube, re-sealing its lock but not its count, is refused".

The attack: bob, a recipient of an unsigned private cube, adds mallory to every file's header
as before (the round-1 break, fixed by counting stanzas), but names her stanza's type
``x-grease``. The age spec lets a stanza carry any type; whoever holds the matching identity
unwraps it (an age plugin gets every stanza, whatever its type). The count skips any type
ending in ``-grease`` (the age crate's random padding stanzas), so the stanza is not counted and
not listed among "stanzas of a kind cubepack never writes": the keyless verify passes a cube
whose every file mallory opens (shown here by unwrapping her stanza and decrypting the manifest
with the file key)."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from private_keys import age_keys, private_copy, reseal_private, x25519_secret

import cubepack
from cubepack._util import constants

GREASE = b"x-grease"


def add_grease_reader(data: bytes, secret, recipient: str) -> bytes:
    """``data`` with one more stanza wrapping its file key to ``recipient`` (the X25519 recipe)
    under the type ``x-grease``, and the header MAC recomputed (any recipient can)."""
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
    header = covered[:-len(b"\n---")] + b"\n-> " + GREASE + b" " + stream._b64(share) + \
        b"\n" + stream._b64(wrapped) + b"\n---"
    mac = hmac.new(stream._hkdf(file_key, b"", b"header"), header, hashlib.sha256).digest()
    return header + b" " + stream._b64(mac) + b"\n" + bytes(data[start:])


def mallory_reads(data: bytes, identity_file) -> bytes:
    """What mallory decrypts: her ``x-grease`` stanza unwrapped with her X25519 key (what a
    plugin of hers does), then the payload with the file key."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    from cubepack.trust import _age_stream as stream

    stanzas, _, _, start = stream._parse_header(data, "file")
    [(args, body)] = [(args, body) for args, body in stanzas if args[0] == GREASE]
    share = _unb64(args[1])

    private = X25519PrivateKey.from_private_bytes(_secret_bytes(identity_file))
    public = private.public_key().public_bytes_raw()
    shared = private.exchange(X25519PublicKey.from_public_bytes(share))
    file_key = ChaCha20Poly1305(stream._hkdf(shared, share + public, stream._X25519_LABEL)) \
        .decrypt(bytes(12), _unb64(body), None)
    # The payload: a 16-byte nonce, then STREAM chunks of 64 KiB + 16 under HKDF(nonce).
    payload = bytes(data[start:])
    key = stream._hkdf(file_key, payload[:16], b"payload")
    chunks, out, rest = ChaCha20Poly1305(key), [], payload[16:]
    counter = 0
    while rest:
        chunk, rest = rest[:65536 + 16], rest[65536 + 16:]
        nonce = counter.to_bytes(11, "big") + (b"\x01" if not rest else b"\x00")
        out.append(chunks.decrypt(nonce, chunk, None))
        counter += 1
    return b"".join(out)


def _unb64(text: bytes) -> bytes:
    import base64

    text = bytes(text)
    return base64.b64decode(text + b"=" * (-len(text) % 4))


def _secret_bytes(identity_file) -> bytes:
    from cubepack.trust import _age_stream as stream

    line = next(line for line in identity_file.read_text().splitlines()
                if line.startswith("AGE-SECRET-KEY-"))
    return bytes(stream.bech32_bytes(line, "age-secret-key-"))


def test_a_reader_added_under_a_grease_type_is_refused_by_a_keyless_verify(packed, tmp_path):
    pytest.importorskip("pyrage")
    keys = age_keys(tmp_path, "alice", "bob", "mallory")
    cube = private_copy(packed, tmp_path / "cube", [keys["alice"][1], keys["bob"][1]])
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    names = [*lock["encryption"]["ciphertexts"], lock["encryption"]["manifest"]]
    for name in names:
        path = cube / name
        path.write_bytes(add_grease_reader(path.read_bytes(), x25519_secret(keys["bob"][0]),
                                           keys["mallory"][1]))
    reseal_private(cube)
    # Mallory opens every file; alice (a recipient) still does too, the files are valid age.
    manifest = (cube / lock["encryption"]["manifest"]).read_bytes()
    assert mallory_reads(manifest, keys["mallory"][0]).startswith(b"{")
    from cubepack.trust import _age as age

    assert age.decrypt(manifest, age.load_identities(keys["alice"][0]), "manifest")
    with_key = cubepack.verify(cube, raise_on_failure=False, decrypt_with=keys["alice"][0])
    assert not with_key.ok, "alice's verify with her key passed it too"
    report = cubepack.verify(cube, raise_on_failure=False)
    found = [c for c in report.checks if c.name == "recipients"]
    assert not report.ok, ("a keyless verify passed a cube whose every file a third reader "
                           f"opens: {[(c.ok, c.detail) for c in found]}")
    assert [c for c in report.failures if c.name == "recipients"], report.failures
