"""Issue #37 item 2 (passphrase-protected SSH keys) and principle 1 ("say what differed ... and
the suggested fix works"). private-cubes.md: the passphrase of a protected key comes from
`unlock_identity(path, passphrase)`, `CUBEPACK_IDENTITY_PASSPHRASE`, or a prompt; "A wrong
passphrase is refused as such".

The attack: a CI script exports the variable from a secret that is missing
(``CUBEPACK_IDENTITY_PASSPHRASE="${SECRET:-}"``), or a program calls ``unlock_identity`` with
an empty string. The refusal says the passphrase-protected key "is not passphrase-protected:
use it as it is" (the library's TypeError for an empty password on an encrypted key, read as
"not encrypted"): false, and its fix (use the key as it is, no passphrase) is refused in turn
(no terminal). It is a wrong, here empty, passphrase."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from cubepack.errors import CubepackError


@pytest.fixture
def protected(tmp_path):
    if not shutil.which("ssh-keygen"):
        pytest.skip("needs ssh-keygen")
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "pw one", "-f", str(key)],
                   check=True)
    return key


def test_an_empty_passphrase_variable_is_a_wrong_passphrase(protected, monkeypatch):
    pytest.importorskip("bcrypt")
    from cubepack.trust import _age as age

    monkeypatch.setenv("CUBEPACK_IDENTITY_PASSPHRASE", "")
    with pytest.raises(CubepackError) as refused:
        age.load_identities(protected)
    assert "not passphrase-protected" not in str(refused.value), str(refused.value)


def test_unlock_identity_with_an_empty_passphrase_is_a_wrong_passphrase(protected):
    pytest.importorskip("bcrypt")
    from cubepack.trust import unlock_identity

    with pytest.raises(CubepackError) as refused:
        unlock_identity(protected, "")
    assert "not passphrase-protected" not in str(refused.value), str(refused.value)
