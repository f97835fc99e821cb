"""Compatible on purpose: attestations the previous cubepack wrote (predicate version 1, which
restated the lock's labels and lineage as "proved" whatever its signer proved) still verify,
and every statement in them is read as a claim (SECURITY.md's advisory)."""

from __future__ import annotations

import hashlib
import json

import pytest

pytest.importorskip("model_signing", reason="signing needs cubepack[sign]")

import cubepack
from cubepack._util import constants
from cubepack.format import _envelope
from cubepack.format import _lock as lockfile
from cubepack.trust import _attestation

from helpers import make_key, reseal_lock


def sign_as_version_1(cube, key, monkeypatch):
    """What cubepack sign wrote before predicate version 2: a v1 attestation, then the
    signature over the folder (the attestation included)."""
    from cubepack.trust import _signing

    lock_bytes = (cube / constants.LOCK_FILENAME).read_bytes()
    statement = {"_type": _envelope.STATEMENT_TYPE,
                 "subject": [{"name": constants.LOCK_FILENAME,
                              "digest": {"sha256": hashlib.sha256(lock_bytes).hexdigest()}}],
                 "predicateType": _envelope.PREDICATE_TYPE_V1,
                 "predicate": {**_attestation._predicate_v1(lockfile.parse(lock_bytes)),
                               "cubepack_version": "0.1.0"}}
    old = _envelope.envelope_bytes(_attestation.sign_statement(statement, key))
    monkeypatch.setattr(_signing, "attest", lambda *args, **kwargs: old)
    _signing.write_signature(cube, key, _attestation.Proved("sign"))
    monkeypatch.undo()


def test_a_version_1_attestation_verifies_and_states_only_claims(cube, tmp_path, monkeypatch):
    private, public = make_key(tmp_path, "old")
    reseal_lock(cube, lambda lock: [entry.update(provenance={"kind": "recomputed",
                                                             "detail": "old sign"})
                                    for entry in lock["activations"].values()])
    sign_as_version_1(cube, private, monkeypatch)
    envelope = json.loads((cube / constants.ATTESTATION_FILENAME).read_text())
    assert _envelope.parse_envelope(envelope, "x").version == 1
    report = cubepack.verify(cube, trusted_keys=[public])
    [attested] = [c for c in report.checks if c.name == "attestation"]
    assert attested.ok and "version-1 attestation" in attested.detail
    assert {entry["basis"] for entry in report.provenance.values()} == {"claimed"}
    with pytest.raises(cubepack.VerificationFailed, match="claimed"):
        cubepack.verify(cube, trusted_keys=[public], require_provenance="recomputed")
    # A root signed by the old version still satisfies --require-lineage (it names no parent).
    assert cubepack.verify(cube, trusted_keys=[public], require_lineage=True).ok
