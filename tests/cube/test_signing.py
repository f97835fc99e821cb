"""Signed cubes: who packed it, checked with trusted keys, interoperable with model_signing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("model_signing", reason="signing needs cubepack[sign]")

import cubepack
from cubepack import SignatureError, VerificationFailed
from cubepack._util import constants, hashing
from cubepack.hub import pull, push
from cubepack.testing.hub import InstrumentedHub
from cubepack.trust._attestation import Proved
from cubepack.format import _lock as lockfile
from cubepack.trust._signing import verify_signature
from cubepack.trust._signing import write_signature as _write_signature

from helpers import build_cache, make_key, reseal_lock, tree_bytes


def write_signature(cube, key):
    """Sign ``cube`` as the step that made it would: pack (a root) or migrate (a cube whose
    lock names a parent), every pin and label stated as its own."""
    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    derived = lock.lineage is not None
    _write_signature(cube, key, Proved.everything_of(lock, "migrate" if derived else "pack",
                                                     lineage=derived))


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    return {"alice": make_key(folder, "alice"), "bob": make_key(folder, "bob", "p384"),
            "ed": make_key(folder, "ed", "ed25519")}


def signature_check(report):
    [check] = [c for c in report.checks if c.name == "signature"]
    return check


def test_signed_cube_verifies_with_a_trusted_key_and_with_stock_model_signing(cube, keys):
    write_signature(cube, keys["alice"][0])
    report = cubepack.verify(cube, trusted_keys=[keys["bob"][1], keys["alice"][1]])
    assert signature_check(report).ok is True
    stock = Path(sys.executable).with_name("model_signing")
    done = subprocess.run([str(stock), "verify", "key", str(cube), "--signature",
                           str(cube / constants.SIGNATURE_FILENAME), "--public_key",
                           str(keys["alice"][1])], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_p384_keys_work_too(cube, keys):
    write_signature(cube, keys["bob"][0])
    assert verify_signature(cube, [keys["bob"][1]]) == str(keys["bob"][1])


def test_unsigned_cube_is_refused_when_a_signature_is_required(cube, keys):
    with pytest.raises(VerificationFailed) as caught:
        cubepack.verify(cube, require_signature=True)
    assert "unsigned" in caught.value.failures[0].detail
    with pytest.raises(VerificationFailed):
        cubepack.verify(cube, trusted_keys=[keys["alice"][1]])
    assert signature_check(cubepack.verify(cube)).ok is None  # not asked: reported as skipped


def test_a_signature_by_an_untrusted_key_is_refused(cube, keys):
    write_signature(cube, keys["bob"][0])
    with pytest.raises(SignatureError, match="signed by a key that is not trusted"):
        verify_signature(cube, [keys["alice"][1]])


def test_content_changed_after_signing_is_refused_even_with_a_resealed_lock(cube, keys, models):
    write_signature(cube, keys["alice"][0])
    item = cube / "activations" / "item-1.kv.safetensors"
    other = build_cache(models["a"], torch.tensor([[9, 9, 9, 9, 9, 9]]))  # same length
    cubepack.save_kv_cache(other, item, producer=models["a"], metadata={"id": "item-1"})
    digest, size = hashing.sha256_file(item), item.stat().st_size

    def reseal(lock):
        lock["files"]["activations/item-1.kv.safetensors"] = {"sha256": digest, "size": size}
        lock["activations"]["item-1"]["sha256"] = digest
    reseal_lock(cube, reseal)
    report = cubepack.verify(cube, trusted_keys=[keys["alice"][1]], raise_on_failure=False)
    failures = report.failures
    # the attestation: its subject is another lock, then each memory or file that differs
    assert [f.name for f in failures][:2] == ["signature", "attestation"]
    assert {f.name for f in failures[2:]} <= {"attestation"}
    assert "does not cover this content" in failures[0].detail
    assert re.search(r"(cubepack\.lock|item-1\.kv\.safetensors) differ", failures[0].detail)
    assert "its subject is another lock" in failures[1].detail  # it attests the signed lock


def test_ed25519_keys_are_refused_clearly(cube, keys):
    with pytest.raises(cubepack.CubepackError, match="ECDSA P-256 or P-384"):
        write_signature(cube, keys["ed"][0])
    assert not (cube / constants.SIGNATURE_FILENAME).exists()


def test_a_broken_cube_is_not_signed(cube, keys, capsys):
    from cubepack.cli import main

    (cube / "config.json").write_text("{}")
    assert main(["sign", str(cube), "--key", str(keys["alice"][0])]) == 1
    assert "failed verification" in capsys.readouterr().err
    assert not (cube / constants.SIGNATURE_FILENAME).exists()


def test_sign_signs_what_the_lock_records_not_changed_bytes(cube, keys):
    """sign() trusts its caller to have verified; even so it can only bless locked content."""
    (cube / "config.json").write_text("{}")  # changed after packing, lock untouched
    write_signature(cube, keys["alice"][0])
    with pytest.raises(SignatureError, match="config.json differs"):
        verify_signature(cube, [keys["alice"][1]])


def test_signing_reads_no_file_again(cube, keys, monkeypatch):
    """The manifest is built from the lock's digests: neither cubepack nor model_signing
    hashes a cube file while signing (pack --sign-key hashes each file once, in pack)."""
    from model_signing._hashing import io as ms_io

    from cubepack._util import hashing

    hashed = []
    monkeypatch.setattr(hashing, "sha256_file", lambda *a, **k: hashed.append(a))
    monkeypatch.setattr(ms_io.SimpleFileHasher, "compute", lambda self: hashed.append(self))
    write_signature(cube, keys["alice"][0])
    monkeypatch.undo()
    assert hashed == []
    assert verify_signature(cube, [keys["alice"][1]]) == str(keys["alice"][1])


def test_pack_sign_key_then_pull_with_trusted_keys(cube, keys, tmp_path):
    cubepack.pack(cube, sign_key=keys["alice"][0])
    assert (cube / constants.SIGNATURE_FILENAME).is_file()
    assert cubepack.pack(cube).changed is False and (cube / constants.SIGNATURE_FILENAME).is_file()
    with InstrumentedHub(tmp_path / "hub") as hub:
        pushed = push(cube, "ns/signed", endpoint=hub.url, allow_local_paths=True)
        spec = f"ns/signed@{pushed.commit_sha}"
        result = pull(spec, endpoint=hub.url, local_dir=tmp_path / "ok", cache_dir=tmp_path / "c",
                      trusted_keys=[keys["alice"][1]])
        assert signature_check(result.report).ok is True
        target = tmp_path / "refused"
        target.mkdir()
        with pytest.raises(VerificationFailed, match="not trusted"):
            pull(spec, endpoint=hub.url, local_dir=target, cache_dir=tmp_path / "c",
                 trusted_keys=[keys["bob"][1]])
        assert tree_bytes(target) == {}


def test_cli_sign_and_verify_with_trusted_key(cube, keys, capsys):
    from cubepack.cli import main

    assert main(["sign", str(cube), "--key", str(keys["alice"][0])]) == 0
    capsys.readouterr()
    assert main(["verify", str(cube), "--trusted-key", str(keys["alice"][1])]) == 0
    assert main(["verify", str(cube), "--trusted-key", str(keys["bob"][1])]) == 1
    assert "FAIL signature" in capsys.readouterr().out


def test_content_errors_name_files_even_in_escaped_quotes_and_never_echo_digest_bytes():
    from cubepack.trust._signing import _describe_content_error

    # model_signing's message is a list repr; a digest containing a quote makes Python escape
    # the quotes around the file name (this made the content test flaky before).
    message = ("Signature mismatch: ['Hash mismatch for \\'activations/item-1.kv.safetensors\\': "
               "Expected b\"\\x10\\xbd'a\"', \"Hash mismatch for 'cubepack.lock': Expected b'x'\"]")
    assert _describe_content_error(message) == \
        "activations/item-1.kv.safetensors, cubepack.lock differ"
    assert "\\x" not in _describe_content_error("Signature mismatch: b'\\x10\\xbd'")
