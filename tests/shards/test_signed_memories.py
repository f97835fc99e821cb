"""Signatures name memories by digest, not shard files, so they survive compaction (issue #40,
item 3): a version-4 attestation's subject holds ``cube.memories``, the digest of the cube's
id, pins, every memory's (id, sha256) and every other file's sha256. ``verify --trusted-key``
of a compacted cube recomputes it from the lock and every index and says that the memories,
not the layout, were signed; any change of a memory, the memory set, a non-memory file or the
pins fails, naming what differs."""

from __future__ import annotations

import shutil

import pytest

import cubepack
from cubepack._util import constants
from cubepack.errors import SignatureError

from data import HUB_TOKEN
from helpers import make_key

pytest.importorskip("model_signing")


def _pack(cube, zoo, size, **kwargs):
    return cubepack.pack(cube, cube_id="me/signed", model=str(zoo["a"]),
                         shard_size=2 * size + 100, **kwargs)


def _add(cube, source, item):
    shutil.copy(source / "activations" / f"{item}.kv.safetensors",
                cube / "activations" / f"{item}.kv.safetensors")


@pytest.fixture
def compacted(bundle, bundle_factory, zoo, tmp_path):
    """8 memories but item-005 packed two a shard; item-005 appended (inside an older range);
    signed; then compacted (the overlapping shards laid out anew)."""
    cube = bundle(8)
    (cube / "activations" / "item-005.kv.safetensors").unlink()
    (cube / "notes").mkdir()
    (cube / "notes" / "about.txt").write_text("what these memories are\n")
    size = next((cube / "activations").iterdir()).stat().st_size
    _pack(cube, zoo, size)
    (cube / "activations").mkdir(exist_ok=True)
    _add(cube, bundle_factory(8), "item-005")
    _pack(cube, zoo, size)
    private, public = make_key(tmp_path, "signer")
    cubepack.sign(cube, key=str(private), model=str(zoo["a"]))
    signed_lock = (cube / constants.LOCK_FILENAME).read_bytes()
    result = cubepack.compact(cube)
    assert result.changed and result.written and result.signature == "memories"
    assert (cube / constants.LOCK_FILENAME).read_bytes() != signed_lock
    return cube, size, public, private


def _checks(report, name):
    return [c for c in report.checks if c.name.value == name]


def _tampered(cube, zoo, size, change):
    """``change`` applied by a re-pack (as anyone who can write the cube would), the signer's
    attestation put back."""
    attestation = (cube / constants.ATTESTATION_FILENAME).read_bytes()
    change()
    _pack(cube, zoo, size)
    (cube / constants.ATTESTATION_FILENAME).write_bytes(attestation)


def _refused(cube, zoo, public):
    report = cubepack.verify(cube, model=str(zoo["a"]), trusted_keys=[str(public)],
                             require_signature=True, raise_on_failure=False)
    assert not report.ok
    return " | ".join(str(c) for c in report.failures)


def test_a_compacted_cube_verifies_under_the_signature_of_its_memories(compacted, zoo):
    cube, _, public, _ = compacted
    assert (cube / constants.ATTESTATION_FILENAME).is_file()
    assert not (cube / constants.SIGNATURE_FILENAME).exists()  # it named the old shard files
    report = cubepack.verify(cube, model=str(zoo["a"]), trusted_keys=[str(public)],
                             require_signature=True)
    assert report.ok, [str(c) for c in report.failures]
    assert report.signed_by == str(public)
    [signature] = _checks(report, "signature")
    assert signature.ok and "memories" in signature.detail and "layout" in signature.detail
    [attestation] = _checks(report, "attestation")
    assert attestation.ok and "8 memories" in attestation.detail
    assert "not signed" in attestation.detail  # the layout: the report says which was checked


def test_one_memory_changed_fails_naming_it(compacted, zoo, bundle_factory):
    cube, size, public, _ = compacted

    def change():
        _pack(cube, zoo, size, remove=("item-003",))
        (cube / "activations").mkdir(exist_ok=True)
        _add(cube, bundle_factory(8, tokens=5), "item-003")  # same id, other bytes

    _tampered(cube, zoo, size, change)
    failures = _refused(cube, zoo, public)
    assert "predicate.memories.item-003" in failures and "item-004" not in failures


def test_a_removed_memory_fails_naming_it(compacted, zoo):
    cube, size, public, _ = compacted
    _tampered(cube, zoo, size, lambda: None)  # nothing: still verifies
    assert cubepack.verify(cube, trusted_keys=[str(public)], require_signature=True).ok
    attestation = (cube / constants.ATTESTATION_FILENAME).read_bytes()
    _pack(cube, zoo, size, remove=("item-001",))
    (cube / constants.ATTESTATION_FILENAME).write_bytes(attestation)
    assert "item-001" in _refused(cube, zoo, public)


def test_an_added_memory_fails_naming_it(compacted, zoo, bundle_factory):
    cube, size, public, _ = compacted
    _tampered(cube, zoo, size, lambda: (
        (cube / "activations").mkdir(exist_ok=True),
        _add(cube, bundle_factory(9), "item-008")))
    assert "item-008" in _refused(cube, zoo, public)


def test_a_non_memory_file_changed_fails_naming_it(compacted, zoo):
    cube, size, public, _ = compacted
    _tampered(cube, zoo, size,
              lambda: (cube / "notes" / "about.txt").write_text("something else\n"))
    assert "notes/about.txt" in _refused(cube, zoo, public)


def test_a_signature_replayed_on_a_cube_with_other_pins_fails(compacted, zoo, tmp_path):
    cube, size, public, _ = compacted
    other = shutil.copytree(cube, tmp_path / "other")
    (other / constants.ATTESTATION_FILENAME).unlink()
    model = shutil.copytree(zoo["a"], tmp_path / "renamed-model")  # same weights, another pin
    cubepack.pack(other, cube_id="me/signed", model=str(model), shard_size=2 * size + 100)
    assert (cube / constants.LOCK_FILENAME).read_bytes() != \
        (other / constants.LOCK_FILENAME).read_bytes()
    shutil.copy(cube / constants.ATTESTATION_FILENAME, other / constants.ATTESTATION_FILENAME)
    failures = _refused(other, zoo, public)
    assert "pins" in failures


def test_a_signature_replayed_on_another_cube_id_fails(compacted, zoo, tmp_path):
    cube, size, public, _ = compacted
    other = shutil.copytree(cube, tmp_path / "other")
    (other / constants.ATTESTATION_FILENAME).unlink()
    cubepack.pack(other, cube_id="me/other", model=str(zoo["a"]), shard_size=2 * size + 100)
    shutil.copy(cube / constants.ATTESTATION_FILENAME, other / constants.ATTESTATION_FILENAME)
    assert "cube_id" in _refused(other, zoo, public)


def test_open_on_demand_refuses_a_memories_only_signature_naming_the_resign(compacted, hub):
    cube, _, public, _ = compacted
    cubepack.push(cube, "me/signed", endpoint=hub.url, token=HUB_TOKEN, allow_local_paths=True,
                  allow_unsigned=True)
    with pytest.raises(SignatureError, match="compact CUBE --sign-key KEY"):
        cubepack.open("me/signed", endpoint=hub.url, token=HUB_TOKEN, trusted_keys=[str(public)])


def test_compact_sign_key_signs_the_lock_again(compacted, zoo):
    cube, _, public, private = compacted
    assert cubepack.compact(cube, above=0, sign_key=str(private)).signature == "lock"
    report = cubepack.verify(cube, trusted_keys=[str(public)], require_signature=True)
    assert report.ok
    [signature] = _checks(report, "signature")
    assert "layout" not in signature.detail  # the whole cube, lock and shards, is signed


def test_compact_keeps_each_memorys_label(zoo, tmp_path):
    """compact moves memories and changes none: a memory proved ``recomputed`` stays so (its
    label is the last lock's claim, carried as it was), and its signature still names it.
    The cube: the compat fixture of a recomputed sharded cube with dead bytes (lock 7)."""
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "compat" / "lock7-appended"
    cube = shutil.copytree(fixture / "cube", tmp_path / "cube")
    private, public = make_key(tmp_path, "signer")
    cubepack.sign(cube, key=str(private), model=str(zoo["a"]), recompute=True)
    assert cubepack.compact(cube).changed
    report = cubepack.verify(cube, trusted_keys=[str(public)], require_signature=True,
                             require_provenance="recomputed")
    assert {entry["kind"] for entry in report.provenance.values()} == {"recomputed"}
    assert {entry["basis"] for entry in report.provenance.values()} == {"signed"}


def test_an_attestation_above_the_readers_limit_is_refused_when_signing(bundle, zoo, tmp_path,
                                                                        monkeypatch):
    """Version 4 grows with the memories (their sha256): signing a cube whose attestation
    every reader would refuse unread fails first, and writes nothing."""
    from cubepack.format import _envelope

    cube = bundle(3)
    _pack(cube, zoo, 10**6, shards=True)
    monkeypatch.setattr(_envelope, "MAX_ENVELOPE_BYTES", 500)
    private, _ = make_key(tmp_path, "signer")
    with pytest.raises(cubepack.FormatError, match="above the 500 bytes"):
        cubepack.sign(cube, key=str(private), model=str(zoo["a"]))
    assert not (cube / constants.ATTESTATION_FILENAME).exists()
    assert not (cube / constants.SIGNATURE_FILENAME).exists()


@pytest.mark.parametrize("fixture", ["adapters", "lineage", "preferences", "vectors",
                                     "lock7-appended"])
def test_the_memories_statement_names_every_section_of_the_lock(fixture):
    """In a compacted cube the lock is not signed: every section but the ones the statement
    states by digest (files, activations, shards) and the pins (models, whole) is in the
    statement whole, so no entry of the lock (an adapter's base role, a preference's embedder,
    the lineage) can change under a signature over the memories."""
    from pathlib import Path

    from cubepack.format import _envelope
    from cubepack.format import _lock as lockfile
    from cubepack.format.sections import shards as shardformat

    cube = Path(__file__).resolve().parents[1] / "fixtures" / "compat" / fixture / "cube"
    lock = shardformat.resolved(lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes()),
                                shardformat.local_fetch(cube))
    statement = _envelope.memories_statement(lock)
    held = {key for key in lockfile.SECTION_KEYS if lock.holds(key)}
    assert set(statement["sections"]) == held - {"files", "activations", "shards", "models"}
    for key in statement["sections"]:
        assert statement["sections"][key] == lock.to_dict()[key]


def test_the_compact_command_says_what_its_signature_covers(bundle, zoo, tmp_path):
    import os

    from helpers import cli_in_process

    cube = bundle(6)
    size = next((cube / "activations").iterdir()).stat().st_size
    _pack(cube, zoo, size)
    _pack(cube, zoo, size, remove=("item-001",))
    private, _ = make_key(tmp_path, "signer")
    cubepack.sign(cube, key=str(private), model=str(zoo["a"]))
    done = cli_in_process(["compact", str(cube)], env=dict(os.environ), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "covers its memories, not this layout" in done.stdout
    assert f"cubepack compact {cube} --sign-key KEY" in done.stdout


def test_a_push_of_a_compacted_cube_over_a_signed_one_names_what_is_signed(compacted, hub,
                                                                          zoo):
    """The branch's cube is signed over its lock; a changed cube, signed, then compacted, only
    over its memories: pushing it unasked is refused, saying so (nothing pushed)."""
    cube, size, _, private = compacted
    push = {"endpoint": hub.url, "token": HUB_TOKEN, "allow_local_paths": True}
    whole = shutil.copytree(cube, cube.parent / "whole")
    cubepack.compact(whole, above=0, sign_key=str(private))
    cubepack.push(whole, "me/signed", **push)
    _pack(cube, zoo, size, remove=("item-001",))
    # (item-001 shares its shard with item-000: dead bytes there, which compact then rewrites)
    cubepack.sign(cube, key=str(private), model=str(zoo["a"]))
    assert cubepack.compact(cube, above=0).signature == "memories"
    before = hub.stats.uploaded_bytes.copy() if hasattr(hub, "stats") else None
    with pytest.raises(SignatureError, match="memories, not its layout"):
        cubepack.push(cube, "me/signed", **push)
    if before is not None:
        assert hub.stats.uploaded_bytes == before
