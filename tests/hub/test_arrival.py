"""A pull hashes each file as its bytes arrive, through the real huggingface_hub client against
the local endpoint: the same digests as hashing the files afterwards, every file hashed by this
process, and corrupted bytes arriving mid-pull refused."""

from __future__ import annotations

import os

import pytest

from cubepack import HubError, VerificationFailed
from cubepack._util import hashing
from cubepack._util.hashing import HashingWriter
from cubepack.hub import _arrival, pull, push
from cubepack.hub import _pull as pull_module
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
        server.sha = push(copy_of(packed_cube, tmp_path), "ns/cube", endpoint=server.url,
                          allow_local_paths=True).commit_sha
        yield server


@pytest.fixture
def read_back(monkeypatch):
    """The files a pull hashes from disk (rather than as they arrived)."""
    opened: list[str] = []
    real = pull_module.sha256_file

    def recorded(path, *args, **kwargs):
        opened.append(os.path.basename(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(pull_module, "sha256_file", recorded)
    return opened


def do_pull(hub, tmp_path, target="out", **kwargs):
    return pull(f"ns/cube@{hub.sha}", endpoint=hub.url, local_dir=tmp_path / target,
                cache_dir=tmp_path / "hf-cache", **kwargs)


def placed_digests(folder):
    return {name: hashing.sha256_file(folder / name) for name in tree_bytes(folder)
            if not name.startswith(".cache/")}


def test_every_file_is_hashed_as_it_arrives_to_the_same_digests_and_none_is_read_back(
        hub, tmp_path, read_back):
    from huggingface_hub import file_download

    original = file_download.http_get
    snapshot, files, hashed = pull_module._download(
        pull_module.HubClient(hub.url), "ns/cube", hub.sha, repo_type="dataset", offline=False,
        cache_dir=tmp_path / "hf-cache", lock_first=True)
    assert read_back == []
    assert hashed == {name: hashing.sha256_file(snapshot / name) for name in files}
    assert file_download.http_get is original  # the wrapper is gone with the pull
    result = do_pull(hub, tmp_path)
    assert result.report.ok


def test_a_file_corrupted_in_flight_is_refused_and_a_clean_retry_passes(hub, tmp_path, packed_cube,
                                                                        read_back):
    fault = hub.add_fault("corrupt", path=rf"/resolve/.*{ITEM}", method="GET")
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("the folder as it was")
    with pytest.raises(VerificationFailed) as caught:
        do_pull(hub, tmp_path, force=True)
    assert fault.hits == 1 and read_back == []  # refused on its streamed digest
    assert [(f.name, f.subject) for f in caught.value.failures] == [("sha256", ITEM)]
    assert "removed from the HF cache" in str(caught.value)
    assert tree_bytes(target) == {"keep.txt": b"the folder as it was"}
    assert do_pull(hub, tmp_path, force=True).report.ok  # the blob was evicted: fetched again
    placed = placed_digests(target)
    placed.pop(".gitattributes", None)  # the endpoint adds it
    assert placed == placed_digests(packed_cube)


def test_a_download_the_client_resumes_is_hashed_whole(hub, tmp_path, read_back):
    hub.add_fault("truncate", path=rf"/resolve/.*{ITEM}", method="GET")
    try:
        result = do_pull(hub, tmp_path)  # huggingface_hub 2.x resumes with a Range request
        resumed = True
    except HubError:  # 0.36 gives up on a short body: a rerun completes it
        result, resumed = do_pull(hub, tmp_path), False
    assert result.report.ok
    downloads = [n for route, n in hub.stats.requests.items()
                 if route.startswith("GET ") and route.endswith(ITEM)]
    assert downloads == [2]
    if resumed:  # both responses went through one stream, and its digest passed the lock
        assert os.path.basename(ITEM) not in read_back


def test_files_already_in_the_cache_are_hashed_from_disk(hub, tmp_path, read_back):
    from huggingface_hub import snapshot_download

    snapshot_download("ns/cube", repo_type="dataset", revision=hub.sha, endpoint=hub.url,
                      cache_dir=tmp_path / "hf-cache")  # nothing will arrive: all is cached
    result = do_pull(hub, tmp_path)
    assert result.report.ok
    assert sorted(read_back) == sorted(os.path.basename(name) for name in
                                       placed_digests(tmp_path / "out"))


def test_a_cached_blob_corrupted_before_the_pull_is_refused(hub, tmp_path):
    from huggingface_hub import snapshot_download

    snapshot = snapshot_download("ns/cube", repo_type="dataset", revision=hub.sha,
                                 endpoint=hub.url, cache_dir=tmp_path / "hf-cache")
    blob = os.path.realpath(os.path.join(snapshot, ITEM))
    with open(blob, "rb") as handle:
        data = bytearray(handle.read())
    data[len(data) // 2] ^= 0xFF
    with open(blob, "wb") as handle:
        handle.write(data)
    with pytest.raises(VerificationFailed) as caught:
        do_pull(hub, tmp_path)
    assert [(f.name, f.subject) for f in caught.value.failures] == [("sha256", ITEM)]


def test_an_arrival_vouches_only_for_the_whole_stream_into_that_very_file(tmp_path):
    path = tmp_path / "blob"
    with open(path, "wb") as handle:
        writer = HashingWriter(handle)
        writer.write(b"payload")
        info = os.fstat(handle.fileno())
    arrival = _arrival.Arrival(writer, info.st_dev, info.st_ino)
    assert _arrival.arrived_digest([arrival], path) == hashing.sha256_file(path)
    assert _arrival.arrived_digest([], path) is None
    assert _arrival.arrived_digest([arrival, arrival], path) is None
    other = tmp_path / "other"
    other.write_bytes(b"payload")  # same bytes, another file: not what was streamed
    assert _arrival.arrived_digest([arrival], other) is None
    with open(path, "ab") as handle:
        handle.write(b"!")  # the file holds more than the stream wrote
    assert _arrival.arrived_digest([arrival], path) is None


def test_only_downloads_inside_a_pull_are_hashed_on_the_way(hub, tmp_path, monkeypatch):
    from huggingface_hub import file_download, hf_hub_download

    original = file_download.http_get
    made = []

    class Counted(HashingWriter):
        def __init__(self, inner):
            made.append(self)
            super().__init__(inner)

    monkeypatch.setattr(_arrival, "HashingWriter", Counted)

    def fetch(folder):
        return hf_hub_download("ns/cube", "cubepack.lock", repo_type="dataset",
                               revision=hub.sha, endpoint=hub.url, cache_dir=tmp_path / folder)

    with _arrival.hashing_downloads():
        fetch("outside")  # another download meanwhile, not the pull's: passed through
        assert made == []
        with _arrival.arrivals() as found:
            local = fetch("inside")
    assert len(made) == 1 and _arrival.arrived_digest(found, local) == hashing.sha256_file(local)
    assert file_download.http_get is original
