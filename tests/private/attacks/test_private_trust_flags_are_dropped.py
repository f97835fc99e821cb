"""Issue #37 item 3: "``verify --remote --identity`` decrypts or refuses the flag; ``encrypt``
and ``rekey`` given ``--trusted-key`` honour it through the one policy or refuse it". Today
``verify --remote`` drops the identity (the contents are reported unchecked, exit 0), and
``encrypt --trusted-key T`` / ``rekey --trusted-key T`` without ``--sign-key`` drop T: a cube
unsigned, or signed by another key, is encrypted or rekeyed as if T had been honoured."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from private_keys import age_keys, private_copy

import cubepack
from cubepack import TrustPolicy
from cubepack.errors import CubepackError, UsageError
from cubepack.ops._encrypt import encrypt, rekey

from helpers import cli_in_process, make_key


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CUBEPACK_IDENTITY"}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing serves there: no request may be needed
    env["CUBEPACK_CACHE"] = str(tmp_path / "cache")
    return env


def test_verify_remote_decrypts_with_the_identity_given(packed, tmp_path):
    pytest.importorskip("pyrage")
    keys = age_keys(tmp_path, "alice", "mallory")
    cube = private_copy(packed, tmp_path / "cube", [keys["alice"][1]])
    done = cli_in_process(["verify", cube, "--remote", "--identity", keys["alice"][0], "--json"],
                          env=_env(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    checks = json.loads(done.stdout)["checks"]
    assert [(c["ok"], c["scope"]) for c in checks if c["check"] == "private"] == \
        [(True, "decrypted")], checks
    assert any(c["check"] == "kv header" and c["ok"] for c in checks)
    done = cli_in_process(["verify", cube, "--remote", "--identity", keys["mallory"][0],
                           "--json"], env=_env(tmp_path), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr


def _clear_copy(packed, tmp_path, name):
    cube = tmp_path / name
    shutil.copytree(packed, cube)
    return cube


def test_encrypt_honours_the_trusted_key(packed, tmp_path):
    pytest.importorskip("pyrage")
    pytest.importorskip("model_signing")
    keys = age_keys(tmp_path, "alice")
    signer, signer_pub = make_key(tmp_path, "signer")
    other, _ = make_key(tmp_path, "other")
    unsigned = _clear_copy(packed, tmp_path, "unsigned")
    done = cli_in_process(["encrypt", unsigned, "--to", keys["alice"][1], "--trusted-key",
                           signer_pub], env=_env(tmp_path), cwd=tmp_path)
    assert done.returncode == 1, ("encrypt --trusted-key encrypted an unsigned cube",
                                  done.stdout + done.stderr)
    assert not (unsigned / "cubepack.manifest.age").exists()
    by_other = _clear_copy(packed, tmp_path, "by-other")
    cubepack.sign(by_other, other)
    with pytest.raises(CubepackError):
        encrypt(by_other, [keys["alice"][1]], trusted_keys=[signer_pub])
    by_signer = _clear_copy(packed, tmp_path, "by-signer")
    cubepack.sign(by_signer, signer)
    encrypt(by_signer, [keys["alice"][1]], trusted_keys=[signer_pub])
    with pytest.raises(UsageError, match="recompute"):  # a field it cannot apply: refused
        encrypt(_clear_copy(packed, tmp_path, "asked"), [keys["alice"][1]],
                policy=TrustPolicy(recompute=True))


def test_rekey_honours_the_trusted_key(packed, tmp_path):
    pytest.importorskip("pyrage")
    pytest.importorskip("model_signing")
    keys = age_keys(tmp_path, "alice", "bob")
    signer, signer_pub = make_key(tmp_path, "signer")
    other, _ = make_key(tmp_path, "other")
    by_other = private_copy(packed, tmp_path / "by-other", [keys["alice"][1]], sign_key=other)
    done = cli_in_process(["rekey", by_other, "--identity", keys["alice"][0], "--add",
                           keys["bob"][1], "--trusted-key", signer_pub], env=_env(tmp_path),
                          cwd=tmp_path)
    assert done.returncode == 1, ("rekey --trusted-key rekeyed a cube another key signed",
                                  done.stdout + done.stderr)
    by_signer = private_copy(packed, tmp_path / "by-signer", [keys["alice"][1]],
                             sign_key=signer)
    result = rekey(by_signer, keys["alice"][0], add=[keys["bob"][1]], trusted_keys=[signer_pub])
    assert keys["bob"][1] in result.recipients
    with pytest.raises(UsageError, match="model"):
        rekey(by_signer, keys["alice"][0], rotate=True, policy=TrustPolicy(model="x"))
