"""Promise 1: "Interop is the test: ... cubepack reads what ``age`` encrypted to the same
recipients." ``age --armor`` (``-a``, the spec's ASCII armor: PEM-like
``-----BEGIN AGE ENCRYPTED FILE-----``) is what age encrypts to when the output must be text;
``age -d`` reads it back, cubepack refuses it as "not an age file" (which it is). Found at
the brief's chunk edges (0 bytes, 64 KiB); every size fails the same way."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from private_keys import age_keys

from cubepack.trust import _age as age
from cubepack.trust import _age_stream as stream


@pytest.mark.skipif(shutil.which("age") is None, reason="needs Debian's age CLI")
@pytest.mark.parametrize("size", [0, stream.CHUNK])
def test_cubepack_reads_what_age_armor_wrote(tmp_path, size):
    pytest.importorskip("pyrage")
    keys = age_keys(tmp_path, "alice")
    plain = tmp_path / "plain"
    plain.write_bytes(bytes(range(256)) * (size // 256))
    armored = subprocess.run(["age", "-e", "-a", "-r", keys["alice"][1], str(plain)],
                             capture_output=True, check=True).stdout
    assert armored.startswith(b"-----BEGIN AGE ENCRYPTED FILE-----")
    opened = age.decrypt(armored, age.load_identities(keys["alice"][0]), "armored.age")
    assert bytes(opened) == plain.read_bytes()
