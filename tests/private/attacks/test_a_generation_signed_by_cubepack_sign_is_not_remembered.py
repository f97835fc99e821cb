"""Issue #37 item 3. private-cubes.md: "`verify`, `pull`, `encrypt` and `rekey` record every
generation they verified under a trusted key (or signed) in `$CUBEPACK_CACHE/generations/`
... `rekey` of an older revision than one you have seen is refused before it writes
anything, naming the recipients it would re-add"; SECURITY.md: "a writer who rewrites or
squashes the branch's history removes what the walk would find ... only a client that had seen
the newer generation catches the replay". And "a suggested fix works".

The chain, on the owner's machine (no endpoint needed: a squash leaves only these records):
``rekey --remove bob`` without ``--sign-key`` (generation 2, unsigned); the command ends
"unsigned: ... sign it: --sign-key". Followed literally (a rekey that changes nothing but
``--rotate``, now with ``--sign-key``) it is refused (the cube is unsigned, so it cannot be
re-signed), and that refusal sends the owner to ``cubepack sign``. ``cubepack sign`` signs
generation 2 and records nothing. Then the owner's ``rekey --add carol --sign-key`` of
generation 1 (bob's copy, pushed back after a squash) is accepted, and gives bob, removed at
generation 2, every file of the next generation, signed by the owner."""

from __future__ import annotations

import os
import shutil

import pytest
from private_keys import age_keys, private_copy

from cubepack.errors import RefusedError
from cubepack.ops._encrypt import rekey

from helpers import cli_in_process, make_key


def test_the_owner_signing_generation_2_with_cubepack_sign_refuses_a_rekey_of_1(packed, tmp_path,
                                                                               monkeypatch):
    pytest.importorskip("pyrage")
    pytest.importorskip("model_signing")
    cache = tmp_path / "owner-cache"
    monkeypatch.setenv("CUBEPACK_CACHE", str(cache))
    keys = age_keys(tmp_path, "alice", "bob", "carol")
    owner, owner_pub = make_key(tmp_path, "owner")
    cube = private_copy(packed, tmp_path / "cube", [keys["alice"][1], keys["bob"][1]],
                        sign_key=owner)
    bobs = tmp_path / "bobs-copy"  # generation 1, signed by the owner
    shutil.copytree(cube, bobs)
    env = {**{k: v for k, v in os.environ.items() if k != "CUBEPACK_IDENTITY"},
           "CUBEPACK_CACHE": str(cache)}
    done = cli_in_process(["rekey", str(cube), "--identity", str(keys["alice"][0]),
                           "--remove", keys["bob"][1], "--trusted-key", str(owner_pub)],
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # The advice, literally: cubepack sign, which records the generation it signs.
    assert "sign it: cubepack sign CUBE --key SIGNING_KEY" in done.stdout, done.stdout
    signed = cli_in_process(["sign", str(cube), "--key", str(owner)], env=env, cwd=tmp_path)
    assert signed.returncode == 0, signed.stderr
    advice_failed = False
    try:
        rekey(bobs, keys["alice"][0], add=[keys["carol"][1]], sign_key=owner)
    except RefusedError:
        assert not advice_failed, "the rekey's advice 'sign it: --sign-key' was refused"
        return
    pytest.fail("the owner signed generation 2 (bob removed), yet a rekey of generation 1 "
                "re-encrypted every file to bob again and signed it: cubepack sign recorded "
                "nothing"
                + ("; and the rekey's own advice, --sign-key, was refused" if advice_failed
                   else ""))
