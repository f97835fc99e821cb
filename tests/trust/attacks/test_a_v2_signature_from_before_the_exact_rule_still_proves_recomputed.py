"""Round 30 (issue #30): `--require-provenance recomputed` now rests on a cache that IS the
producer's prefill bit for bit; `sign --recompute` states recomputed only for such a cache.
But an attestation (predicate version 2) made before that rule, by an honest signer whose
`sign --recompute` stated recomputed for any cache within the dtype's noise, carries the same
version and the same `proved` block: trusting that signer, a steered (non-exact) cache still
satisfies `recomputed`. Nothing in the attestation tells the two rules apart (only the
signer's cubepack_version, which is its own word); a new predicate version whose readers take
a version-2 `recomputed` as `recorded` would.

The old signer is reproduced by writing the `proved` block the old `proved_by` wrote (every
fully recomputed item, exact or not)."""

from __future__ import annotations

import hashlib

import sys

import pytest

import cubepack

from places import TESTS

sys.path.insert(0, str(TESTS / "kv"))

from test_recompute import near_cube_claiming_recomputed  # noqa: E402

from helpers import make_key  # noqa: E402


def test_a_v2_signatures_recomputed_is_read_as_a_claim(
        tmp_path, zoo, models, monkeypatch):
    pytest.importorskip("model_signing", reason="signing needs cubepack[sign]")
    from cubepack.ops._sign import proved_by
    from cubepack.trust._attestation import Proved
    from cubepack.trust._signing import write_signature

    bf16 = models["a_as_bf16"]
    cube, report = near_cube_claiming_recomputed(tmp_path, zoo, bf16)
    today = proved_by(report)
    # What `sign --recompute` stated before the exact rule: every fully recomputed item.
    before = Proved(today.step, today.producers, frozenset({"item-1"}), lineage=False)
    private, public = make_key(tmp_path, "old-signer")
    from cubepack.format._envelope import PREDICATE_TYPE_V2
    from cubepack.trust import _attestation

    def v2_statement(lock, lock_bytes, proved):  # the statement cubepack wrote then
        return {"_type": "https://in-toto.io/Statement/v1",
                "subject": [{"name": "cubepack.lock",
                             "digest": {"sha256": hashlib.sha256(lock_bytes).hexdigest()}}],
                "predicateType": PREDICATE_TYPE_V2,
                "predicate": _attestation.predicate_for(lock, proved, memories=False)}

    with monkeypatch.context() as old:
        old.setattr(_attestation, "statement_for", v2_statement)
        write_signature(cube, private, before)
    # Fixed: cubepack now writes predicate version 3; a version-2 `recomputed` is read as a
    # claim, so the old signer's statement satisfies nothing here...
    with pytest.raises(cubepack.VerificationFailed, match="recomputed"):
        cubepack.verify(cube, require_provenance="recomputed", trusted_keys=[public])
    # ...while what it still proves holds (the producer it fingerprinted: recorded, signed).
    assert cubepack.verify(cube, require_provenance="recorded", trusted_keys=[public],
                           raise_on_failure=False).provenance["item-1"]["basis"] == "claimed"
