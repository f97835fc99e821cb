"""A cube whose memories are fetched later (the MemOS hook's load on first use, issue #39): the
Hub side places every file of an opened cube but its activation memories, each fetched as the
lock's size (``RemoteCube.place``); verify checks their bytes against the lock and plans the
memories' absence by the partial cube's rule (``ops._seam.verify_fetched_later``), and says
they are fetched later, never that they passed. The cube here: 5 memories, two a shard,
pushed to a loopback endpoint."""

from __future__ import annotations

import hashlib
import shutil

import pytest

import cubepack
from cubepack._util import constants
from cubepack._util.checks import Catalogue
from cubepack.errors import VerificationFailed
from cubepack.format import _partial as partialformat
from cubepack.hub import open_cube
from cubepack.ops._seam import verify_fetched_later
from cubepack.trust import TrustPolicy

from data import HUB_TOKEN

SHARD_1 = "shards/activations-00001.kvshard"


@pytest.fixture
def folder(tmp_path):
    """The folder placed into (the endpoint's store is under ``folder`` too)."""
    (tmp_path / "placed").mkdir()
    return tmp_path / "placed"


@pytest.fixture
def remote(hub, sharded):
    cubepack.push(sharded, "me/cube", endpoint=hub.url, token=HUB_TOKEN, allow_local_paths=True)
    return open_cube("me/cube", endpoint=hub.url, token=HUB_TOKEN)


def _origin(remote):
    return remote.repo_id, remote.repo_type, remote.commit


def _on_disk(folder):
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*")
                  if path.is_file())


def test_place_writes_every_file_but_the_memories_and_fetches_no_shard(hub, sharded, remote,
                                                                        folder):
    hub.stats.reset()
    placed = remote.place(folder)
    memories = partialformat.memory_files(remote.lock)
    assert memories and all(name.startswith("shards/") for name in memories)
    assert sorted(placed) == _on_disk(folder) == sorted(set(remote.lock.files) - memories
                                                          | {constants.LOCK_FILENAME})
    assert placed[-1] == constants.LOCK_FILENAME  # the lock last: a folder left half is no cube
    for name in placed:
        assert (folder / name).read_bytes() == (sharded / name).read_bytes(), name
    assert not any("shards/" in key for key in hub.stats.requests)


def test_the_folder_verifies_with_its_memories_said_fetched_later_never_passed(remote,
                                                                               folder):
    remote.place(folder)
    report = verify_fetched_later(folder, TrustPolicy(), _origin(remote))
    assert report.ok and not report.complete and report.lock.activations == {}
    summary = [check for check in report.checks if check.name is Catalogue.PARTIAL]
    assert len(summary) == 1 and summary[0].ok is None
    assert summary[0].detail.startswith("0 of 5 memories here") \
        and "fetched and checked when first used" in summary[0].detail
    file_set = [check for check in report.checks if check.name is Catalogue.FILE_SET]
    assert [check.ok for check in file_set] == [True] \
        and "absent, fetched on first use" in file_set[0].detail
    assert not [check for check in report.checks
                if check.name in (Catalogue.SHARDS, Catalogue.KV_CHECKSUMS) and check.ok]
    assert report.partial["later"] is True and report.partial["checked"] == 0


def test_a_memory_file_in_a_folder_whose_memories_are_fetched_later_is_refused(
        sharded, remote, folder):
    """A memory file that is here was placed by no one who checked it: refused, as a memory
    a partial cube's marker does not list."""
    remote.place(folder)
    (folder / "shards").mkdir()
    shutil.copy(sharded / SHARD_1, folder / SHARD_1)
    with pytest.raises(VerificationFailed) as caught:
        verify_fetched_later(folder, TrustPolicy(), _origin(remote))
    failed = caught.value.report.failures
    assert [(check.name, check.subject) for check in failed] == [(Catalogue.PARTIAL, SHARD_1)]


@pytest.mark.parametrize("name", ["cubepack.yaml", "README.md"])
def test_a_file_that_is_no_memory_missing_fails_the_file_set(remote, folder, name):
    """Only the memory files are tolerated absent: any other file missing is a failure."""
    remote.place(folder)
    if not (folder / name).is_file():
        pytest.skip(f"the cube holds no {name}")
    (folder / name).unlink()
    with pytest.raises(VerificationFailed) as caught:
        verify_fetched_later(folder, TrustPolicy(), _origin(remote))
    assert (Catalogue.FILE_SET, name) in [(c.name, c.subject) for c in caught.value.report.failures]


def test_a_file_swapped_on_the_remote_fails_verify_by_name(hub, sharded, remote, folder):
    """``place`` writes what the endpoint sent (the lock's size, by range); verify of the
    folder, the one checker, compares its bytes with the lock before anything parses them."""
    digest = hashlib.sha256((sharded / "cubepack.yaml").read_bytes()).hexdigest()
    blob = hub.store.root / "blobs" / digest
    saved = blob.read_bytes()
    blob.chmod(0o644)
    blob.write_bytes(bytes([saved[0] ^ 0x01]) + saved[1:])
    try:
        remote.place(folder)
    finally:
        blob.write_bytes(saved)
    with pytest.raises(VerificationFailed) as caught:
        verify_fetched_later(folder, TrustPolicy(), _origin(remote))
    assert [(c.name, c.subject, c.expected) for c in caught.value.report.failures] == [
        (Catalogue.SHA256, "cubepack.yaml", digest)]
