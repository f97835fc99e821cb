"""The local Hub's on-disk store: immutable commits, moving refs, content-addressed blobs."""

from __future__ import annotations

import pytest

SHA = "ab" * 32


def test_store_commits_are_immutable_and_refs_move(tmp_path):
    from cubepack.localhub import HubStore
    from cubepack.localhub._store import AddFile, StoreError, repo_ref

    store = HubStore(tmp_path)
    repo = repo_ref("datasets", "ns", "cube")
    assert store.create(repo, private=False) and not store.create(repo, private=False)
    first = store.resolve(repo, "main")

    def add(path, data):
        return AddFile(path, data)

    second = store.apply_commit(repo, "main", title="t", message="", parent=first,
                                operations=[add("a.txt", b"one")])
    assert store.resolve(repo, "main") == second != first
    assert store.commit(repo, first)["tree"].keys() == {".gitattributes"}
    with pytest.raises(StoreError) as stale:
        store.apply_commit(repo, "main", title="t", message="", parent=first,
                           operations=[add("a.txt", b"two")])
    assert stale.value.status == 412
    store.create_ref(repo, "tag", "v1", second)
    with pytest.raises(StoreError) as exists:
        store.create_ref(repo, "tag", "v1", first)
    assert exists.value.status == 409 and store.resolve(repo, "v1") == second
    with pytest.raises(StoreError) as escape:
        store.apply_commit(repo, "main", title="t", message="", parent=None,
                           operations=[add("../x", b"")])
    assert escape.value.status == 422  # the Hub's answer to a path it refuses
    with pytest.raises(StoreError) as unknown:
        store.resolve(repo, "f" * 40)
    assert unknown.value.code == "RevisionNotFound"


def test_store_refuses_a_blob_that_does_not_match_its_oid(tmp_path):
    import hashlib

    from cubepack.localhub import HubStore
    from cubepack.localhub._store import StoreError, repo_ref

    store = HubStore(tmp_path)
    repo = repo_ref("models", "ns", "repo")
    store.create(repo, private=False)
    data = b"payload"
    oid = hashlib.sha256(data).hexdigest()
    with pytest.raises(StoreError):
        store.put_blob(repo, oid, len(data), [b"other!!"])
    assert not store.has_blob(oid)
    store.put_blob(repo, oid, len(data), [data])
    assert store.has_blob(oid, len(data)) and store.holds(repo, oid, len(data))
    left = {p.name for p in (tmp_path / "blobs").iterdir()} - {".lock"}  # the root's lock
    assert oid in left and not [name for name in left if name.endswith(".tmp")]


def _counting(monkeypatch, store, method):
    calls = []
    original = getattr(store, method)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(store, method, counted)
    return calls


def test_a_commit_is_parsed_once_per_process_and_repo_names_are_listed_once(tmp_path,
                                                                            monkeypatch):
    """Downloads stay O(1) in the size of a repo: the commit a request names is parsed once
    (commits are immutable), and the case-insensitive repo look-up lists the folders once."""
    import http.client
    from urllib.parse import urlsplit

    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub import constants as hub_constants

    from cubepack.testing.hub import InstrumentedHub

    monkeypatch.setattr(hub_constants, "HF_HUB_DISABLE_XET", True)
    with InstrumentedHub(tmp_path / "root") as hub:
        if __import__("huggingface_hub").__version__.startswith("0."):
            monkeypatch.setattr(hub_constants, "ENDPOINT", hub.url)
        api = HfApi(endpoint=hub.url, token="t")
        api.create_repo("ns/cube", repo_type="dataset")
        sha = api.create_commit("ns/cube", [CommitOperationAdd(f"f{i}.txt", b"%d" % i)
                                            for i in range(50)],
                                commit_message="fifty", repo_type="dataset").oid
    # A new endpoint on the same root (a restarted server): nothing is in memory yet.
    with InstrumentedHub(tmp_path / "root") as hub:
        loads = _counting(monkeypatch, hub.store, "_load_commit")
        scans = _counting(monkeypatch, hub.store, "_scan")
        host = urlsplit(hub.url)
        connection = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
        for index in range(20):
            for revision in (sha, "main"):
                connection.request("HEAD", f"/datasets/NS/Cube/resolve/{revision}/f{index}.txt")
                response = connection.getresponse()
                response.read()
                assert response.status == 200 and response.getheader("X-Repo-Commit") == sha
        connection.close()
    assert len(loads) == 1 and len(scans) == 1


def test_the_commit_cache_is_bounded_by_tree_entries(tmp_path, monkeypatch):
    from cubepack.localhub import HubStore
    from cubepack.localhub._store import AddFile, repo_ref

    store = HubStore(tmp_path)
    monkeypatch.setattr(store._commits, "_capacity", 25)
    repo = repo_ref("datasets", "ns", "cube")
    store.create(repo, private=False)
    for index in range(20):  # each commit adds a file: trees of 2, 3, ... 21 entries
        store.apply_commit(repo, "main", title="t", message="", parent=None,
                           operations=[AddFile(f"f{index}", b"x")])
    assert store._commits._size <= 25
    loads = _counting(monkeypatch, store, "_load_commit")
    assert len(store.history(repo, "main")) == 21  # evicted commits are read again, correctly
    assert loads


def test_concurrent_creates_of_one_repo_under_two_spellings_make_one_repo(tmp_path):
    import threading

    from cubepack.localhub import HubStore
    from cubepack.localhub._store import repo_ref

    store = HubStore(tmp_path)
    spellings = ["NS/Cube", "ns/cube", "Ns/CUBE", "ns/Cube"] * 3
    barrier, created = threading.Barrier(len(spellings)), []

    def create(spelling):
        repo = store.find(repo_ref("datasets", *spelling.split("/")))
        barrier.wait()
        created.append(store.create(repo, private=False))

    threads = [threading.Thread(target=create, args=(s,)) for s in spellings]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(created) == [False] * 11 + [True]
    assert len(list((tmp_path / "repos" / "datasets").rglob("repo.json"))) == 1
    found = store.find(repo_ref("datasets", "nS", "cUBE"))
    assert store.exists(found) and found.repo_id.lower() == "ns/cube"
    store.move(found, repo_ref("datasets", "other", "Name"))
    assert not store.exists(store.find(repo_ref("datasets", "ns", "cube")))
    assert store.find(repo_ref("datasets", "OTHER", "name")).repo_id == "other/Name"


@pytest.mark.parametrize("refs", ["branch", "tag", "both"])
@pytest.mark.parametrize("qualifier", ["", "refs/heads/", "refs/tags/"])
def test_a_qualified_ref_names_its_kind_only(tmp_path, refs, qualifier):
    """Every pairing of which refs are named ``v1`` (a branch, a tag, both) and how a revision
    names it (bare, ``refs/heads/``, ``refs/tags/``): a qualified name resolves to the ref of
    its kind or to nothing; a bare one to the branch first, as on the Hub. A write through a
    qualified tag never moves a branch of its name."""
    from cubepack.localhub import HubStore
    from cubepack.localhub._store import AddFile, StoreError, repo_ref

    store = HubStore(tmp_path)
    repo = repo_ref("datasets", "ns", "cube")
    store.create(repo, private=False)
    tagged = store.apply_commit(repo, "main", title="t", message="", parent=None,
                                operations=[AddFile("a.txt", b"tag")])
    branched = store.apply_commit(repo, "main", title="b", message="", parent=None,
                                  operations=[AddFile("a.txt", b"branch")])
    if refs in ("tag", "both"):
        store.create_ref(repo, "tag", "v1", tagged)
    if refs in ("branch", "both"):
        store.create_ref(repo, "branch", "v1", branched)
    expected = {"": branched if refs != "tag" else tagged,
                "refs/heads/": branched if refs != "tag" else None,
                "refs/tags/": tagged if refs != "branch" else None}[qualifier]
    if expected is None:
        with pytest.raises(StoreError) as missing:
            store.resolve(repo, qualifier + "v1")
        assert missing.value.code == "RevisionNotFound"
    else:
        assert store.resolve(repo, qualifier + "v1") == expected
    if qualifier == "refs/tags/":
        with pytest.raises(StoreError) as written:
            store.apply_commit(repo, qualifier + "v1", title="w", message="", parent=None,
                               operations=[AddFile("b.txt", b"w")])
        assert written.value.status == 404
        assert store.refs(repo)["branches"].get("v1") == (branched if refs != "tag" else None)


def _naive(tree, operation):
    """The Hub's meaning of one operation on a tree, by scanning it (the reference)."""
    from cubepack.localhub._store import AddFile, DeleteFile, StoreError

    path = operation.path.rstrip("/")
    if isinstance(operation, AddFile):
        tree[path] = operation.content
    elif isinstance(operation, DeleteFile) and path in tree:
        del tree[path]
    else:
        inside = [name for name in tree if name.startswith(path + "/")]
        if not inside and isinstance(operation, DeleteFile):
            raise StoreError(404, "missing", "EntryNotFound")
        for name in inside:
            del tree[name]


def test_commit_operations_mean_what_a_scan_of_the_tree_means(tmp_path):
    """Random commits of adds, file and folder deletes (named with and without their slash,
    present and missing, a file beside a folder of its name) over a small alphabet of deep
    paths: every tree the store writes is the one a scan of the tree gives."""
    import random

    from cubepack.localhub import HubStore
    from cubepack.localhub._store import AddFile, DeleteFile, DeleteFolder, StoreError, repo_ref

    store = HubStore(tmp_path)
    repo = repo_ref("datasets", "ns", "cube")
    store.create(repo, private=False)
    chooser = random.Random(38)
    model = {".gitattributes": None}
    for _ in range(60):
        operations = []
        for _ in range(chooser.randint(1, 12)):
            path = "/".join(chooser.choice("ab") for _ in range(chooser.randint(1, 4)))
            kind = chooser.choice([AddFile, AddFile, DeleteFile, DeleteFolder])
            if kind is AddFile:
                operations.append(AddFile(path, path.encode()))
            else:
                operations.append(kind(path + ("/" if kind is DeleteFolder else "")))
        expected = dict(model)
        try:
            for operation in operations:
                _naive(expected, operation)
        except StoreError:
            expected = None
        try:
            store.apply_commit(repo, "main", title="t", message="", parent=None,
                               operations=operations)
        except StoreError as refused:
            assert expected is None and refused.code == "EntryNotFound", operations
            continue
        assert expected is not None, operations
        tree = store.commit(repo, store.resolve(repo, "main"))["tree"]
        assert set(tree) == set(expected), operations
        model = expected


def test_a_commit_s_operations_cost_what_they_change(tmp_path):
    """40,000 deletedFolder operations naming folders that are not there, on a tree of 5,000
    files: each once scanned the tree (2 x 10^8 prefix tests, under the repo's lock and the
    root's); now each is a look-up (seconds to spare on a loaded machine)."""
    import time

    from cubepack.localhub import HubStore
    from cubepack.localhub._store import AddFile, DeleteFolder, repo_ref

    store = HubStore(tmp_path)
    repo = repo_ref("datasets", "ns", "cube")
    store.create(repo, private=False)
    store.apply_commit(repo, "main", title="t", message="", parent=None,
                       operations=[AddFile(f"f/{i}.txt", b"x") for i in range(5_000)])
    started = time.process_time()
    store.apply_commit(repo, "main", title="t", message="", parent=None,
                       operations=[DeleteFolder(f"nope{i}/") for i in range(40_000)])
    took = time.process_time() - started
    assert took < 5, f"{took:.1f} s of CPU for 40,000 deletedFolder operations"
