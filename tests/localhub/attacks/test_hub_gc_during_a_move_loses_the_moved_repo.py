"""Adversary (issue #38, item 1): `cubepack hub gc` racing a repo move deletes the moved repo's
files.

The promise (docs/reference/local-hub.md, "What no repo holds is removed"): "`cubepack hub gc
ROOT` removes every blob no commit of any repo names [...] Both are safe while the server runs,
`gc` from another process too: it holds the root's lock (`blobs/.lock`) while commits and
uploads hold it shared." And the store's module says a collection "sees either the whole step or
none of it".

The attack: one user moves (renames) a repo, `zz/cube` -> `aa/cube`, while the operator runs
`hub gc` on the root. A move is `os.replace` of the repo's folder, and it takes only the repos'
own locks, not the root's: gc lists the namespaces (`zz` only: `aa` is not there yet), the move
lands, gc lists `zz` (empty now). The repo is in neither listing, so no commit names its blobs.
The timing is made certain by running the move between gc's two listings (the window is real;
the test only chooses when in it the move lands); gc runs with its own lock, as another process
does (`flock` on its own descriptor).

What happened: the move answers 200 during the collection, gc removes the repo's blobs, and the
moved repo's file answers 500 (its blob is gone): data loss, for a repo nobody deleted.
"""

from __future__ import annotations

import json
import threading

from huggingface_hub import CommitOperationAdd

from cubepack.localhub import _objects
from cubepack.localhub._objects import collect_garbage
from cubepack.testing.hub import InstrumentedHub

from hub_users import api_for, raw

TOKEN = "writer"
DATA = b"the only copy of a team's tensors " * 4000


def test_a_repo_moved_during_hub_gc_keeps_its_files(tmp_path, monkeypatch):
    root = tmp_path / "root"
    with InstrumentedHub(root, tokens=[TOKEN]) as hub:
        api = api_for(hub.url, TOKEN, monkeypatch)
        api.create_repo("zz/cube", repo_type="dataset")
        api.create_commit("zz/cube", [CommitOperationAdd("memory.safetensors", DATA)],
                          commit_message="push", repo_type="dataset")
        moved: dict[str, object] = {}

        def move():
            moved["answer"] = raw(hub.url, "POST", "/api/repos/move", json.dumps(
                {"fromRepo": "zz/cube", "toRepo": "aa/cube", "type": "dataset"}).encode(),
                TOKEN)

        real_listing, gc_thread = _objects._listing, []

        def listing(folder):
            names = real_listing(folder)
            if threading.current_thread() in gc_thread and folder == root / "repos" / "datasets" \
                    and "answer" not in moved:
                mover = threading.Thread(target=move)
                mover.start()
                mover.join(timeout=5)  # a move that waits for the collection is the fix
            return names

        monkeypatch.setattr(_objects, "_listing", listing)
        collected = {}
        collector = threading.Thread(target=lambda: collected.update(
            done=collect_garbage(root)))  # its own RootLock: as `hub gc` in another process
        gc_thread.append(collector)
        collector.start()
        collector.join(timeout=60)
        monkeypatch.setattr(_objects, "_listing", real_listing)
        for _ in range(100):  # a move that waited for the collection lands now
            if "answer" in moved:
                break
            threading.Event().wait(0.1)
        assert moved["answer"][0] == 200, moved
        status, data = raw(hub.url, "GET", "/datasets/aa/cube/resolve/main/memory.safetensors",
                           token=TOKEN)
        assert (status, data == DATA) == (200, True), \
            f"the moved repo's file is gone after gc ({collected}): {status} {data!r:.200}"
