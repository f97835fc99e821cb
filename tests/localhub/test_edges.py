"""The endpoint's edge: every id in a request is parsed before it is used, and every body is
checked for shape and type, so a hostile request gets a 4xx with a sentence, never a 500 and
never another repo's files."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

from cubepack.localhub._store import AddFile, repo_ref

TOKEN = "writer"


def request(hub, method, path, body=b"", token=TOKEN, headers=None):
    """One raw request: (status, headers, body parsed as JSON when it is JSON, else bytes)."""
    host = urlsplit(hub.url)
    connection = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
    try:
        sent = {"Authorization": f"Bearer {token}"} if token else {}
        connection.request(method, path, body=body, headers={**sent, **(headers or {})})
        response = connection.getresponse()
        data = response.read()
        if response.getheader("Content-Type", "").startswith("application/json"):
            data = json.loads(data)
        return response.status, dict(response.getheaders()), data
    finally:
        connection.close()


def ndjson(*lines):
    return b"\n".join(json.dumps(line).encode() for line in lines)


def put_file(hub, repo, path, data):
    """Commit one regular file to ``repo``'s main through the store (no client needed)."""
    return hub.store.apply_commit(repo, "main", title="add", message="", parent=None,
                                  operations=[AddFile(path, data)])


def test_a_parent_commit_cannot_name_another_repos_commit(hub):
    """parentCommit once joined into a path: ``../../../victim/secret/commits/<sha>`` based a
    public pull request on a private repo's commit, readable without a token."""
    victim, public = repo_ref("datasets", "victim", "secret"), repo_ref("datasets", "ns", "repo")
    hub.store.create(victim, private=True)
    hub.store.create(public, private=False)
    secret = put_file(hub, victim, "secret.txt", b"the secret")
    for create_pr in ("?create_pr=1", ""):
        status, _, answer = request(hub, "POST", f"/api/datasets/ns/repo/commit/main{create_pr}",
                                    ndjson({"key": "header", "value": {
                                        "summary": "steal",
                                        "parentCommit": f"../../../victim/secret/commits/{secret}"}}))
        assert 400 <= status < 500 and "parentCommit" in answer["error"], answer
    status, _, data = request(hub, "GET", "/datasets/ns/repo/resolve/refs%2Fpr%2F1/secret.txt",
                              token=None)
    assert status == 404 and b"the secret" not in json.dumps(data).encode()
    assert hub.store.refs(public)["pulls"] == {}
