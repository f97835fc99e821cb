"""Adversary (issue #38, round 2): a repo moved while the endpoint first reads the root's
holdings is missing from them; a later delete of another repo then removes a blob the moved
repo holds. Data loss.

The promise: docs/reference/local-hub.md, Several users: "What no repo holds is removed.
Deleting a repo removes the blobs no other repo holds"; "commits, uploads and moves (renames)
hold [the root's lock] shared" (round 1's fix: `hub gc` never lists the root between a move's
two halves). `Objects`' docstring: the holdings are "built on first use from every folder that
holds blobs [...] and kept by this process's commits, uploads, moves and deletes".

The attack: the holdings (`Objects._index`) are read lazily, on the first LFS batch, lfsFile
commit or delete after a start, listing the namespaces once, then each namespace's repos, under
the holdings' own guard only, not the root's lock held exclusively (a move holds it shared, as
the LFS batch that triggers the read does). A root with 8,000 small repos in namespace `mm`
(the read takes a while), and `zz/cube` and `dd/copy` both holding one LFS blob. Just after a
restart: an LFS batch starts the read; meanwhile `zz/cube` is moved to `aa/cube`. The read
listed the namespaces before `aa` existed and reaches `zz` after `cube` left it: the repo is
in neither place; `moved()` then finds nothing to relabel. Then `dd/copy` is deleted.

What happened (0.36 and 2.x; the read took 0.7-1 s, the move came at 0.3 s): the delete's
collection finds no other holder of the shared blob and removes it; `aa/cube`'s file answers
500 (FileNotFoundError): its bytes are gone from the root, and nothing brings them back. (The
window is the first read after a start, as long as that read takes on a large root.) The test
asks that the moved repo's file still download.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path

from envs import once
from hub_users import Served, raw

# The endpoint's own code over raw HTTP or in process, no Hub client: the same in both
# environments (huggingface_hub only validates its ids, fixed valid ones here).
pytestmark = once

TOKEN = "writer"
FILLERS = 8000


def _create(url, namespace, name):
    assert raw(url, "POST", "/api/repos/create", json.dumps(
        {"name": name, "organization": namespace, "type": "dataset"}).encode(), TOKEN)[0] == 200


def _batch(url, repo, oid, size):
    status, answer = raw(url, "POST", f"/datasets/{repo}.git/info/lfs/objects/batch", json.dumps(
        {"operation": "upload", "transfers": ["basic"],
         "objects": [{"oid": oid, "size": size}]}).encode(), TOKEN,
        {"Content-Type": "application/vnd.git-lfs+json"})
    assert status == 200, answer
    return answer["objects"][0].get("actions", {})


def _push_lfs(url, repo, data, path="weights.bin"):
    oid = hashlib.sha256(data).hexdigest()
    actions = _batch(url, repo, oid, len(data))
    if "upload" in actions:
        href = actions["upload"]["href"]
        assert raw(url, "PUT", href[href.index("/lfs/"):], data)[0] == 200
    commit = "\n".join(json.dumps(line) for line in [
        {"key": "header", "value": {"summary": "add"}},
        {"key": "lfsFile", "value": {"path": path, "algo": "sha256", "oid": oid,
                                     "size": len(data)}}]).encode()
    status, answer = raw(url, "POST", f"/api/datasets/{repo}/commit/main", commit, TOKEN,
                         {"Content-Type": "application/x-ndjson"})
    assert status == 200, answer


def _open_under(pid, folder):
    """Whether process ``pid`` has a file or folder under ``folder`` open (/proc/PID/fd)."""
    prefix = f"{folder}/"
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            if os.readlink(fd).startswith(prefix):
                return True
    return False


def test_a_repo_moved_during_the_first_holdings_read_keeps_its_blobs(tmp_path):
    root = tmp_path / "root"
    data = os.urandom(256 * 1024)
    only_the_copys = os.urandom(1024)  # a blob the delete removes: its collection has run
    with Served(root, "--token", TOKEN) as served:
        for namespace, name in (("zz", "cube"), ("dd", "copy"), ("mm", "filler")):
            _create(served.url, namespace, name)
        _push_lfs(served.url, "zz/cube", data)
        _push_lfs(served.url, "dd/copy", data)
        _push_lfs(served.url, "dd/copy", only_the_copys, "notes.bin")
    fillers = root / "repos" / "datasets" / "mm"
    for index in range(FILLERS):  # a root of many repos: reading its holdings takes a while
        shutil.copytree(fillers / "filler", fillers / f"filler{index:04d}",
                        copy_function=os.link)
    with Served(root, "--token", TOKEN) as served:
        read_took: list[float] = []

        def first_read():  # the first LFS batch after the start reads the holdings
            started = time.monotonic()
            # (about a stored blob: only then does the batch ask whose it is)
            _batch(served.url, "mm/filler", hashlib.sha256(data).hexdigest(), len(data))
            read_took.append(time.monotonic() - started)

        # The repo ids' index first (read by any request), so the batch reads holdings only.
        assert raw(served.url, "GET", "/api/datasets/mm/filler", token=TOKEN)[0] == 200
        reader = threading.Thread(target=first_read)
        reader.start()
        # The move comes while the read is in mm/ (after it listed the namespaces, before zz/).
        while not _open_under(served.process.pid, fillers) and reader.is_alive():
            time.sleep(0.001)
        assert reader.is_alive(), "the first holdings read ended before the move could be sent"
        moved = raw(served.url, "POST", "/api/repos/move", json.dumps(
            {"fromRepo": "zz/cube", "toRepo": "aa/cube", "type": "dataset"}).encode(), TOKEN)
        reader.join(120)
        assert moved[0] == 200, moved
        assert raw(served.url, "DELETE", "/api/repos/delete", json.dumps(
            {"name": "copy", "organization": "dd", "type": "dataset"}).encode(), TOKEN)[0] == 200
        # The delete's collection ran (at once, or at the root's first idle moment): the copy's
        # own blob is gone; a commit, which holds the root's lock shared, waits for the rest.
        gone = root / "blobs" / hashlib.sha256(only_the_copys).hexdigest()
        deadline = time.monotonic() + 60
        while gone.exists():
            assert time.monotonic() < deadline, "the delete's collection never ran"
            time.sleep(0.01)
        assert raw(served.url, "POST", "/api/datasets/mm/filler/commit/main", b"\n".join(
            json.dumps(line).encode() for line in [
                {"key": "header", "value": {"summary": "after"}},
                {"key": "file", "value": {"path": "after.txt", "content": "YQ==",
                                          "encoding": "base64"}}]), TOKEN,
            {"Content-Type": "application/x-ndjson"})[0] == 200
        status, body = raw(served.url, "GET", "/datasets/aa/cube/resolve/main/weights.bin",
                           token=TOKEN)
    assert (status, body == data) == (200, True), (
        f"the repo moved during the first holdings read ({read_took[0]:.2f} s) lost its file "
        f"when another repo holding the same blob was deleted: {status} {body!r:.120}; blob "
        f"on disk: {(root / 'blobs' / hashlib.sha256(data).hexdigest()).exists()}")
