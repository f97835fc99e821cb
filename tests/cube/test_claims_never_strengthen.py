"""A claim never gains strength on its way through a later step: the HIGH breaks of the last
attack round, each composed of two steps that were correct alone.

- ``sign`` after a pull (or a merged pull request) must not restate the lock's provenance
  labels as proved: a lock re-sealed to say ``recomputed`` is still a claim once signed.
- ``pack --sign-key`` of a cube whose lock carries a lineage section (a re-pack to sign it)
  must not sign that lineage as derived: an unrelated cube naming a trusted root, or a child
  re-sealed to claim 5,000 re-embedded memories, stays a claim.
- Bookkeeping a download leaves (``.cache/cubepack/``, ``.cache/huggingface/``) is neither
  locked by pack nor covered by the signature, so a signed cube still verifies after pull or
  ``hf download --local-dir``.
"""

from __future__ import annotations

import base64
import json
import shutil

import pytest

pytest.importorskip("model_signing", reason="signing needs cubepack[sign]")

import cubepack
from cubepack._util import canonical, constants
from cubepack._util.hashing import sha256_file

from helpers import copy_of, make_key, reseal_lock

ATT, ANC, LOCK = (constants.ATTESTATION_FILENAME, constants.ANCESTORS_FILENAME,
                  constants.LOCK_FILENAME)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    return {"alice": make_key(folder, "alice")}


def predicate(cube):
    envelope = json.loads((cube / ATT).read_text())
    return json.loads(base64.b64decode(envelope["payload"]))["predicate"]


def relabel(label):
    def change(lock):
        for entry in lock["activations"].values():
            entry["provenance"] = {"kind": label, "detail": "trust me"}
    return change


def test_sign_does_not_restate_a_resealed_label_as_proved(cube, keys):
    """A lock re-sealed to say ``recomputed`` (poisoned caches behind it), signed by an honest
    maintainer after a pull: the label is the pusher's claim, signed or not."""
    reseal_lock(cube, relabel("recomputed"))
    cubepack.sign(cube, keys["alice"][0])
    report = cubepack.verify(cube, trusted_keys=[keys["alice"][1]],
                             require_provenance="recomputed", raise_on_failure=False)
    assert not report.ok
    assert {entry["basis"] for entry in report.provenance.values()} == {"claimed"}
    refused = [c for c in report.failures if c.name == "provenance"]
    assert refused and all("claimed" in c.found for c in refused)
    # What the attestation states: the labels as claims, nothing as proved by the signer.
    stated = predicate(cube)
    assert stated["proved"]["provenance"] == {}
    assert set(stated["claimed"]["provenance"].values()) == {"recomputed"}


def test_sign_does_not_restate_even_a_recorded_label(cube, keys):
    reseal_lock(cube, relabel("recorded"))
    cubepack.sign(cube, keys["alice"][0])
    report = cubepack.verify(cube, trusted_keys=[keys["alice"][1]],
                             require_provenance="recorded", raise_on_failure=False)
    assert not report.ok and [c.name for c in report.failures] == ["provenance"] * len(
        report.provenance)


def root_and_stranger(packed_cube_factory, tmp_path, keys):
    """A root signed by alice (trusted), and an unrelated cube whose lock names that root as
    its parent, with the root's real envelope as its ancestors' file."""
    root = copy_of(packed_cube_factory(), tmp_path / "root")
    cubepack.pack(root, sign_key=keys["alice"][0])
    stranger = copy_of(packed_cube_factory({"item-9": [40, 41, 42]}), tmp_path / "stranger")
    (stranger / "lineage").mkdir()
    (stranger / ANC).write_text(canonical.dumps(
        {"envelopes": [json.loads((root / ATT).read_text())]}))
    root_lock = json.loads((root / LOCK).read_text())

    def adopt(lock):
        lock["files"][ANC] = {"sha256": sha256_file(stranger / ANC),
                              "size": (stranger / ANC).stat().st_size}
        lock["lineage"] = {
            "parent": {"lock_digest": root_lock["digest"],
                       "content_digest": root_lock["content_digest"],
                       "cube_id": root_lock["cube_id"], "repo_id": None, "revision": None},
            "changes": {"models": {}, "retokenized": [], "reembedded": 5000,
                        "adapters_dropped": []},
            "tool": "cubepack migrate", "cubepack_version": cubepack.__version__}
    reseal_lock(stranger, adopt)
    return root, stranger


def test_a_repack_to_sign_does_not_sign_a_carried_lineage(packed_cube_factory, tmp_path, keys):
    _, stranger = root_and_stranger(packed_cube_factory, tmp_path, keys)
    cubepack.pack(stranger, sign_key=keys["alice"][0])  # the maintainer signs what was pushed
    report = cubepack.verify(stranger, trusted_keys=[keys["alice"][1]], require_lineage=True,
                             raise_on_failure=False)
    assert not report.ok
    assert [c for c in report.failures if c.name == "lineage"]
    stated = predicate(stranger)
    assert stated["proved"]["lineage"] is None  # 5,000 re-embedded memories: not the signer's
    assert stated["claimed"]["lineage"]["changes"]["reembedded"] == 5000


def test_sign_does_not_sign_a_carried_lineage_either(packed_cube_factory, tmp_path, keys):
    _, stranger = root_and_stranger(packed_cube_factory, tmp_path, keys)
    cubepack.sign(stranger, keys["alice"][0])
    report = cubepack.verify(stranger, trusted_keys=[keys["alice"][1]], require_lineage=True,
                             raise_on_failure=False)
    assert [c for c in report.failures if c.name == "lineage"]


BOOKKEEPING = {".cache/cubepack/origin.json": b'{"repo_id": "ns/x"}',
               ".cache/huggingface/.gitignore": b"*",
               ".cache/huggingface/download/README.md.metadata": b"abc\n123\n1.0\n"}


def add_bookkeeping(cube):
    for name, data in BOOKKEEPING.items():
        (cube / name).parent.mkdir(parents=True, exist_ok=True)
        (cube / name).write_bytes(data)


def test_a_signed_cube_verifies_beside_download_bookkeeping(cube, keys):
    cubepack.pack(cube, sign_key=keys["alice"][0])
    add_bookkeeping(cube)
    report = cubepack.verify(cube, trusted_keys=[keys["alice"][1]], raise_on_failure=False)
    assert report.ok, report.failures


def test_stock_model_signing_accepts_it_beside_the_bookkeeping_too(cube, keys):
    from model_signing import hashing, verifying

    cubepack.pack(cube, sign_key=keys["alice"][0])
    add_bookkeeping(cube)
    (verifying.Config().use_elliptic_key_verifier(public_key=str(keys["alice"][1]))
     .set_hashing_config(hashing.Config().set_ignored_paths(
         paths=[constants.SIGNATURE_FILENAME])).verify(cube, cube / constants.SIGNATURE_FILENAME))


def test_pack_never_locks_bookkeeping(cube):
    add_bookkeeping(cube)
    cubepack.pack(cube)
    locked = json.loads((cube / LOCK).read_text())["files"]
    assert not [name for name in locked if name.startswith(".cache/")]
    assert cubepack.verify(cube).ok


def test_a_repack_of_a_pulled_folder_does_not_carry_its_origin_record(cube, keys, tmp_path):
    """The puller's origin record is bookkeeping: a re-pack (to sign it, say) leaves it out of
    the lock, so a push of the result cannot ship it."""
    add_bookkeeping(cube)
    cubepack.pack(cube, sign_key=keys["alice"][0])
    target = tmp_path / "copy"
    shutil.copytree(cube, target, ignore=shutil.ignore_patterns(".cache"))
    assert cubepack.verify(target, trusted_keys=[keys["alice"][1]]).ok


def test_strict_models_rests_on_a_fingerprint_here_or_a_trusted_signers(cube, keys):
    """No model at hand: a pin pack fingerprinted and signed satisfies --strict-models; the
    same pin signed by a ``sign`` that fingerprinted nothing does not."""
    with pytest.raises(cubepack.VerificationFailed, match="no model was fingerprinted"):
        cubepack.verify(cube, strict_models=True)
    cubepack.pack(cube, sign_key=keys["alice"][0])
    report = cubepack.verify(cube, strict_models=True, trusted_keys=[keys["alice"][1]])
    [pin] = [c for c in report.checks if c.name == "model identity"]
    assert pin.ok is True and pin.basis == "signed" and "fingerprint the signer" in pin.detail
    cubepack.sign(cube, keys["alice"][0])  # proves nothing of the pin: signs it as a claim
    with pytest.raises(cubepack.VerificationFailed, match="no model was fingerprinted"):
        cubepack.verify(cube, strict_models=True, trusted_keys=[keys["alice"][1]])


def test_sign_with_the_model_states_the_pin_and_header_labels_as_proved(cube, keys, zoo):
    """The fixture's labels are ``asserted`` (a MemOS pickle recording no producer): the
    packer's word, which no later signer can prove. A ``recorded`` label (the header names
    the producer) is what ``sign --model`` establishes itself."""
    cubepack.sign(cube, keys["alice"][0], model=str(zoo["a"]))
    stated = predicate(cube)
    assert set(stated["proved"]["producers"]) == {"act_mem"}
    assert set(stated["claimed"]["provenance"].values()) == {"asserted"}
    reseal_lock(cube, relabel("recorded"))
    cubepack.sign(cube, keys["alice"][0], model=str(zoo["a"]))
    stated = predicate(cube)
    assert set(stated["proved"]["provenance"].values()) == {"recorded"}
    assert stated["claimed"]["producers"] == {} and stated["claimed"]["provenance"] == {}
    report = cubepack.verify(cube, trusted_keys=[keys["alice"][1]],
                             require_provenance="recorded")
    assert {entry["basis"] for entry in report.provenance.values()} == {"signed"}
