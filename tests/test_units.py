"""Direct unit tests of the pure building blocks: the lock, path safety, the local Hub's store
and diff. Each takes values and returns values; no model, no network."""

from __future__ import annotations

import json

import pytest

from cubepack import FormatError, UnsafeInputError
from cubepack import _lock as lockfile
from cubepack._paths import check_no_collisions, check_relpath, list_cube_files, scan_cube
from cubepack.diff import diff_locks

SHA = "ab" * 32
IDENTITY = {"weights_digest": "sha256:" + "1" * 64, "tokenizer_digest": None,
            "geometry": {"num_layers": 2}, "compute_config": {"rope_theta": 10000.0},
            "dtype": "float32", "kv_dtype": "float32", "quantization": None, "adapters": None}


def make_lock(**changes):
    files = {"config.json": {"sha256": SHA, "size": 10},
             "activations/a.kv.safetensors": {"sha256": "cd" * 32, "size": 99}}
    models = {"act_mem": {"repo_id": "org/m", "revision": "0" * 40, "strict": True,
                          "name": "org/m", "identity": IDENTITY}}
    activations = {"a": {"file": "activations/a.kv.safetensors", "model_role": "act_mem",
                         "token_count": 3, "kv_dtype": "float32", "num_layers": 2,
                         "sha256": "cd" * 32,
                         "provenance": {"kind": "recorded", "detail": "the KV header"}}}
    values = {"cube_id": "u/c", "files": files, "models": models, "activations": activations,
              "cubepack_version": "0.1.0"}
    values.update(changes)
    return lockfile.build_lock(**values)


# --- the lock ------------------------------------------------------------------------------------

def test_lock_round_trips_canonically():
    lock = make_lock()
    text = lockfile.dumps(lock)
    assert lockfile.parse(text.encode()) == lock
    assert lockfile.dumps(lockfile.parse(text.encode())) == text  # byte-identical
    assert text.endswith("\n") and json.loads(text) == lock


def test_content_digest_ignores_the_card_but_digest_covers_it():
    plain = make_lock()
    files = dict(plain["files"], **{"README.md": {"sha256": SHA, "size": 1}})
    with_card = make_lock(files=files)
    assert with_card["content_digest"] == plain["content_digest"]
    assert with_card["digest"] != plain["digest"]


@pytest.mark.parametrize("change, message", [
    (lambda l: l.update(lock_version=3), "version 3"),
    (lambda l: l.update(lock_version=1), "cubepack upgrade CUBE_DIR --model MODEL"),
    (lambda l: l.update(extra=1), "unexpected keys"),
    (lambda l: l["files"]["config.json"].update(size=-1), "must be {sha256"),
    (lambda l: l["models"]["act_mem"].update(revision="main"), "not a 40-hex commit"),
    (lambda l: l["models"]["act_mem"].update(revision="0" * 40 + "\n"), "not a 40-hex commit"),
    (lambda l: l["activations"]["a"].update(file="missing.kv.safetensors"), "does not hold"),
    (lambda l: l["activations"]["a"].update(sha256="ef" * 32), "disagree on the sha256"),
    (lambda l: l["activations"]["a"].update(model_role="nobody"), "no pinned identity"),
])
def test_resealed_but_invalid_locks_are_refused(change, message):
    from cubepack import _canonical

    lock = make_lock()
    change(lock)  # then reseal both digests, as an attacker with write access would
    lock["content_digest"] = lockfile.content_digest(lock["files"], lock["models"],
                                                     lock["activations"])
    lock.pop("digest")
    lock["digest"] = _canonical.digest(lock)
    with pytest.raises(FormatError, match=message):
        lockfile.parse(json.dumps(lock).encode())


def test_lock_paths_are_checked_before_anything_else():
    lock = make_lock()
    lock["files"]["../x"] = {"sha256": SHA, "size": 1}
    with pytest.raises(UnsafeInputError, match="'..' segment"):
        lockfile.parse(json.dumps(lock).encode())


# --- path safety ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a.json", "activations/x.kv.safetensors", "a b/c-d_e.txt"])
def test_safe_relative_paths_pass(name):
    assert check_relpath(name) == name


@pytest.mark.parametrize("name, message", [
    ("", "non-empty"), ("/etc/passwd", "absolute"), ("C:/x", "absolute"), ("a/../b", "'..'"),
    ("a//b", "empty"), ("./a", "'.'"), ("a\\b", "backslash"), ("a\nb", "control"),
    ("cafe\u0301", "NFC"), ("x" * 1025, "longer than"), (7, "non-empty string"),
])
def test_unsafe_paths_are_refused(name, message):
    with pytest.raises(UnsafeInputError, match=message):
        check_relpath(name)


def test_case_and_unicode_collisions_are_refused():
    check_no_collisions(["a.txt", "b.txt"])
    with pytest.raises(UnsafeInputError, match="collide"):
        check_no_collisions(["Readme.md", "README.md"])


def test_scan_reports_links_and_special_files_without_following_them(tmp_path):
    import os

    (tmp_path / "ok.txt").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "inner.txt").write_text("y")
    os.symlink("/etc", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    files, problems = scan_cube(tmp_path)
    assert files == ["dir/inner.txt", "ok.txt"]
    assert sorted(where for where, _ in problems) == ["fifo", "link"]
    with pytest.raises(UnsafeInputError):
        list_cube_files(tmp_path)


# --- the local Hub's store -----------------------------------------------------------------------

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


# --- diff ----------------------------------------------------------------------------------------

def test_diff_names_every_kind_of_change():
    old = make_lock()
    files = dict(old["files"])
    files.pop("config.json")
    files["notes.txt"] = {"sha256": SHA, "size": 2}
    files["activations/a.kv.safetensors"] = {"sha256": "ef" * 32, "size": 99}
    models = json.loads(json.dumps(old["models"]))
    models["act_mem"]["identity"]["dtype"] = "bfloat16"
    activations = {"a": dict(old["activations"]["a"], sha256="ef" * 32)}
    new = make_lock(files=files, models=models, activations=activations)
    result = diff_locks(old, new)
    assert result["files"] == {"added": ["notes.txt"], "removed": ["config.json"],
                               "changed": ["activations/a.kv.safetensors"]}
    assert result["models"] == {"act_mem": {"dtype": {"old": "float32", "new": "bfloat16"}}}
    assert result["activations"]["changed"] == ["a"] and result["same"] is False
    assert diff_locks(old, old)["same"] is True
