"""Adversary (issue #38, item 1): deleting a repo removes the blobs of a repo folder the endpoint
no longer serves.

The promise (docs/reference/local-hub.md, "What no repo holds is removed"): "Deleting a repo
removes the blobs no other repo holds [...] Repo folders whose id the client refuses (made
before the endpoint followed its rule) are not served, and `gc` keeps what they hold." And
`hub serve` tells the operator of such a folder: "not served; rename them to serve them".

The attack: a root from before the id rule holds a repo under an id the client now refuses
(`ns/a..b`, as tests/localhub/test_several_users.py makes one). Another user pushes the same
bytes to a repo of their own (the same weights, a copy of a file), then deletes their repo.

What happened: `hub gc` keeps the unserved folder's blobs (it reads every folder), but the
delete collects by the running server's holdings, which leave unserved folders out: the shared
blob is removed. The operator renames the folder as told and serves it: its file is gone (500).
"""

from __future__ import annotations

from huggingface_hub import CommitOperationAdd

from cubepack.testing.hub import InstrumentedHub

from hub_users import api_for, raw

TOKEN = "writer"
DATA = b"weights a legacy repo and a new one share " * 3000


def test_deleting_a_repo_keeps_what_an_unserved_folder_holds(tmp_path, monkeypatch):
    root = tmp_path / "root"
    with InstrumentedHub(root, tokens=[TOKEN]) as hub:
        api = api_for(hub.url, TOKEN, monkeypatch)
        api.create_repo("ns/old", repo_type="dataset")
        api.create_commit("ns/old", [CommitOperationAdd("weights.safetensors", DATA)],
                          commit_message="legacy", repo_type="dataset")
    folder = root / "repos" / "datasets" / "ns"
    (folder / "old").rename(folder / "a..b")  # an id made before the endpoint's rule
    with InstrumentedHub(root, tokens=[TOKEN]) as hub:
        assert hub.store.unserved() == [folder / "a..b"]
        api = api_for(hub.url, TOKEN, monkeypatch)
        api.create_repo("ns/copy", repo_type="dataset")
        api.create_commit("ns/copy", [CommitOperationAdd("copy.safetensors", DATA)],
                          commit_message="same bytes", repo_type="dataset")
        api.delete_repo("ns/copy", repo_type="dataset")
    (folder / "a..b").rename(folder / "renamed")  # as hub serve says: rename it to serve it
    with InstrumentedHub(root, tokens=[TOKEN]) as hub:
        status, data = raw(hub.url, "GET",
                           "/datasets/ns/renamed/resolve/main/weights.safetensors", token=TOKEN)
        assert (status, data == DATA) == (200, True), \
            f"the unserved folder's file was removed by another repo's delete: {status} {data!r:.120}"
