"""Ref names follow git's rules on the endpoint as in the client: a branch or tag that git,
the Hub or a later pull would refuse is refused when it is created (huggingface_hub's own
create_tag / create_branch over HTTP), and ``push --tag`` refuses it before any request."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from huggingface_hub import CommitOperationAdd
from huggingface_hub.utils import HfHubHTTPError

REPO = "ns/repo"
BAD = ["a..b", "x.lock", "-x", "a/.b", "a\tb", "a@{b", "HEAD", "x.", "a//b", "/a", "b/",
       "a\x7fb", "refs/tags/v1", "0123456789abcdef0123456789abcdef01234567"]


@pytest.fixture
def api(api):
    """The shared client, on a repo with one commit."""
    api.create_repo(REPO, repo_type="dataset")
    api.create_commit(REPO, [CommitOperationAdd(path_in_repo="a.txt", path_or_fileobj=b"a")],
                      commit_message="first", repo_type="dataset")
    return api


@pytest.mark.parametrize("kind", ["tag", "branch"])
def test_endpoint_refuses_names_git_refuses(api, kind):
    for name in BAD:
        with pytest.raises(HfHubHTTPError):
            if kind == "tag":
                api.create_tag(REPO, tag=name, repo_type="dataset")
            else:
                api.create_branch(REPO, branch=name, repo_type="dataset")
    refs = api.list_repo_refs(REPO, repo_type="dataset")
    assert [b.name for b in refs.branches] == ["main"] and refs.tags == []
    good = "release/v1.0-é"
    if kind == "tag":
        api.create_tag(REPO, tag=good, repo_type="dataset")
    else:
        api.create_branch(REPO, branch=good, repo_type="dataset")


@pytest.mark.parametrize("tag", ["refs/pr/1", "0123456789012345678901234567890123456789",
                                 os.fsdecode(b"v\xff")])
def test_push_tag_refused_before_any_request(hub, tmp_path, tag):
    """A tag the endpoint would refuse (or a pull could never resolve by name) exits 2 with
    no request made; argv bytes that are not UTF-8 included."""
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1")
    (tmp_path / "cube").mkdir()
    done = subprocess.run([sys.executable, "-m", "cubepack", "push", str(tmp_path / "cube"),
                           "me/cube", "--tag", tag, "--json"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert '"UsageError"' in done.stdout and "--tag" in done.stdout
    assert sum(hub.stats.requests.values()) == 0
