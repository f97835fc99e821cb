"""Issue #37 items 1 and 3: "the recipients of a re-encryption come only from a trusted place
(a manifest signed by a trusted key, or recipients the user names)", and "rekey reports any
recipient it would re-add".

Mallory, who can push, replaces alice's unsigned private cube with her own encryption to
alice's public key and her own. Alice adds bob as the docs show (``rekey --add``): the cube is
re-encrypted to alice, bob and mallory, who then reads everything alice keeps in it. And a
reader removed from a signed cube, then added back, is re-added without a word."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from private_keys import age_keys, private_copy

from cubepack.errors import CubepackError
from cubepack.ops._encrypt import rekey

from helpers import cli_in_process, make_key


def test_rekey_does_not_keep_the_recipients_an_unsigned_cube_names(packed, tmp_path):
    pytest.importorskip("pyrage")
    keys = age_keys(tmp_path, "alice", "bob", "mallory")
    cube = private_copy(packed, tmp_path / "cube", [keys["alice"][1]])
    planted = private_copy(packed, tmp_path / "planted", [keys["alice"][1],
                                                           keys["mallory"][1]])
    shutil.rmtree(cube)
    shutil.copytree(planted, cube)  # mallory's push: nothing tells it from alice's cube
    with pytest.raises(CubepackError) as refused:
        rekey(cube, keys["alice"][0], add=[keys["bob"][1]])
    assert "--to" in str(refused.value) and "--trusted-key" in str(refused.value)
    assert keys["mallory"][1] in str(refused.value)  # the fix lists who it would keep
    # The fix, as printed: name every recipient.
    result = rekey(cube, keys["alice"][0], to=[keys["alice"][1], keys["bob"][1]])
    assert result.recipients == sorted([keys["alice"][1], keys["bob"][1]])
    assert result.removed == [keys["mallory"][1]]


def test_rekey_reports_a_reader_it_re_adds(packed, tmp_path, monkeypatch):
    pytest.importorskip("pyrage")
    pytest.importorskip("model_signing")
    monkeypatch.setenv("CUBEPACK_CACHE", str(tmp_path / "cache"))
    keys = age_keys(tmp_path, "alice", "bob")
    owner, _ = make_key(tmp_path, "owner")
    cube = private_copy(packed, tmp_path / "cube", [keys["alice"][1], keys["bob"][1]],
                        sign_key=owner)
    rekey(cube, keys["alice"][0], remove=[keys["bob"][1]], sign_key=owner)
    env = {k: v for k, v in os.environ.items() if k != "CUBEPACK_IDENTITY"}
    done = cli_in_process(["rekey", cube, "--identity", keys["alice"][0], "--add",
                           keys["bob"][1], "--sign-key", owner, "--json"], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert [entry["recipient"] for entry in data["readded"]] == [keys["bob"][1]], data
    assert data["readded"][0]["removed_at"] == 2
    text = cli_in_process(["rekey", cube, "--identity", keys["alice"][0], "--rotate",
                           "--sign-key", owner], env=env, cwd=tmp_path)
    assert text.returncode == 0 and "re-add" not in text.stdout, text.stdout
