"""The native age path (X25519 + STREAM on ``cryptography``) against pyrage and the age CLI:
same plaintext both ways at every chunk boundary, and every tampering refused."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from cubepack.errors import FormatError, RefusedError
from cubepack.trust import _age as age
from cubepack.trust import _age_stream as stream

pyrage = pytest.importorskip("pyrage")
pytest.importorskip("cryptography")

SIZES = [0, 1, stream.CHUNK - 1, stream.CHUNK, stream.CHUNK + 1, 2 * stream.CHUNK, 200_001]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    identity = pyrage.x25519.Identity.generate()
    path = tmp_path_factory.mktemp("key") / "key.txt"
    path.write_text(f"{identity}\n")
    os.chmod(path, 0o600)
    return identity, age.parse_recipients([str(identity.to_public())]), path


@pytest.mark.parametrize("size", SIZES)
def test_native_and_pyrage_read_each_other(pair, size):
    identity, recipients, _ = pair
    data = os.urandom(size)
    ours = age.encrypt(data, recipients)
    assert pyrage.decrypt(ours, [identity]) == data
    assert age.decrypt(pyrage.encrypt(data, [identity.to_public()]), [identity], "f") == data


@pytest.mark.skipif(shutil.which("age") is None, reason="needs Debian's age CLI")
@pytest.mark.parametrize("size", [0, stream.CHUNK, 200_001])
def test_the_age_cli_reads_the_native_output(pair, tmp_path, size):
    identity, recipients, key = pair
    data = os.urandom(size)
    (tmp_path / "f.age").write_bytes(age.encrypt(data, recipients))
    done = subprocess.run(["age", "-d", "-i", str(key), str(tmp_path / "f.age")],
                          capture_output=True, check=True)
    assert done.stdout == data


def test_every_tampering_is_refused(pair):
    identity, recipients, _ = pair
    good = age.encrypt(os.urandom(3 * stream.CHUNK + 5), recipients)
    header_end = good.index(b"\n--- ") + 1
    mac_line_end = good.index(b"\n", header_end) + 1
    cases = {
        "header byte": good[:30] + bytes([good[30] ^ 1]) + good[31:],
        "MAC": good[:header_end + 6] + bytes([good[header_end + 6] ^ 1]) + good[header_end + 7:],
        "nonce": good[:mac_line_end] + bytes([good[mac_line_end] ^ 1]) + good[mac_line_end + 1:],
        "payload": good[:-100] + bytes([good[-100] ^ 1]) + good[-99:],
        "truncated to a chunk boundary": good[:mac_line_end + 16 + 3 * (stream.CHUNK + 16)],
        "truncated": good[:-3],
        "chunk dropped": good[:mac_line_end + 16] + good[mac_line_end + 16 + stream.CHUNK + 16:],
    }
    for name, bad in cases.items():
        with pytest.raises((RefusedError, FormatError)):
            age.decrypt(bad, [identity], name)
        with pytest.raises(Exception):  # noqa: B017 - pyrage agrees it is not age's
            pyrage.decrypt(bad, [identity])


def test_a_stranger_is_named_not_a_recipient(pair):
    _, recipients, _ = pair
    with pytest.raises(RefusedError, match="not encrypted to the identity given"):
        age.decrypt(age.encrypt(b"x", recipients), [pyrage.x25519.Identity.generate()], "f")
