"""An adversary's find (fixed): a claim never gains strength on its way through a later step; only what the
signing step established goes to its attestation's ``proved`` block.

``migrate`` re-prefills the files the *old lock's activation entries* name, and keys each new
``recomputed`` label by the old lock's item id (``proven[item_id]``). ``pack`` then labels
the new cube's activations by the id it reads from each KV file's *header* (or file name),
taking ``proven.get(that id)``. The two ids are both the pusher's to choose:

- the old lock (re-sealed by the pusher) lists ``activations/b.kv.safetensors`` as a locked
  file but not as an activation (verify never checks its producer), and names item ``b`` with
  the file ``activations/a.kv.safetensors``, twice (``a`` and ``b`` both point at ``a.kv``);
- migrate re-prefills ``a.kv`` (twice) and holds ``recomputed`` labels for ``a`` and ``b``;
  ``b.kv`` is copied unchanged;
- pack reads ``b.kv``'s id (``b``, its file name), finds ``proven["b"]`` and labels the file
  nobody recomputed ``recomputed``; ``migrate --sign-key`` states it in ``proved.provenance``.

A verifier trusting the migrator's key, asking ``--require-provenance recomputed``, accepts
``b.kv`` on *signed* evidence; a recomputation by the new producer refuses it.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("model_signing", reason="signing needs cubepack[sign]")

import cubepack
from cubepack._util.hashing import sha256_file

from helpers import build_cache, make_key, reseal_lock

IDS_A = [1, 17, 42, 7, 99, 3]
IDS_B = [5, 6, 7, 8, 9, 10]


def test_migrate_does_not_label_a_file_it_did_not_prefill_recomputed(zoo, models, tmp_path):
    private, public = make_key(tmp_path, "migrator")
    old = tmp_path / "old"
    cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([IDS_A])),
                           old / "activations" / "a.kv.safetensors", producer=models["a"],
                           token_ids=IDS_A)
    cubepack.pack(old, cube_id="mallory/bundle", model=str(zoo["a"]))

    # The pusher's additions: a cache that claims model B produced it (it is model A's cache
    # of other tokens), listed as a locked file only, and a re-sealed activations section.
    poisoned = old / "activations" / "b.kv.safetensors"
    cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([IDS_B])), poisoned,
                           producer=cubepack.fingerprint(models["b"]), token_ids=IDS_B)

    def alias(lock):
        lock["files"]["activations/b.kv.safetensors"] = {"sha256": sha256_file(poisoned),
                                                         "size": poisoned.stat().st_size}
        lock["activations"]["b"] = dict(lock["activations"]["a"])

    def unlisted(lock):
        lock["files"]["activations/b.kv.safetensors"] = {"sha256": sha256_file(poisoned),
                                                         "size": poisoned.stat().st_size}

    pristine = (old / "cubepack.lock").read_bytes()
    for change, says in ((alias, "name the same file"), (unlisted, "not as an activation")):
        (old / "cubepack.lock").write_bytes(pristine)
        reseal_lock(old, change)
        # The lock itself is refused: a KV file under activations/ is exactly one activation's
        # (its header checked against the pin), so nothing can alias or hide one.
        with pytest.raises(cubepack.VerificationFailed, match=says):
            cubepack.verify(old)
        with pytest.raises(cubepack.VerificationFailed, match=says):
            cubepack.migrate(old, out=tmp_path / f"new-{change.__name__}", model=str(zoo["b"]),
                             sign_key=private)
        assert not (tmp_path / f"new-{change.__name__}").exists()


def test_migrate_labels_the_files_it_wrote_recomputed_and_nothing_else(zoo, models, tmp_path):
    """The labels migrate hands pack are keyed by the files it re-prefilled, not by ids a
    header or a lock names."""
    private, public = make_key(tmp_path, "migrator")
    old = tmp_path / "old"
    for name, ids in (("a", IDS_A), ("b", IDS_B)):
        cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([ids])),
                               old / "activations" / f"{name}.kv.safetensors",
                               producer=models["a"], token_ids=ids)
    cubepack.pack(old, cube_id="mallory/bundle", model=str(zoo["a"]))
    new = tmp_path / "new"
    cubepack.migrate(old, out=new, model=str(zoo["b"]), sign_key=private)
    report = cubepack.verify(new, trusted_keys=[public], require_provenance="recomputed",
                             model=str(zoo["b"]), recompute=True)
    assert {item: (e["kind"], e["basis"]) for item, e in report.provenance.items()} == {
        "a": ("recomputed", "proved"), "b": ("recomputed", "proved")}
    signed = cubepack.verify(new, trusted_keys=[public], require_provenance="recomputed")
    assert {e["basis"] for e in signed.provenance.values()} == {"signed"}
