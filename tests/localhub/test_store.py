"""The local Hub's on-disk store: immutable commits, moving refs, content-addressed blobs."""

from __future__ import annotations

import pytest

SHA = "ab" * 32


def test_store_commits_are_immutable_and_refs_move(tmp_path):
    import base64

    from cubepack.localhub import HubStore
    from cubepack.localhub._store import StoreError, repo_ref

    store = HubStore(tmp_path)
    repo = repo_ref("datasets", "ns", "cube")
    assert store.create(repo, private=False) and not store.create(repo, private=False)
    first = store.resolve(repo, "main")

    def add(path, data):
        return {"key": "file", "value": {"path": path, "content": base64.b64encode(data).decode()}}

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
    assert escape.value.status == 400
    with pytest.raises(StoreError) as unknown:
        store.resolve(repo, "f" * 40)
    assert unknown.value.code == "RevisionNotFound"


def test_store_refuses_a_blob_that_does_not_match_its_oid(tmp_path):
    import hashlib

    from cubepack.localhub import HubStore
    from cubepack.localhub._store import StoreError

    store = HubStore(tmp_path)
    data = b"payload"
    oid = hashlib.sha256(data).hexdigest()
    with pytest.raises(StoreError):
        store.put_blob(oid, len(data), [b"other!!"])
    assert not store.has_blob(oid)
    store.put_blob(oid, len(data), [data])
    assert store.has_blob(oid, len(data))
    assert [p.name for p in (tmp_path / "blobs").iterdir()] == [oid]  # no temp file left
