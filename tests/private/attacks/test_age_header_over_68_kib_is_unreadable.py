"""Promise 1 of issue #32 (interop with the age CLI both ways): the native reader looked for
the end of the age header only in a file's first 68 KiB, and refused anything longer as "has
no complete age header". A header grows ~98 bytes a recipient: a cube encrypted to ~700
X25519 recipients (an organisation's keys file) was written by cubepack itself, and by
``age -R``, but cubepack could not read it back (pyrage and the age CLI could)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from cubepack.trust import _age as age

from envs import once

# cubepack's own age reader and writer against pyrage and the age CLI: no Hub client,
# transformers or MemOS code path, the same in both environments (pyrage's decrypt of the
# 801-stanza header alone takes 12-16 s here).
pytestmark = once

pyrage = pytest.importorskip("pyrage")
pytest.importorskip("cryptography")

MANY = 800  # ~78 KiB of stanzas


def _crowd(me):
    return [str(pyrage.x25519.Identity.generate().to_public()) for _ in range(MANY)] + [me]


def test_cubepack_reads_what_it_wrote_to_many_recipients():
    me = pyrage.x25519.Identity.generate()
    recipients = age.parse_recipients(_crowd(str(me.to_public())))
    data = os.urandom(100_000)
    encrypted = age.encrypt(data, recipients)
    assert encrypted.index(b"\n--- ") > 68 * 1024
    assert pyrage.decrypt(bytes(encrypted), [me]) == data  # a valid age file
    assert bytes(age.decrypt(encrypted, [me], "many.age")) == data


@pytest.mark.skipif(shutil.which("age") is None, reason="needs Debian's age CLI")
def test_cubepack_reads_what_the_age_cli_wrote_to_many_recipients(tmp_path):
    me = pyrage.x25519.Identity.generate()
    (tmp_path / "recipients.txt").write_text("\n".join(_crowd(str(me.to_public()))) + "\n")
    data = os.urandom(100_000)
    (tmp_path / "plain").write_bytes(data)
    subprocess.run(["age", "-R", str(tmp_path / "recipients.txt"), "-o",
                    str(tmp_path / "many.age"), str(tmp_path / "plain")], check=True)
    assert bytes(age.decrypt((tmp_path / "many.age").read_bytes(), [me], "many.age")) == data
