"""Principle "errors are typed" on issue #32's native age path: an X25519 stanza whose share is
a low-order point (all zeros, or u = 1) makes OpenSSL refuse the key exchange, and
``cryptography`` raises a bare ``ValueError("Error computing shared key.")``. It escaped
``load_kv_cache(..., decrypt_with=)`` / ``verify --identity`` untyped (the CLI's "internal
error", not exit 1), before the header MAC could refuse the file. Anyone can write such a
header: it needs no key. The check meant for it (``shared == bytes(32)``) never ran."""

from __future__ import annotations

import os

import pytest

from cubepack.errors import CubepackError, FormatError
from cubepack.trust import _age as age
from cubepack.trust import _age_stream as stream

pyrage = pytest.importorskip("pyrage")
pytest.importorskip("cryptography")


@pytest.mark.parametrize("share", [bytes(32), b"\x01" + bytes(31)], ids=["zero", "one"])
def test_a_low_order_share_is_refused_as_a_malformed_header(share):
    identity = pyrage.x25519.Identity.generate()
    # A forged header: one X25519 stanza with a low-order share; MAC and payload are noise
    # (the stanza is read before either).
    header = (stream.VERSION_LINE + b"\n-> X25519 " + stream._b64(share) + b"\n"
              + stream._b64(os.urandom(32)) + b"\n--- " + stream._b64(os.urandom(32)) + b"\n")
    forged = header + os.urandom(16) + os.urandom(40)
    with pytest.raises(CubepackError) as refused:
        age.decrypt(forged, [identity], "forged.kv.safetensors.age")
    assert isinstance(refused.value, FormatError)
    assert "forged.kv.safetensors.age" in str(refused.value)
