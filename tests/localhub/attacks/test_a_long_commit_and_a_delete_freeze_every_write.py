"""Adversary (issue #38, items 1 and 3): one slow commit plus any repo's delete freeze every
commit, upload and create of the endpoint until the slow commit ends; and a commit's work is
unbounded (each `deletedFolder` scans the whole tree).

The promise: docs/reference/local-hub.md, "Deleting a repo removes the blobs no other repo
holds [...] safe while the server runs: it holds the root's lock (`blobs/.lock`) while commits
and uploads hold it shared"; Limits: "so one client cannot take the endpoint"; issue #38:
"Bounded resources [...] a normal request is answered within its usual time".

The attack: a token holder commits to a repo of 5,000 files a body of 20,000 `deletedFolder`
operations naming folders that do not exist (1.1 MB of a 64 MiB limit): `_apply` scans every
path of the tree for each, 10^8 prefix tests, holding the repo's lock and the root's lock
shared. Meanwhile anyone deletes a repo (their own): the delete's collection asks for the root's
lock exclusively, and the lock lets no new shared holder in while a writer waits. Then a normal
one-file commit to a third repo.

What happened: the normal commit (and the delete) wait for the slow commit to end: ~15 s here;
a 64 MiB body (a million operations) on a repo of 50,000 files holds every write of the
endpoint for hours, from one request.
"""

from __future__ import annotations

import base64
import json
import threading
import time

from cubepack.testing.hub import InstrumentedHub

from envs import once
from hub_users import raw

# The endpoint's own code over raw HTTP or in process, no Hub client: the same in both
# environments (huggingface_hub only validates its ids, fixed valid ones here).
pytestmark = once

TOKEN = "writer"
TREE = 5_000
OPERATIONS = 20_000
ANSWERED_WITHIN = 5.0


def commit(url, repo, operations):
    lines = [{"key": "header", "value": {"summary": "c"}}, *operations]
    return raw(url, "POST", f"/api/datasets/{repo}/commit/main",
               b"\n".join(json.dumps(line).encode() for line in lines), TOKEN,
               {"Content-Type": "application/x-ndjson"})


def create(url, name):
    assert raw(url, "POST", "/api/repos/create", json.dumps(
        {"name": name, "organization": "ns", "type": "dataset"}).encode(), TOKEN)[0] == 200


def test_a_normal_commit_is_answered_while_a_slow_commit_and_a_delete_run(tmp_path,
                                                                         monkeypatch):
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN]) as hub:
        for name in ("big", "gone", "other"):
            create(hub.url, name)
        one = base64.b64encode(b"x").decode()
        assert commit(hub.url, "ns/big", [
            {"key": "file", "value": {"path": f"f/{i}.txt", "content": one,
                                      "encoding": "base64"}} for i in range(TREE)])[0] == 200
        answers = {}

        def slow():
            answers["slow"] = commit(hub.url, "ns/big", [
                {"key": "deletedFolder", "value": {"path": f"nope{i}/"}}
                for i in range(OPERATIONS)])[0]

        def delete():
            answers["delete"] = raw(hub.url, "DELETE", "/api/repos/delete", json.dumps(
                {"name": "gone", "organization": "ns", "type": "dataset"}).encode(), TOKEN)[0]

        # Events, not sleeps: the store's own calls, seen from inside this process's endpoint.
        applying, deleting = threading.Event(), threading.Event()
        apply, collect = hub.store._apply, hub.store._objects.collect

        def applied(*args, **kwargs):
            applying.set()
            return apply(*args, **kwargs)

        def collecting(*args, **kwargs):  # the delete's collection, under the root's lock
            deleting.set()
            return collect(*args, **kwargs)

        monkeypatch.setattr(hub.store, "_apply", applied)
        monkeypatch.setattr(hub.store._objects, "collect", collecting)
        slow_thread = threading.Thread(target=slow)
        slow_thread.start()
        # The slow commit holds its locks: it has its body and is applying it.
        assert applying.wait(120), f"the slow commit applied nothing: {answers}"
        delete_thread = threading.Thread(target=delete)
        delete_thread.start()
        assert deleting.wait(120), f"the delete never collected: {answers}"
        started = time.monotonic()
        status = commit(hub.url, "ns/other", [{"key": "file", "value": {
            "path": "normal.txt", "content": one, "encoding": "base64"}}])[0]
        took = time.monotonic() - started
        slow_thread.join(600)
        delete_thread.join(600)
    assert (status, took < ANSWERED_WITHIN) == (200, True), (
        f"a one-file commit to another repo took {took:.1f} s behind a commit of "
        f"{OPERATIONS:,} deletedFolder operations and a delete ({answers})")
