"""Tampering with a packed cube: every change is refused and named."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import cubepack
from cubepack import VerificationFailed
from cubepack._util import constants

from helpers import build_cache, reseal_lock, run_torch_free


def refused(cube, **kwargs):
    with pytest.raises(VerificationFailed) as caught:
        cubepack.verify(cube, **kwargs)
    return caught.value.failures


ITEM = "activations/item-1.kv.safetensors"


def test_untouched_cube_verifies(cube, zoo):
    report = cubepack.verify(cube, model=str(zoo["a"]))
    assert report.ok and not report.failures
    names = {c.name for c in report.checks}
    assert names == {"lock", "path", "file set", "size", "sha256", "content", "kv header",
                     "kv checksums", "cube config",
                     "signature", "attestation", "model identity"}


def test_one_flipped_byte_is_named(cube, models):
    data = bytearray((cube / ITEM).read_bytes())
    data[-3] ^= 0x01
    (cube / ITEM).write_bytes(bytes(data))
    [failure] = refused(cube)  # the lock's hash; a file whose hash failed is never parsed
    assert (failure.name, failure.subject) == ("sha256", ITEM)
    assert failure.expected != failure.found
    with pytest.raises(cubepack.IntegrityError, match="tensor layers.1.values"):
        cubepack.load_kv_cache(cube / ITEM, models["a"])


def test_missing_file(cube):
    (cube / "config.json").unlink()
    [failure] = refused(cube)
    assert (failure.name, failure.subject, failure.detail) == ("file set", "config.json",
                                                               "missing from the cube")


def test_extra_file(cube):
    (cube / "activations" / "evil.kv.safetensors").write_bytes(b"x")
    [failure] = refused(cube)
    assert (failure.subject, failure.detail) == ("activations/evil.kv.safetensors",
                                                 "not listed in the lock")


def test_gitattributes_is_tolerated(cube):
    (cube / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    assert cubepack.verify(cube).ok


def test_renamed_file(cube):
    os.rename(cube / ITEM, cube / "activations" / "renamed.kv.safetensors")
    failures = refused(cube)
    assert {(f.subject, f.detail) for f in failures} == {
        (ITEM, "missing from the cube"),
        ("activations/renamed.kv.safetensors", "not listed in the lock")}


def test_symlink_is_refused_and_not_followed(cube, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    (cube / "config.json").unlink()
    os.symlink(outside, cube / "config.json")
    failures = refused(cube)
    assert any(f.name == "path" and f.subject == "config.json" and "symlink" in f.detail
               for f in failures)
    assert not any(f.name == "sha256" for f in failures)


@pytest.mark.parametrize("bad_path", ["../outside.txt", "/etc/passwd", "activations/../../x"])
def test_lock_entry_escaping_the_cube_is_refused_before_reading(cube, tmp_path, bad_path,
                                                                monkeypatch):
    (tmp_path / "outside.txt").write_text("secret")
    reseal_lock(cube, lambda lock: lock["files"].update(
        {bad_path: {"sha256": "0" * 64, "size": 6}}))
    from cubepack._util import hashing

    opened = []
    monkeypatch.setattr(hashing, "sha256_file", lambda *a, **k: opened.append(a[0]))
    [failure] = refused(cube)
    assert failure.name == "lock" and bad_path in failure.detail
    assert opened == []  # nothing was hashed, inside or outside the cube


def test_edited_lock_value_breaks_the_digest(cube):
    text = (cube / constants.LOCK_FILENAME).read_text()
    lock = json.loads(text)
    lock["activations"]["item-1"]["token_count"] = 7
    (cube / constants.LOCK_FILENAME).write_text(json.dumps(lock, indent=2, sort_keys=True))
    [failure] = refused(cube)
    assert failure.name == "lock" and "digest mismatch" in failure.detail


def test_kv_file_swapped_for_model_b_with_resealed_lock(cube, models):
    from cubepack._util import hashing

    cache_b = build_cache(models["b"], torch.tensor([[5, 6, 7, 8, 9, 10]]))
    cubepack.save_kv_cache(cache_b, cube / ITEM, producer=models["b"], metadata={"id": "item-1"})
    digest, size = hashing.sha256_file(cube / ITEM), (cube / ITEM).stat().st_size

    def reseal(lock):
        lock["files"][ITEM] = {"sha256": digest, "size": size}
        lock["activations"]["item-1"]["sha256"] = digest
    reseal_lock(cube, reseal)
    failures = refused(cube)
    assert [(f.name, f.detail.split(" ")[0]) for f in failures] == [
        ("kv header", "producer.weights_digest")]
    assert failures[0].found == cubepack.fingerprint(models["b"]).weights_digest
    with pytest.raises(cubepack.IdentityMismatch):  # and loading it into A is refused too
        cubepack.load_kv_cache(cube / ITEM, models["a"])


def test_pins_rewritten_to_model_b_are_caught_by_the_model_check(cube, zoo, models):
    identity_b = cubepack.fingerprint(zoo["b"]).to_dict()

    def repin(lock):  # B's identity, in the keys a lock's pin holds
        pinned = lock["models"]["act_mem"]["identity"]
        lock["models"]["act_mem"]["identity"] = {k: identity_b[k] for k in pinned}
    reseal_lock(cube, repin)
    failures = refused(cube, model=str(zoo["a"]))
    assert any(f.name == "model identity" and "weights_digest" in f.subject for f in failures)
    assert any(f.name == "kv header" for f in failures)


def test_lock_with_duplicate_keys_is_refused(cube):
    text = (cube / constants.LOCK_FILENAME).read_text()
    text = text.replace('"cube_id":', '"cube_id": "x",\n  "cube_id":', 1)
    (cube / constants.LOCK_FILENAME).write_text(text)
    [failure] = refused(cube)
    assert "repeats the key 'cube_id'" in failure.detail


def test_unpacked_folder_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    [failure] = refused(tmp_path)
    assert failure.name == "lock" and "cubepack pack" in failure.detail


def test_verify_does_not_import_torch(packed):
    run_torch_free(f"import cubepack\nassert cubepack.verify({str(packed)!r}).ok\n")


def test_diff_names_changed_files_and_pins(cube, packed, zoo):
    (cube / ITEM).unlink()
    reseal_lock(cube, lambda lock: (lock["files"].pop(ITEM), lock["activations"].pop("item-1")))
    result = cubepack.diff(packed, cube)
    assert result["sections"]["files"]["removed"] == [ITEM]
    assert result["sections"]["activations"]["removed"] == ["item-1"]
    assert result["same"] is False
    assert cubepack.diff(packed, packed / constants.LOCK_FILENAME)["same"] is True


def _relist(cube, names):
    from cubepack._util import hashing

    def change(lock):
        for name in names:
            path = cube / name
            lock["files"][name] = {"sha256": hashing.sha256_file(path),
                                   "size": path.stat().st_size}
    reseal_lock(cube, change)


@pytest.mark.parametrize("spelling", ["act.txt", "./act.txt", "sub/../act.txt"])
@pytest.mark.parametrize("payload", [b"I0x1\n0cos\nsystem\n(S'true'\ntR.",  # pickletools says no
                                     b"cos\nsystem\n(S'true'\ntR."])
def test_a_file_memos_would_unpickle_is_refused_under_any_spelling(cube, tmp_path, spelling,
                                                                   payload):
    """What MemOS opens is os.path.join(dir, memory_filename): './act.txt' is 'act.txt'. And a
    pickle is whatever pickle.load reads (its loader accepts 'I0x1', pickletools does not)."""
    config = json.loads((cube / "config.json").read_text())
    config["act_mem"]["config"]["memory_filename"] = spelling
    (cube / "config.json").write_text(json.dumps(config))
    (cube / "act.txt").write_bytes(payload)
    _relist(cube, ["config.json", "act.txt"])
    report = cubepack.verify(cube, raise_on_failure=False)
    assert not report.ok
    content = {c.subject: c.detail for c in report.failures if c.name == "content"}
    assert "act.txt" in content


def test_a_memory_file_memos_would_open_outside_the_cube_is_refused(cube, tmp_path):
    config = json.loads((cube / "config.json").read_text())
    config["act_mem"]["config"]["memory_filename"] = "../outside.pickle"
    (cube / "config.json").write_text(json.dumps(config))
    _relist(cube, ["config.json"])
    report = cubepack.verify(cube, raise_on_failure=False)
    assert any(c.name == "content" and c.subject == "config.json" and "outside the cube"
               in c.detail for c in report.failures)


def test_every_check_that_can_refuse_has_a_fix_in_the_refusal():
    """A refusal always says what to do: damaged bytes are pulled or packed again; each check
    of the policy names its own fix (it said "see each problem for what to do" and gave none).
    The fix is the catalogue's, read from the failed check's own entry."""
    from cubepack._util.checks import Catalogue
    from cubepack.trust._report import VerifyReport

    damage = {"cube", "lock", "path", "file set", "size", "sha256", "content", "shards",
              "kv header", "kv checksums", "adapter", "cube config", "preferences", "partial"}
    assert {entry for entry in Catalogue if entry.damage} == damage
    for entry in Catalogue:
        report = VerifyReport(Path("c"))
        report.add(entry, "x", False, "broken")
        message = str(VerificationFailed(report))
        fix = "pull or pack it again" if entry in damage else entry.fix
        assert message.endswith(f"Do not load it; {fix}."), message
    report = VerifyReport(Path("c"))
    for entry in (Catalogue.SIGNATURE, Catalogue.SHA256, Catalogue.SIGNATURE, Catalogue.SIZE,
                  Catalogue.EMBEDDER):
        report.add(entry, "x", False, "broken")
    assert str(VerificationFailed(report)).endswith(  # the bytes' fix first, each fix once
        f"Do not load it; pull or pack it again; {Catalogue.SIGNATURE.fix}; "
        f"{Catalogue.EMBEDDER.fix}.")


def test_a_model_that_does_not_exist_is_the_callers_mistake_not_the_cubes(cube, tmp_path):
    """A typo in --model is a usage error (exit 2) naming the folder, never a refused cube
    (the new-user trial: it said "REFUSED ... rebuild it" and exited 1)."""
    with pytest.raises(cubepack.ModelNotFoundError, match="typo-model"):
        cubepack.verify(cube, model=str(tmp_path / "typo-model"))


def test_the_dtype_line_gives_no_advice_already_followed(cube, zoo):
    """The folder's dtype stays the pin's claim, but after --recompute the line no longer asks
    for --recompute (the new-user trial: advice already followed)."""
    def dtype_line(report):
        [check] = [c for c in report.checks if c.subject.endswith(" dtype")]
        return check.detail

    assert "or --recompute" in dtype_line(cubepack.verify(cube, model=str(zoo["a"])))
    after = dtype_line(cubepack.verify(cube, model=str(zoo["a"]), recompute=True,
                                       raise_on_failure=False))  # its caches lack token ids
    assert "--recompute ran it in that dtype" in after and "not proved" in after
