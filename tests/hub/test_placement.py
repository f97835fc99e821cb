"""What a pull places: files of their own (downloaded into the folder, or copied from an HF
cache ``hf download`` filled: never a hard link to its blobs), hashed as placed, through the
real huggingface_hub client against the local endpoint. Editing a pulled folder, or pulling
again, leaves the cache and every other pull as it was; corrupted bytes, arriving or cached,
are refused."""

from __future__ import annotations

import os

import pytest

import cubepack
from cubepack import HubError, VerificationFailed
from cubepack._util import hashing
from cubepack.hub import _pull as pull_module
from cubepack.hub import pull, push
from cubepack.testing.hub import InstrumentedHub

from helpers import copy_of, tree_bytes

ITEMS = {"item-1": [5, 6, 7, 8, 9, 10], "item-2": [11, 12, 13, 14]}
ITEM = "activations/item-2.kv.safetensors"


@pytest.fixture(scope="module")
def packed_cube(packed_cube_factory):
    return packed_cube_factory(ITEMS)


@pytest.fixture
def hub(tmp_path, packed_cube):
    with InstrumentedHub(tmp_path / "hub-root") as server:
        source = copy_of(packed_cube, tmp_path)
        (source / "notes.txt").write_text("notes\n")
        cubepack.pack(source)
        server.sha = push(source, "ns/cube", endpoint=server.url,
                          allow_local_paths=True).commit_sha
        yield server


def do_pull(hub, tmp_path, target="out", **kwargs):
    return pull(f"ns/cube@{hub.sha}", endpoint=hub.url, local_dir=tmp_path / target,
                cache_dir=tmp_path / "hf-cache", **kwargs)


def blobs(tmp_path):
    return {path: path.read_bytes() for path in (tmp_path / "hf-cache").rglob("blobs/*")}


def hf_download(hub, tmp_path):
    """``hf download ns/cube --revision SHA``: the commit in the HF cache, as the hf CLI puts it
    there (a pull itself puts no file of the cube there)."""
    from huggingface_hub import snapshot_download

    return snapshot_download("ns/cube", repo_type="dataset", revision=hub.sha,
                             endpoint=hub.url, cache_dir=tmp_path / "hf-cache")


def inodes(folder):
    return {(path.stat().st_dev, path.stat().st_ino) for path in folder.rglob("*")
            if path.is_file()}


@pytest.mark.parametrize("cache", ["empty", "filled by hf download"])
def test_a_pulled_folder_shares_no_inode_with_the_cache_or_another_pull(hub, tmp_path, cache):
    if cache != "empty":
        hf_download(hub, tmp_path)
    first, second = do_pull(hub, tmp_path, "first"), do_pull(hub, tmp_path, "second")
    assert first.report.ok and second.report.ok
    cached = {(path.stat().st_dev, path.stat().st_ino) for path in blobs(tmp_path)}
    assert bool(cached) == (cache != "empty")  # a pull adds no file to the HF cache
    assert not cached & inodes(tmp_path / "first")
    assert not inodes(tmp_path / "first") & inodes(tmp_path / "second")
    for path in (tmp_path / "first").rglob("*"):
        if path.is_file():
            assert path.stat().st_nlink == 1 and path.stat().st_mode & 0o200  # the user's


def test_editing_a_pulled_file_changes_no_other_copy(hub, tmp_path):
    """``echo edit >> pulled/notes.txt``, and MemOS's in-place dump (``open(path, "w")``)."""
    hf_download(hub, tmp_path)
    do_pull(hub, tmp_path, "first")
    do_pull(hub, tmp_path, "second")
    cache_before, second_before = blobs(tmp_path), tree_bytes(tmp_path / "second")
    with open(tmp_path / "first" / "notes.txt", "a") as handle:
        handle.write("edit\n")
    with open(tmp_path / "first" / ITEM, "r+b") as handle:  # written in place, as MemOS dumps
        handle.write(b"\0" * 16)
    assert blobs(tmp_path) == cache_before
    assert tree_bytes(tmp_path / "second") == second_before
    # The edited folder is refused by its own lock, and a forced pull puts it back.
    assert not cubepack.verify(tmp_path / "first", raise_on_failure=False).ok
    assert do_pull(hub, tmp_path, "first", force=True).report.ok
    assert tree_bytes(tmp_path / "second") == second_before and blobs(tmp_path) == cache_before


def test_the_digests_verify_trusts_are_of_the_bytes_placed(hub, tmp_path, monkeypatch):
    """Each placed copy is hashed from the copy itself: a cached blob rewritten after the copy
    changes nothing that was checked or placed (offline, from an HF cache hf download filled,
    where the pull copies the blobs itself)."""
    real = pull_module.atomic.clone_file

    def clone_then_spoil_the_blob(source, destination):
        how = real(source, destination)
        if destination.name == os.path.basename(ITEM):
            with open(source, "r+b") as handle:  # someone rewrites the cache afterwards
                handle.write(b"\xff" * 8)
        return how

    hf_download(hub, tmp_path)
    monkeypatch.setattr(pull_module.atomic, "clone_file", clone_then_spoil_the_blob)
    result = do_pull(hub, tmp_path, offline=True)
    assert result.report.ok
    assert cubepack.verify(tmp_path / "out").ok


def test_a_file_corrupted_in_flight_is_refused_and_a_clean_retry_passes(hub, tmp_path):
    fault = hub.add_fault("corrupt", path=rf"/resolve/.*{ITEM}", method="GET")
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("the folder as it was")
    with pytest.raises(VerificationFailed) as caught:
        do_pull(hub, tmp_path, force=True)
    assert fault.hits == 1
    assert [(f.name, f.subject) for f in caught.value.failures] == [("sha256", ITEM)]
    assert "HF cache" not in str(caught.value)  # the bytes never went there
    assert tree_bytes(target) == {"keep.txt": b"the folder as it was"} and not blobs(tmp_path)
    assert do_pull(hub, tmp_path, force=True).report.ok  # fetched again


def test_a_download_the_client_resumes_is_placed_whole(hub, tmp_path):
    hub.add_fault("truncate", path=rf"/resolve/.*{ITEM}", method="GET")
    try:
        result = do_pull(hub, tmp_path)  # huggingface_hub 2.x resumes with a Range request
    except HubError:  # 0.36 gives up on a short body: a rerun completes it
        result = do_pull(hub, tmp_path)
    assert result.report.ok


@pytest.mark.parametrize("offline", [False, True])
def test_a_cached_blob_corrupted_before_the_pull_is_refused_and_evicted(hub, tmp_path, offline):
    """huggingface_hub's local-dir mode copies a file the HF cache holds instead of downloading
    it: a corrupted blob there is refused, and removed so that a retry downloads it."""
    snapshot = hf_download(hub, tmp_path)
    blob = os.path.realpath(os.path.join(snapshot, ITEM))
    with open(blob, "rb") as handle:
        data = bytearray(handle.read())
    data[len(data) // 2] ^= 0xFF
    with open(blob, "wb") as handle:
        handle.write(data)
    with pytest.raises(VerificationFailed) as caught:
        do_pull(hub, tmp_path, offline=offline)
    assert [(f.name, f.subject) for f in caught.value.failures] == [("sha256", ITEM)]
    assert "removed from the HF cache, so a retry downloads it again" in str(caught.value)
    assert not os.path.exists(blob) and not (tmp_path / "out").exists()
    assert do_pull(hub, tmp_path).report.ok


def test_offline_pull_places_copies_from_a_cache_hf_download_filled(hub, tmp_path):
    do_pull(hub, tmp_path, "online")
    hf_download(hub, tmp_path)
    offline = do_pull(hub, tmp_path, "offline", offline=True)
    assert offline.report.ok
    cached = {(path.stat().st_dev, path.stat().st_ino) for path in blobs(tmp_path)}
    assert not cached & inodes(tmp_path / "offline")
    placed = {name: hashing.sha256_file(tmp_path / "offline" / name)
              for name in tree_bytes(tmp_path / "offline") if not name.startswith(".cache/")}
    assert placed == {name: hashing.sha256_file(tmp_path / "online" / name) for name in placed}
