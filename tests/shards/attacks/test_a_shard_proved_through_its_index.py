"""verify proves a shard without dead bytes through its index (issue #40 item 6: each byte
hashed once): each memory's range against the index's sha256, the padding zeros, the size the
lock's; the file's own sha256 is not computed, and never reported as proved. Attacked: a byte
flipped in a range, in the padding, one added past the end; a lock whose shard sha256 lies
while the index is right; a lock and an index that lie together (every byte is still the
index's: verify passes, says the digest is the lock's word, and sign and encrypt refuse)."""

from __future__ import annotations

import json
import shutil

import pytest

import cubepack
from cubepack._util import constants
from cubepack.errors import IntegrityError
from cubepack.trust._evidence import CLAIMED, PROVED

from helpers import make_key, reseal_lock

SHARD0 = "shards/activations-00000.kvshard"
INDEX0 = "shards/activations-00000.index.json"


def _rows(report, name="sha256"):
    return {c.subject: c for c in report.checks if c.name == name}


def _index(cube):
    return json.loads((cube / INDEX0).read_text())


def _flip(cube, at):
    data = bytearray((cube / SHARD0).read_bytes())
    data[at] ^= 0x01
    (cube / SHARD0).write_bytes(bytes(data))


def _refused(cube, model):
    report = cubepack.verify(cube, model=model, raise_on_failure=False)
    assert not report.ok
    row = _rows(report).get(SHARD0)
    # the shard's own sha256 is never reported as passed
    assert row is None or row.ok is not True, str(row)
    return report


def test_a_sound_shard_is_proved_through_its_index_and_says_so(cube, zoo):
    report = cubepack.verify(cube, model=str(zoo["a"]))
    row = _rows(report)[SHARD0]
    assert row.ok is True and row.basis == CLAIMED
    assert "every byte proved through its index" in row.detail
    assert "not computed" in row.detail
    assert SHARD0 in report.index_proved
    shard_row = _rows(report, "shards")[f"{INDEX0} ({SHARD0})"]
    assert shard_row.ok and shard_row.basis == PROVED


def test_a_byte_flipped_in_a_range(cube, zoo):
    memory = next(iter(_index(cube)["memories"].values()))
    _flip(cube, memory["offset"] + memory["length"] - 1)  # a tensor's last byte
    report = _refused(cube, str(zoo["a"]))
    assert any(c.name == "shards" and c.ok is False and "hashes to" in c.detail
               for c in report.checks)


def test_a_byte_flipped_in_the_padding(cube, zoo):
    memories = sorted(_index(cube)["memories"].values(), key=lambda m: m["offset"])
    gaps = [(a["offset"] + a["length"], b["offset"]) for a, b in zip(memories, memories[1:])
            if b["offset"] > a["offset"] + a["length"]]
    assert gaps, "the fixture's shard has no padding to attack"
    _flip(cube, gaps[0][0])
    report = _refused(cube, str(zoo["a"]))
    assert any(c.name == "shards" and c.ok is False and "padding" in c.detail
               for c in report.checks)


def test_a_byte_past_the_end(cube, zoo):
    with open(cube / SHARD0, "ab") as handle:
        handle.write(b"\0")
    report = _refused(cube, str(zoo["a"]))
    assert _rows(report, "size")[SHARD0].ok is False


def test_a_lock_whose_shard_sha256_lies_while_the_index_is_right(cube, zoo):
    reseal_lock(cube, lambda lock: lock["files"][SHARD0].update(sha256="0" * 64))
    report = _refused(cube, str(zoo["a"]))
    assert any(c.name == "shards" and c.ok is False and "disagrees with the lock" in c.detail
               for c in report.checks)


@pytest.fixture
def lying(cube):
    """A lock and an index that state another sha256 of the shard, together (the index
    resealed into the lock): every byte is still the one the index lays out."""
    index = _index(cube)
    index["shard"]["sha256"] = "0" * 64
    from cubepack._util import canonical

    text = canonical.dumps(index, compact=True).encode()
    (cube / INDEX0).write_bytes(text)
    import hashlib

    def change(lock):
        lock["files"][SHARD0]["sha256"] = "0" * 64
        lock["files"][INDEX0] = {"sha256": hashlib.sha256(text).hexdigest(), "size": len(text)}
    reseal_lock(cube, change)
    return cube


def test_a_lock_and_index_lying_together_verify_never_proves_that_sha256(lying, zoo):
    report = cubepack.verify(lying, model=str(zoo["a"]))
    row = _rows(report)[SHARD0]
    assert row.basis == CLAIMED and "0" * 64 in row.detail and "not computed" in row.detail


def test_sign_refuses_a_shard_digest_it_did_not_compute(lying, zoo, tmp_path):
    pytest.importorskip("model_signing")
    private, _ = make_key(tmp_path, "signer")
    with pytest.raises(IntegrityError, match="misstates the shard's digest"):
        cubepack.sign(lying, key=str(private), model=str(zoo["a"]))
    assert not (lying / constants.SIGNATURE_FILENAME).exists()


def test_a_shard_with_dead_bytes_is_hashed_whole(cube, zoo):
    cubepack.pack(cube, model=str(zoo["a"]), remove=["item-000"])
    report = cubepack.verify(cube, model=str(zoo["a"]))
    row = _rows(report).get(SHARD0)
    assert row is None  # hashed with the others: the "*" row, proved
    assert SHARD0 not in report.index_proved
    assert _rows(report)["*"].ok and _rows(report)["*"].basis in (None, PROVED)


def test_a_copy_of_a_sound_cube_verifies_the_same(cube, zoo, tmp_path):
    other = shutil.copytree(cube, tmp_path / "copy")
    assert cubepack.verify(other, model=str(zoo["a"])).ok


def test_encrypt_refuses_a_shard_digest_it_did_not_compute(lying, zoo):
    """The encrypted manifest carries the clear lock's digests (each plaintext's check at
    decryption): encrypt computes the shard's before it writes any."""
    before = sorted(p.name for p in lying.rglob("*"))
    with pytest.raises(IntegrityError, match="misstates the shard's digest"):
        cubepack.encrypt(lying, [
            "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"])
    assert sorted(p.name for p in lying.rglob("*")) == before
