"""Promise 2 and SECURITY.md's "What stays public" ("the number of ... recipients"): a
private cube encrypted to SSH keys (the docs' own example: a GitHub user's keys file) names
its readers in clear. age's ssh-ed25519 and ssh-rsa stanzas carry a key tag, the first 4
bytes of SHA-256 of the recipient's public key, so anyone holding the public bytes and a list
of candidate keys (every GitHub user's ``.keys`` is public) confirms who can read the cube,
and who cannot. That is by age's design and cannot be encrypted away; it is not among what
the docs say stays public, so a user choosing SSH keys for a confidential cube is not told
that its recipient list is public. (age X25519 recipients are not identifiable this way.)"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import subprocess

import pytest
from places import ROOT
from private_keys import private_copy


def key_tag(public_line: str) -> bytes:
    """age's tag of an SSH public key: base64 (no padding) of SHA-256(wire key)[:4]."""
    wire = base64.b64decode(public_line.split()[1])
    return base64.b64encode(hashlib.sha256(wire).digest()[:4]).rstrip(b"=")


def what_stays_public(text: str) -> str:
    return re.search(r"\*\*What stays public\*\*(.*?)\n\n", text, re.S).group(1)


def test_who_reads_a_cube_encrypted_to_ssh_keys_is_public_and_not_said(packed, tmp_path):
    pytest.importorskip("pyrage")
    if shutil.which("ssh-keygen") is None:
        pytest.skip("needs ssh-keygen")
    lines = {}
    for name in ("bob", "carol"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "",
                        "-f", str(tmp_path / name)], check=True)
        lines[name] = (tmp_path / f"{name}.pub").read_text().strip()
    cube = private_copy(packed, tmp_path / "cube", [lines["bob"]])
    public = b"".join(p.read_bytes() for p in sorted(cube.rglob("*")) if p.is_file())
    # From public bytes and public keys alone: bob reads this cube, carol does not.
    assert b"-> ssh-ed25519 " + key_tag(lines["bob"]) + b" " in public
    assert key_tag(lines["carol"]) not in public
    said = what_stays_public((ROOT / "SECURITY.md").read_text())
    assert "ssh" in said.lower(), ("SECURITY.md's 'What stays public' does not say that SSH "
                                   "recipients are identifiable from the cube's public bytes")
