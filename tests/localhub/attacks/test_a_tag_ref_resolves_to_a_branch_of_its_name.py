"""Adversary (issue #38, item 4): `refs/tags/v1` resolves to the branch `v1`.

The promise (docs/reference/local-hub.md, What it serves): branches and tags, revisions resolved
as the Hub resolves them; cubepack/localhub/_ids.py: "a branch or tag name that git accepts
(optionally ``refs/heads/``- or ``refs/tags/``-prefixed)". In git and on the Hub a full ref name
names one ref: `refs/tags/v1` is the tag, `refs/heads/v1` the branch.

The attack: a team pins its consumers to `refs/tags/v1` (a release tag). Another token holder
creates a branch `v1` (git's rules allow it, and the endpoint takes it) at a commit of their
own, with other bytes in the file.

What happened: `Revision.names` tries the prefix-stripped name, and the store looks each name
up in the branches before the tags, so `refs/tags/v1` answers the branch's commit: the pinned
consumers download the other user's bytes. The converse too: `refs/heads/v2` with only a tag
`v2` answers the tag instead of RevisionNotFound.
"""

from __future__ import annotations

import pytest
from huggingface_hub import CommitOperationAdd, hf_hub_download
from huggingface_hub.utils import RevisionNotFoundError

from cubepack.testing.hub import InstrumentedHub

from hub_users import api_for

TOKEN = "writer"


@pytest.fixture
def hub(tmp_path):
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN]) as server:
        yield server


def commit(api, data):
    return api.create_commit("team/cube", [CommitOperationAdd("weights.txt", data)],
                             commit_message="c", repo_type="dataset").oid


def download(hub, revision, tmp_path):
    return open(hf_hub_download("team/cube", "weights.txt", repo_type="dataset",
                                revision=revision, endpoint=hub.url, token=TOKEN,
                                cache_dir=tmp_path / revision.replace("/", "_")), "rb").read()


def test_refs_tags_names_the_tag_not_a_branch_of_its_name(hub, tmp_path, monkeypatch):
    api = api_for(hub.url, TOKEN, monkeypatch)
    api.create_repo("team/cube", repo_type="dataset")
    release = commit(api, b"the release\n")
    api.create_tag("team/cube", tag="v1", revision=release, repo_type="dataset")
    other = commit(api, b"someone else's bytes\n")
    api.create_branch("team/cube", branch="v1", revision=other, repo_type="dataset")
    assert download(hub, "refs/tags/v1", tmp_path) == b"the release\n"


def test_refs_heads_does_not_name_a_tag(hub, tmp_path, monkeypatch):
    api = api_for(hub.url, TOKEN, monkeypatch)
    api.create_repo("team/cube", repo_type="dataset")
    api.create_tag("team/cube", tag="v2", revision=commit(api, b"tagged\n"), repo_type="dataset")
    with pytest.raises(RevisionNotFoundError):
        download(hub, "refs/heads/v2", tmp_path)
