"""The endpoint as a Hub for several users (issue #38): a repo reads only what it holds, and a
token means something.

Blobs are stored once by sha256 for all repos. A commit once could name any stored blob by its
digest alone (an ``lfsFile`` operation, nothing uploaded), so a public repo served another
repo's private bytes without a token, a deleted repo's blobs stayed readable forever, and the
LFS batch answer told anyone which blobs existed anywhere; a server started without tokens
served private repos to ``Authorization: Bearer anything``. The client refuses to send most of
these requests (it uploads what it commits), so they go as raw HTTP; what the client does send
goes through it.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import select
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import pytest
from huggingface_hub import CommitOperationAdd, HfApi
from huggingface_hub import constants as hub_constants
from huggingface_hub.utils import HfHubHTTPError, RepositoryNotFoundError

from cubepack.localhub._server import ROUTES
from cubepack.testing.hub import InstrumentedHub

TOKEN = "writer"
#: The private repo's files: a regular (git) file and an LFS file, as a cube has both (its
#: lock is a regular file that lists every other file's sha256).
SECRET_FILES = {"cubepack.lock": b'{"files": "the private lock"}\n',
                "memory.safetensors": b"the private tensors " * 4000}
DIGESTS = {path: hashlib.sha256(data).hexdigest() for path, data in SECRET_FILES.items()}


def api_for(hub, token, monkeypatch):
    monkeypatch.setattr(hub_constants, "HF_HUB_DISABLE_XET", True)
    import huggingface_hub

    if huggingface_hub.__version__.startswith("0."):  # 0.36 parses returned URLs with it
        monkeypatch.setattr(hub_constants, "ENDPOINT", hub.url)
    return HfApi(endpoint=hub.url, token=token)


def raw(hub, method, path, body=b"", token=None, headers=None):
    """(status, parsed JSON or bytes) of one raw request."""
    address = urlsplit(hub.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    sent = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        connection.request(method, path, body=body, headers={**sent, **(headers or {})})
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    if response.getheader("Content-Type", "").startswith(("application/json",
                                                           "application/vnd.git-lfs+json")):
        data = json.loads(data) if data else None
    return response.status, data


def link(hub, repo, path, oid, token=None, create_pr=False):
    """Commit an ``lfsFile`` operation naming ``oid`` alone (no size, nothing uploaded)."""
    body = b"\n".join(json.dumps(line).encode() for line in (
        {"key": "header", "value": {"summary": "link"}},
        {"key": "lfsFile", "value": {"path": path, "algo": "sha256", "oid": oid}}))
    query = "?create_pr=1" if create_pr else ""
    return raw(hub, "POST", f"/api/datasets/{repo}/commit/main{query}", body, token,
               {"Content-Type": "application/x-ndjson"})


def push_secret(api, repo="victim/secret"):
    api.create_repo(repo, repo_type="dataset", private=True)
    api.create_commit(repo, [CommitOperationAdd(path, data) for path, data in SECRET_FILES.items()],
                      commit_message="secret", repo_type="dataset")


def leaked(hub, repo, path, token=None):
    """The bytes ``repo`` serves at ``path``, or None when it serves nothing there."""
    status, data = raw(hub, "GET", f"/datasets/{repo}/resolve/main/{path}", token=token)
    return data if status == 200 else None


@pytest.fixture
def root(tmp_path):
    return tmp_path / "root"


@pytest.fixture
def tokened(root):
    with InstrumentedHub(root, tokens=[TOKEN]) as server:
        yield server


# --- a repo reads only what it holds -------------------------------------------------------------
@pytest.mark.parametrize("create_pr", [False, True])
@pytest.mark.parametrize("identity", [None, "made-up"])
def test_a_commit_cannot_link_a_blob_its_committer_cannot_read(root, monkeypatch, identity,
                                                               create_pr):
    """A root served with tokens holds a private repo; served again without them, anyone may
    write, and nobody reads the private repo. Naming its blobs' digests in a public repo's
    commit is refused as a commit naming an object never uploaded; nothing is served."""
    with InstrumentedHub(root, tokens=[TOKEN]) as hub:
        push_secret(api_for(hub, TOKEN, monkeypatch))
    with InstrumentedHub(root) as hub:
        api = api_for(hub, identity, monkeypatch)
        api.create_repo("mallory/public", repo_type="dataset")
        for path, oid in DIGESTS.items():
            status, answer = link(hub, "mallory/public", path, oid, identity, create_pr)
            assert status == 400 and "never uploaded" in answer["error"], (path, answer)
            revision = "refs%2Fpr%2F1" if create_pr else "main"
            assert raw(hub, "GET", f"/datasets/mallory/public/resolve/{revision}/{path}")[0] \
                == 404
        missing = "0" * 64  # a digest stored nowhere: refused in the same words
        assert link(hub, "mallory/public", "x", missing, identity, create_pr)[1]["error"] \
            .replace(missing, "OID") == answer["error"].replace(oid, "OID").replace(path, "x")


def test_a_token_holder_may_link_what_they_can_read(tokened, monkeypatch):
    """The rule's other side: a committer who can read a repo whose history holds a blob may
    name it (every token reads every repo here: it copies nothing they could not download)."""
    push_secret(api_for(tokened, TOKEN, monkeypatch))
    api = api_for(tokened, TOKEN, monkeypatch)
    api.create_repo("ns/copy", repo_type="dataset")
    for path, oid in DIGESTS.items():
        assert link(tokened, "ns/copy", path, oid, TOKEN)[0] == 200
        assert leaked(tokened, "ns/copy", path, TOKEN) == SECRET_FILES[path]


def test_a_deleted_repos_blobs_are_removed_and_unlinkable(tokened, monkeypatch, root):
    api = api_for(tokened, TOKEN, monkeypatch)
    push_secret(api)
    api.create_repo("ns/public", repo_type="dataset")
    api.delete_repo("victim/secret", repo_type="dataset")
    for path, oid in DIGESTS.items():
        status, answer = link(tokened, "ns/public", path, oid, TOKEN)
        assert status == 400 and "never uploaded" in answer["error"]
        assert leaked(tokened, "ns/public", path) is None
        assert not (root / "blobs" / oid).exists()


def test_the_lfs_batch_answers_for_its_repo_only(tokened, monkeypatch):
    """Another repo's object is not 'already there': the batch asks for the bytes (an upload
    proves the uploader has them), and the real client uploads them."""
    api = api_for(tokened, TOKEN, monkeypatch)
    push_secret(api)
    api.create_repo("ns/other", repo_type="dataset")
    oid, data = DIGESTS["memory.safetensors"], SECRET_FILES["memory.safetensors"]
    body = json.dumps({"operation": "upload", "transfers": ["basic"], "hash_algo": "sha256",
                       "objects": [{"oid": oid, "size": len(data)}]}).encode()
    for repo, present in (("victim/secret", True), ("ns/other", False)):
        status, answer = raw(tokened, "POST", f"/datasets/{repo}.git/info/lfs/objects/batch",
                             body, TOKEN, {"Content-Type": "application/vnd.git-lfs+json"})
        assert status == 200 and ("actions" not in answer["objects"][0]) == present, answer
    tokened.stats.reset()
    api.create_commit("ns/other", [CommitOperationAdd("copy.safetensors", data)],
                      commit_message="same bytes", repo_type="dataset")
    assert tokened.stats.uploaded_bytes[f"lfs:{oid}"] == len(data)
    assert leaked(tokened, "ns/other", "copy.safetensors", TOKEN) == data


def test_an_upload_is_for_the_repo_it_was_signed_for(tokened, monkeypatch):
    """An upload URL names its repo: uploaded for one repo, the object is not another's."""
    api = api_for(tokened, TOKEN, monkeypatch)
    for repo in ("ns/one", "ns/two"):
        api.create_repo(repo, repo_type="dataset")
    data = b"uploaded for one " * 5000
    oid = hashlib.sha256(data).hexdigest()
    body = json.dumps({"operation": "upload", "objects": [{"oid": oid, "size": len(data)}]})
    status, answer = raw(tokened, "POST", "/datasets/ns/one.git/info/lfs/objects/batch",
                         body.encode(), TOKEN)
    upload = urlsplit(answer["objects"][0]["actions"]["upload"]["href"])
    assert raw(tokened, "PUT", f"{upload.path}?{upload.query}", data)[0] == 200
    assert link(tokened, "ns/two", "stolen.bin", oid, TOKEN)[1]["error"].endswith(
        "was never uploaded.")
    assert link(tokened, "ns/one", "mine.bin", oid, TOKEN)[0] == 200
    two = upload.path.replace("/ns/one/", "/ns/two/")  # the signature covers the repo
    assert two != upload.path
    assert raw(tokened, "PUT", f"{two}?{upload.query}", data)[0] == 403


# --- removal of what no repo holds ---------------------------------------------------------------
def run_gc(root, *args):
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    done = subprocess.run([sys.executable, "-m", "cubepack", "hub", "gc", str(root), "--json",
                           *args], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_hub_gc_removes_what_no_repo_holds_while_the_server_runs(tokened, monkeypatch, root):
    api = api_for(tokened, TOKEN, monkeypatch)
    push_secret(api)
    kept = b"kept by a commit " * 5000
    api.create_repo("ns/kept", repo_type="dataset")
    api.create_commit("ns/kept", [CommitOperationAdd("k.bin", kept)], commit_message="k",
                      repo_type="dataset")
    stray = root / "blobs" / hashlib.sha256(b"stray").hexdigest()
    stray.write_bytes(b"stray")  # a blob no commit and no upload names
    report = run_gc(root)
    assert report["removed"] == 1 and not stray.exists()
    for oid in (*DIGESTS.values(), hashlib.sha256(kept).hexdigest()):
        assert (root / "blobs" / oid).exists()
    assert leaked(tokened, "ns/kept", "k.bin", TOKEN) == kept


def test_hub_gc_keeps_a_fresh_upload_and_removes_an_abandoned_one(tokened, monkeypatch, root):
    """An object uploaded for a repo but not committed yet belongs to a push in progress; one
    older than a day was abandoned."""
    api_for(tokened, TOKEN, monkeypatch).create_repo("ns/push", repo_type="dataset")
    uploaded = {}
    for name in ("fresh", "abandoned"):
        data = name.encode() * 20000
        oid = hashlib.sha256(data).hexdigest()
        body = json.dumps({"operation": "upload", "objects": [{"oid": oid, "size": len(data)}]})
        answer = raw(tokened, "POST", "/datasets/ns/push.git/info/lfs/objects/batch",
                     body.encode(), TOKEN)[1]
        upload = urlsplit(answer["objects"][0]["actions"]["upload"]["href"])
        assert raw(tokened, "PUT", f"{upload.path}?{upload.query}", data)[0] == 200
        uploaded[name] = oid
    records = list(root.rglob(f"uploads/{uploaded['abandoned']}"))
    assert len(records) == 1
    os.utime(records[0], (0, 0))  # uploaded in 1970: its push is long over
    report = run_gc(root)
    assert report["removed"] == 1 and report["expired_uploads"] == 1
    assert (root / "blobs" / uploaded["fresh"]).exists()
    assert not (root / "blobs" / uploaded["abandoned"]).exists()
    assert link(tokened, "ns/push", "fresh.bin", uploaded["fresh"], TOKEN)[0] == 200


def push_raw(hub, repo, files):
    """A push as the client makes it (create, LFS batch, uploads, commit), in raw requests: the
    clients' progress bars are not safe in threads under 0.36."""
    namespace, name = repo.split("/")
    status, _ = raw(hub, "POST", "/api/repos/create", json.dumps(
        {"name": name, "organization": namespace, "type": "dataset"}).encode(), TOKEN)
    assert status == 200
    objects = [{"oid": hashlib.sha256(data).hexdigest(), "size": len(data)}
               for data in files.values()]
    answer = raw(hub, "POST", f"/datasets/{repo}.git/info/lfs/objects/batch", json.dumps(
        {"operation": "upload", "objects": objects}).encode(), TOKEN)[1]
    for entry, data in zip(answer["objects"], files.values()):
        if "actions" in entry:
            upload = urlsplit(entry["actions"]["upload"]["href"])
            assert raw(hub, "PUT", f"{upload.path}?{upload.query}", data)[0] == 200
    lines = [{"key": "header", "value": {"summary": "push"}}] + [
        {"key": "lfsFile", "value": {"path": path, "algo": "sha256", "oid": item["oid"],
                                     "size": item["size"]}}
        for path, item in zip(files, objects)]
    status, answer = raw(hub, "POST", f"/api/datasets/{repo}/commit/main",
                         b"\n".join(json.dumps(line).encode() for line in lines), TOKEN)
    assert status == 200, answer


def test_removal_races_no_commit_or_upload(tokened, root):
    """Pushes, deletes and collections at once: afterwards every commit of every repo names
    only blobs that are there, and each push that was answered is readable whole."""
    shared = b"in every repo " * 6000  # one blob, named by repos being created and deleted
    errors, pushed = [], []

    def pusher(index):
        try:
            for round_ in range(4):
                repo = f"ns/r{index}-{round_}"
                own = f"{index}-{round_}".encode() * 9000
                push_raw(tokened, repo, {"shared.bin": shared, "own.bin": own})
                pushed.append((repo, own))
                if round_ % 2:
                    assert raw(tokened, "DELETE", "/api/repos/delete", json.dumps(
                        {"name": repo.split("/")[1], "organization": "ns",
                         "type": "dataset"}).encode(), TOKEN)[0] == 200
                    pushed.remove((repo, own))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=pusher, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    collections = 0
    while any(thread.is_alive() for thread in threads):
        tokened.store.collect_garbage()
        collections += 1
    for thread in threads:
        thread.join()
    assert not errors and collections
    for repo, own in pushed:
        assert leaked(tokened, repo, "own.bin", TOKEN) == own
        assert leaked(tokened, repo, "shared.bin", TOKEN) == shared
    run_gc(root)
    for repo, own in pushed:
        assert leaked(tokened, repo, "shared.bin", TOKEN) == shared


def test_a_delete_waits_for_no_commit_and_holds_no_write_up(tokened):
    """A commit in progress holds the root's lock shared while it applies (held here, as a long
    commit holds it); a delete's clean-up once asked for it exclusively and, waiting, let no
    new commit or upload start. Now the delete and a commit to a third repo are answered while
    it is held; the deleted repo's blobs are removed once no commit holds it, and one another
    repo holds is kept (a blob a commit in progress uses is never removed under it: the race
    test below)."""
    shared, own = b"kept: another repo holds it " * 3000, b"only the deleted repo's " * 3000
    push_raw(tokened, "ns/gone", {"shared.bin": shared, "own.bin": own})
    push_raw(tokened, "ns/keeper", {"shared.bin": shared})
    push_raw(tokened, "ns/other", {"a.bin": b"a" * 100})
    held, release = threading.Event(), threading.Event()

    def long_commit():
        with tokened.store._objects.lock.shared():
            held.set()
            release.wait(120)

    holder = threading.Thread(target=long_commit)
    holder.start()
    try:
        assert held.wait(60)
        answers = {}
        deleter = threading.Thread(target=lambda: answers.update(delete=raw(
            tokened, "DELETE", "/api/repos/delete", json.dumps(
                {"name": "gone", "organization": "ns", "type": "dataset"}).encode(), TOKEN)[0]))
        deleter.start()
        deleter.join(20)
        committer = threading.Thread(target=lambda: answers.update(commit=push_raw(
            tokened, "ns/third", {"b.bin": b"b" * 100}) or 200))
        committer.start()
        committer.join(20)
        assert answers == {"delete": 200, "commit": 200}, answers
        assert (tokened.store.root / "blobs" / hashlib.sha256(own).hexdigest()).exists()
    finally:
        release.set()
        holder.join()
    deadline = time.monotonic() + 20  # removed at the first moment without holders
    while (tokened.store.root / "blobs" / hashlib.sha256(own).hexdigest()).exists():
        assert time.monotonic() < deadline, "the deleted repo's blob was never removed"
        time.sleep(0.05)
    assert leaked(tokened, "ns/keeper", "shared.bin", TOKEN) == shared


# --- authentication that means something ---------------------------------------------------------
READS = [route for route in ROUTES if route.repo == "read" and "GET" in route.methods]


def test_a_made_up_token_reads_no_more_than_no_token(root, monkeypatch):
    """On a server started without tokens, every read route of a private repo answers a made-up
    bearer token exactly as it answers no token: as a repo that is not there."""
    with InstrumentedHub(root, tokens=[TOKEN]) as hub:
        push_secret(api_for(hub, TOKEN, monkeypatch))
    with InstrumentedHub(root) as hub:
        ids = {"kind": "datasets", "datasets": "datasets", "namespace": "victim",
               "name": "secret", "revision": "main", "path": "cubepack.lock", "num": "1",
               "xet": "xet-read-token"}
        for route in READS:
            path = route.path(**ids)
            answers = {token: raw(hub, "GET", path, token=token)
                       for token in (None, "anything", TOKEN)}
            assert len({json.dumps(answer, default=repr) for answer in answers.values()}) == 1, \
                (route.template, answers)
            status, data = answers["anything"]
            assert status in (401, 404) and SECRET_FILES["cubepack.lock"] not in json.dumps(
                data, default=repr).encode()
        with pytest.raises(RepositoryNotFoundError):
            api_for(hub, "anything", monkeypatch).repo_info("victim/secret", repo_type="dataset")


def test_a_server_without_tokens_refuses_to_make_a_repo_private(root, monkeypatch):
    with InstrumentedHub(root) as hub:
        api = api_for(hub, None, monkeypatch)
        with pytest.raises(HfHubHTTPError) as created:
            api.create_repo("ns/private", repo_type="dataset", private=True)
        assert "--token" in str(created.value) and created.value.response.status_code == 403
        api.create_repo("ns/public", repo_type="dataset")
        with pytest.raises(HfHubHTTPError) as settings:
            api.update_repo_settings("ns/public", private=True, repo_type="dataset")
        assert "--token" in str(settings.value)
        assert api.repo_info("ns/public", repo_type="dataset").private is False
        assert not api.repo_exists("ns/private", repo_type="dataset")


def test_hub_serve_without_tokens_says_private_repos_are_not_served(root, monkeypatch):
    with InstrumentedHub(root, tokens=[TOKEN]) as hub:
        push_secret(api_for(hub, TOKEN, monkeypatch))
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    server = subprocess.Popen([sys.executable, "-m", "cubepack", "hub", "serve", "--root",
                               str(root), "--port", "0"], stdout=subprocess.PIPE, env=env)
    said = b""
    try:  # what it says at start, until it names private repos or says nothing for 30 s
        while b"private" not in said and select.select([server.stdout], [], [], 30)[0]:
            piece = os.read(server.stdout.fileno(), 4096)
            if not piece:
                break
            said += piece
    finally:
        server.terminate()
        server.wait(timeout=60)
    said = said.decode()
    assert "1 private repo" in said and "not served" in said and "--token" in said


def test_hub_gc_keeps_what_a_repo_folder_the_endpoint_no_longer_serves_holds(tokened, root,
                                                                             monkeypatch):
    """A repo made under an id the client refuses (before the endpoint followed its rule) is
    not served, but gc keeps its blobs: a rule that tightened loses no data."""
    api = api_for(tokened, TOKEN, monkeypatch)
    push_secret(api, "ns/old")
    folder = root / "repos" / "datasets" / "ns"
    (folder / "old").rename(folder / "a..b")
    assert run_gc(root)["removed"] == 0
    for oid in DIGESTS.values():
        assert (root / "blobs" / oid).exists()


def test_a_private_repo_is_401_and_a_missing_one_404_without_a_token(tokened, monkeypatch):
    """What the endpoint does not hide (local-hub.md says so): whether an id exists."""
    push_secret(api_for(tokened, TOKEN, monkeypatch))
    assert raw(tokened, "GET", "/api/datasets/victim/secret")[0] == 401
    assert raw(tokened, "GET", "/api/datasets/victim/nothing")[0] == 404


def test_an_upload_record_survives_a_restart(root, monkeypatch):
    """Uploaded for a repo, then the server restarts before the commit: the object is still the
    repo's (a push resumed after a restart needs no second upload)."""
    data = b"uploaded before a restart " * 4000
    oid = hashlib.sha256(data).hexdigest()
    with InstrumentedHub(root, tokens=[TOKEN]) as hub:
        api_for(hub, TOKEN, monkeypatch).create_repo("ns/push", repo_type="dataset")
        body = json.dumps({"operation": "upload", "objects": [{"oid": oid, "size": len(data)}]})
        answer = raw(hub, "POST", "/datasets/ns/push.git/info/lfs/objects/batch",
                     body.encode(), TOKEN)[1]
        upload = urlsplit(answer["objects"][0]["actions"]["upload"]["href"])
        assert raw(hub, "PUT", f"{upload.path}?{upload.query}", data)[0] == 200
    with InstrumentedHub(root, tokens=[TOKEN]) as hub:
        answer = raw(hub, "POST", "/datasets/ns/push.git/info/lfs/objects/batch",
                     body.encode(), TOKEN)[1]
        assert "actions" not in answer["objects"][0]  # already the repo's
        assert link(hub, "ns/push", "data.bin", oid, TOKEN)[0] == 200
