"""The index attacks of tests/shards/test_index_attacks.py, planted in a pushed repo (the lock
resealed over them, uploaded without cubepack) and met by ``open(...).load`` instead of
verify: each refused before any tensor is built, naming what differed."""

from __future__ import annotations

import hashlib
import json

import pytest

from cubepack._util import constants
from cubepack.errors import FormatError, IntegrityError

from helpers import reseal_lock


def _outside(cube, remote):
    def change(index):
        max(index["memories"].values(), key=lambda m: m["offset"])["length"] += 64
    remote.edit_index(cube, remote.INDEX0, change)


def _overlap(cube, remote):
    def change(index):
        max(index["memories"].values(), key=lambda m: m["offset"])["offset"] -= 64
    remote.edit_index(cube, remote.INDEX0, change)


def _fewer_in_lock(cube, remote):
    reseal_lock(cube, lambda lock: lock["shards"][remote.SHARD0].update(memories=1))


def _other_checksums(cube, remote):
    def change(index):
        record = index["memories"]["item-001"]["checksums"]
        record["header"] = "0" * 16
    remote.edit_index(cube, remote.INDEX0, change)


def _swapped(cube, remote):
    """item-000 and item-001 swap bytes (same length); the shard's digest resealed in the
    index and the lock, the memories' own digests left as they were."""
    index = json.loads((cube / remote.INDEX0).read_text())
    first, second = sorted(index["memories"].values(), key=lambda m: m["offset"])
    data = bytearray((cube / remote.SHARD0).read_bytes())
    a = bytes(data[first["offset"]:first["offset"] + first["length"]])
    b = bytes(data[second["offset"]:second["offset"] + second["length"]])
    data[first["offset"]:first["offset"] + len(b)] = b
    data[second["offset"]:second["offset"] + len(a)] = a
    remote.plant(cube, remote.SHARD0, bytes(data))
    remote.edit_index(cube, remote.INDEX0, lambda index: index["shard"].update(
        sha256=hashlib.sha256(bytes(data)).hexdigest()))


def _swapped_with_digests(cube, remote):
    """As _swapped, and the two memories' sha256 swapped in the index too: each range hashes
    to its record, but the records' checksums are the other memory's."""
    _swapped(cube, remote)

    def change(index):
        one, two = index["memories"]["item-000"], index["memories"]["item-001"]
        one["sha256"], two["sha256"] = two["sha256"], one["sha256"]
    remote.edit_index(cube, remote.INDEX0, change)


@pytest.mark.parametrize("attack, error, words", [
    (_outside, FormatError, "points outside its shard"),
    (_overlap, FormatError, "overlap memory"),
    (_fewer_in_lock, FormatError, "the lock counts 1"),
    (_other_checksums, IntegrityError, "checksums differ from its index"),
    (_swapped, IntegrityError, "its index says"),
    (_swapped_with_digests, IntegrityError, "checksums differ from its index"),
], ids=lambda value: getattr(value, "__name__", None))
def test_a_planted_index_is_refused_by_load(hub, cube, remote, models, attack, error, words):
    remote.push(hub, cube)
    attack(cube, remote)
    remote.upload(hub, cube, [remote.INDEX0, remote.SHARD0, constants.LOCK_FILENAME])
    opened = remote.open(hub)
    with pytest.raises(error, match=words):
        opened.load("item-001", models["a"])
