"""age's SSH recipients and identities (``ssh-ed25519``, ``ssh-rsa``), natively on
``cryptography``, as the reference implementation (filippo.io/age/agessh) defines them:

- both stanzas carry a tag: the first 4 bytes of the SHA-256 of the SSH public key's wire
  encoding, unpadded base64 (so an SSH recipient is public: see SECURITY.md);
- ``ssh-rsa``: ``-> ssh-rsa TAG``, the body the file key under RSA-OAEP (SHA-256, MGF1
  SHA-256) with the label ``age-encryption.org/v1/ssh-rsa``;
- ``ssh-ed25519``: ``-> ssh-ed25519 TAG SHARE``, X25519 with the Ed25519 key's birational
  Montgomery form (the secret: the first 32 bytes of SHA-512 of the Ed25519 seed), the shared
  secret multiplied again by a tweak (HKDF-SHA256 of nothing, salt the SSH public key's wire
  encoding, info the label ``age-encryption.org/v1/ssh-ed25519``), then HKDF-SHA256 (salt
  the share and the recipient's Montgomery key, the same label) wrapping the file key with
  ChaCha20-Poly1305, as the X25519 stanza does.

Private keys are read with ``cryptography``: OpenSSH's own format (passphrase-protected too:
bcrypt-pbkdf, the ``bcrypt`` package) and PEM (PKCS#1, PKCS#8). Interoperability is tested
both ways against Debian's ``age`` CLI and pyrage.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from ..errors import FormatError, RefusedError, UsageError
from . import _age_stream as _stream

RSA_LABEL = b"age-encryption.org/v1/ssh-rsa"
ED25519_LABEL = b"age-encryption.org/v1/ssh-ed25519"
#: age refuses smaller RSA keys (filippo.io/age/agessh: "RSA key size is too small").
MIN_RSA_BITS = 2048
_P = 2 ** 255 - 19
_D = -121665 * pow(121666, -1, _P) % _P


def tag(wire: bytes) -> bytes:
    """The stanza tag of the SSH public key whose wire encoding is ``wire``."""
    return _stream._b64(hashlib.sha256(wire).digest()[:4])


def _montgomery(public: bytes) -> bytes | None:
    """The X25519 (Montgomery u) form of the Ed25519 public key ``public``, None when it is
    not a point of the curve (as Go's edwards25519 refuses it)."""
    if len(public) != 32:
        return None
    y = int.from_bytes(public, "little") & ((1 << 255) - 1)
    sign = public[31] >> 7
    if y >= _P:
        return None
    x2 = (y * y - 1) * pow(_D * y * y + 1, -1, _P) % _P
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * pow(2, (_P - 1) // 4, _P) % _P
    if (x * x - x2) % _P or (x == 0 and sign):
        return None
    if y == 1:
        return None  # the identity point: X25519 with it is all zero
    return ((1 + y) * pow(1 - y, -1, _P) % _P).to_bytes(32, "little")


def _wire(public_key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    text = public_key.public_bytes(serialization.Encoding.OpenSSH,
                                   serialization.PublicFormat.OpenSSH)
    return base64.b64decode(text.split()[1])


def _tweak(wire: bytes) -> Any:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    return X25519PrivateKey.from_private_bytes(_stream._hkdf(b"", wire, ED25519_LABEL))


def _tweaked(shared: bytes, wire: bytes, what: str) -> bytes:
    return _stream.exchange(_tweak(wire), shared, "ssh-ed25519", what)


class Ed25519Recipient:
    """An ``ssh-ed25519`` public key as an age recipient."""

    def __init__(self, wire: bytes, montgomery: bytes) -> None:
        self.wire, self.public, self.tag = wire, montgomery, tag(wire)

    def wrap(self, file_key: bytes) -> tuple[list[bytes], bytes]:
        from cryptography.hazmat.primitives.asymmetric.x25519 import (
            X25519PrivateKey,
            X25519PublicKey,
        )

        ephemeral = X25519PrivateKey.generate()
        share = ephemeral.public_key().public_bytes_raw()
        shared = _tweaked(ephemeral.exchange(X25519PublicKey.from_public_bytes(self.public)),
                          self.wire, "a recipient")
        key = _stream._hkdf(shared, share + self.public, ED25519_LABEL)
        return [b"ssh-ed25519", self.tag, _stream._b64(share)], \
            _stream.seal_file_key(key, file_key)


class RSARecipient:
    """An ``ssh-rsa`` public key as an age recipient."""

    def __init__(self, wire: bytes, key: Any) -> None:
        self.wire, self.key, self.tag = wire, key, tag(wire)

    def wrap(self, file_key: bytes) -> tuple[list[bytes], bytes]:
        return [b"ssh-rsa", self.tag], self.key.encrypt(file_key, _oaep())


def _oaep() -> Any:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    return padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()),
                        algorithm=hashes.SHA256(), label=RSA_LABEL)


def recipient(kind: str, text: str, where: str) -> Ed25519Recipient | RSARecipient:
    """The recipient of the SSH public key ``kind`` ``text`` (its base64 field).

    Raises:
        UsageError: malformed, its wire type not ``kind``, an RSA key under 2048 bits, or an
            Ed25519 key that is not a curve point.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    try:
        wire = base64.b64decode(text, validate=True)
        declared = int.from_bytes(wire[:4], "big")
        if wire[4:4 + declared] != kind.encode():
            raise ValueError("its key type differs from its wire encoding's")
        key = serialization.load_ssh_public_key(f"{kind} {text}".encode())
    except (ValueError, binascii.Error, TypeError) as exc:
        raise UsageError(f"{where} is not a valid SSH public key ({exc}).") from None
    if kind == "ssh-rsa" and isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise UsageError(f"{where} is an RSA key of {key.key_size} bits; age (and "
                             f"cubepack) encrypt to RSA keys of {MIN_RSA_BITS} bits or more.")
        return RSARecipient(wire, key)
    if kind == "ssh-ed25519" and isinstance(key, ed25519.Ed25519PublicKey):
        montgomery = _montgomery(key.public_bytes_raw())
        if montgomery is not None:
            return Ed25519Recipient(wire, montgomery)
    raise UsageError(f"{where} is not a valid {kind} public key.")


class Ed25519Identity:
    """An OpenSSH Ed25519 private key as an age identity."""

    def __init__(self, key: Any) -> None:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        self.wire = _wire(key.public_key())
        self.tag = tag(self.wire)
        # The Ed25519 secret scalar, as X25519 takes it (clamped on use).
        self._private = X25519PrivateKey.from_private_bytes(
            hashlib.sha512(key.private_bytes_raw()).digest()[:32])
        self.public = self._private.public_key().public_bytes_raw()

    def recipient(self) -> str:
        return "ssh-ed25519 " + base64.b64encode(self.wire).decode()

    def unwrap(self, args: list[bytes], body: bytes, what: str) -> bytes | None:
        if args[0] != b"ssh-ed25519":
            return None
        if len(args) != 3:
            raise FormatError(f"{what} has a malformed ssh-ed25519 stanza (it takes a tag and "
                              "a share).")
        share = _stream._unb64(args[2], what)
        if len(share) != 32:
            raise FormatError(f"{what} has a malformed ssh-ed25519 stanza (its share is not "
                              "32 bytes).")
        if args[1] != self.tag:
            return None
        shared = _tweaked(_stream.exchange(self._private, share, "ssh-ed25519", what),
                          self.wire, what)
        key = _stream._hkdf(shared, share + self.public, ED25519_LABEL)
        file_key = _stream.open_file_key(key, _stream._unb64(body, what), "ssh-ed25519", what)
        if file_key is None:
            raise _tagged_but_closed(what, "ssh-ed25519")
        return file_key


class RSAIdentity:
    """An OpenSSH (or PEM) RSA private key as an age identity."""

    def __init__(self, key: Any) -> None:
        self._key = key
        self.wire = _wire(key.public_key())
        self.tag = tag(self.wire)

    def recipient(self) -> str:
        return "ssh-rsa " + base64.b64encode(self.wire).decode()

    def unwrap(self, args: list[bytes], body: bytes, what: str) -> bytes | None:
        if args[0] != b"ssh-rsa":
            return None
        if len(args) != 2:
            raise FormatError(f"{what} has a malformed ssh-rsa stanza (it takes one tag).")
        if args[1] != self.tag:
            return None
        try:
            file_key = self._key.decrypt(_stream._unb64(body, what), _oaep())
        except ValueError:
            raise _tagged_but_closed(what, "ssh-rsa") from None
        if len(file_key) != _stream.FILE_KEY:
            raise FormatError(f"{what} has a malformed ssh-rsa stanza (its body is not a "
                              "16-byte file key).")
        return file_key


def _tagged_but_closed(what: str, kind: str) -> RefusedError:
    # age refuses such a file rather than trying the next identity: the stanza names this key.
    return RefusedError(f"{what}'s {kind} stanza names this key (its tag) but does not open "
                        "with it: the file was tampered with, or the key differs from the one "
                        "it was encrypted to.")


def identity(key: Any, where: str) -> Ed25519Identity | RSAIdentity:
    """The age identity of the ``cryptography`` private key ``key``.

    Raises:
        UsageError: a key type age cannot decrypt with (ECDSA, DSA...).
    """
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    if isinstance(key, ed25519.Ed25519PrivateKey):
        return Ed25519Identity(key)
    if isinstance(key, rsa.RSAPrivateKey):
        return RSAIdentity(key)
    raise UsageError(f"{where} holds an SSH private key of a type age cannot decrypt with "
                     f"({type(key).__name__}); use an ed25519 or RSA key, or an age key.")
