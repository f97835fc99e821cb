"""A new user following docs/how-to/private-cubes.md: "`curl https://github.com/bob.keys >
bob.keys` # ssh-ed25519 / ssh-rsa lines work as recipients", and "a GitHub user's keys file is a
recipient list"; ``parse_recipients``: "SSH key types age cannot encrypt to, e.g. ecdsa in a
GitHub keys file, are refused by name".

The attack: bob's GitHub keys file holds his ssh-ed25519 key and an ecdsa-sha2-nistp256 key
(GitHub lists every key of a user). ``age -R bob.keys`` encrypts to his ed25519 key and warns
"ignoring unsupported SSH key of type "ecdsa-sha2-nistp256" at line 2". cubepack refuses the
whole file, without naming the key type, saying the line "is not an age recipient: expected
... or a file of them, one a line (e.g. https://github.com/USER.keys saved to a file)": the
thing the user did is the fix it suggests."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from cubepack.errors import CubepackError


def test_a_github_keys_file_is_a_recipient_list_as_age_reads_it(tmp_path):
    pytest.importorskip("cryptography")
    if not shutil.which("ssh-keygen"):
        pytest.skip("needs ssh-keygen")
    from cubepack.trust import _age as age

    lines = []
    for kind in ("ed25519", "ecdsa"):
        key = tmp_path / f"id_{kind}"
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(key)], check=True)
        lines.append(" ".join(key.with_suffix(".pub").read_text().split()[:2]))
    keys_file = tmp_path / "bob.keys"
    keys_file.write_text("\n".join(lines) + "\n")
    if shutil.which("age"):  # the second opinion: age takes the file, skipping the ecdsa key
        done = subprocess.run(["age", "-R", str(keys_file), "-o", str(tmp_path / "x.age")],
                              input=b"memory", capture_output=True, check=False)
        assert done.returncode == 0, done.stderr
    try:
        recipients = age.parse_recipients([str(keys_file)])
    except CubepackError as exc:
        message = str(exc)
        assert "ecdsa" in message, f"the refusal does not name the key type: {message}"
        pytest.fail(f"a GitHub keys file age reads is refused: {message}")
    assert [r.text for r in recipients] == [lines[0]]
