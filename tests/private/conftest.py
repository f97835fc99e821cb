"""Keys for private cubes: age X25519 identities (pyrage, as age-keygen writes them) and an
OpenSSH ed25519 key (ssh-keygen, when present), each identity file mode 0600."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


@pytest.fixture(scope="session")
def agekeys(tmp_path_factory):
    """name -> (identity file, recipient): alice, bob, mallory (age), and ``ssh`` (ed25519)."""
    pyrage = pytest.importorskip("pyrage", reason="private cubes need cubepack[private]")
    x25519 = pyrage.x25519

    folder = tmp_path_factory.mktemp("agekeys")
    keys = {}
    for name in ("alice", "bob", "mallory"):
        identity = x25519.Identity.generate()
        path = folder / f"{name}.key"
        path.write_text(f"# created: by the test\n# public key: {identity.to_public()}\n"
                        f"{identity}\n")
        os.chmod(path, 0o600)
        keys[name] = (path, str(identity.to_public()))
    if shutil.which("ssh-keygen"):
        path = folder / "ssh_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "carol@example",
                        "-f", str(path)], check=True)
        keys["ssh"] = (path, path.with_suffix(".pub").read_text().strip())
    return keys
