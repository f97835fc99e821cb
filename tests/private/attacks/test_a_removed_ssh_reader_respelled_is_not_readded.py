"""Issue #37 item 3: "`rekey` reports any recipient it would re-add". private-cubes.md: "A
rekey that adds back a recipient an earlier generation removed says so (`RE-ADDED`, and
`readded` in `--json`, with the generation that removed them)."

The attack: bob's ssh-rsa key of 3072 bits (a 407-byte wire blob, so its base64 ends in one
``=`` and its last character carries 2 bits that decode to nothing). The owner removes bob
(generation 2). Bob then hands the owner "his key" again with those 2 bits flipped: the same
bytes, the same key, the same age tag, another text. cubepack names a recipient by its text
(the recipient history, the records' fingerprints), so the rekey adding it back (generation 3)
reports no re-added recipient, and bob opens generation 3 with his unchanged private key. The
same text mismatch makes ``rekey --remove`` of the respelled key a "not a recipient" refusal
and lets one key be encrypted to twice (two stanzas, counted as two readers)."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess

import pytest
from private_keys import age_keys, private_copy

import cubepack
from cubepack.ops._encrypt import rekey

from helpers import make_key

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def respelled(public: str) -> str:
    """The same ssh-rsa key, its base64's unused trailing bits flipped."""
    kind, text = public.split()[:2]
    assert text.endswith("=") and not text.endswith("==")
    last = _B64.index(text[-2])
    other = text[:-2] + _B64[last ^ 1] + "="
    assert base64.b64decode(other) == base64.b64decode(text) and other != text
    return f"{kind} {other}"


def test_a_removed_reader_added_back_under_another_spelling_is_reported(packed, tmp_path,
                                                                         monkeypatch):
    pytest.importorskip("pyrage")
    pytest.importorskip("model_signing")
    if not shutil.which("ssh-keygen"):
        pytest.skip("needs ssh-keygen")
    monkeypatch.setenv("CUBEPACK_CACHE", str(tmp_path / "owner-cache"))
    keys = age_keys(tmp_path, "alice")
    bob = tmp_path / "bob_rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "3072", "-N", "", "-f", str(bob)],
                   check=True)
    os.chmod(bob, 0o600)
    bob_public = " ".join(bob.with_suffix(".pub").read_text().split()[:2])
    owner, _ = make_key(tmp_path, "owner")
    cube = private_copy(packed, tmp_path / "cube", [keys["alice"][1], bob_public],
                        sign_key=owner)
    rekey(cube, keys["alice"][0], remove=[bob_public], sign_key=owner)  # generation 2
    result = rekey(cube, keys["alice"][0], add=[respelled(bob_public)], sign_key=owner)
    assert cubepack.verify(cube, decrypt_with=bob).ok  # bob reads generation 3 again
    assert result.readded, (f"generation {result.generation} gives bob, removed at generation 2, "
                            f"every file again; rekey reported added={result.added}, "
                            f"readded={result.readded}")
