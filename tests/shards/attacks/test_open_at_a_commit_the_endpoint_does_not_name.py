"""``open("owner/cube@<40-hex commit>")`` asks for one commit: an endpoint whose answer names
another commit (X-Repo-Commit, on the lock's GET: a commit is not resolved by a HEAD) must not have the cube opened at that other commit (pin to
content: the commit the user named is the one read, or nothing is)."""

from __future__ import annotations

import pytest

import cubepack.hub._open as opening
from cubepack.errors import HubError


def test_an_endpoint_naming_another_commit_is_refused(hub, cube, remote, zoo, bundle,
                                                      monkeypatch):
    first = remote.push(hub, cube)
    other = bundle(3)
    cubepack_pack = __import__("cubepack").pack
    cubepack_pack(other, cube_id="me/other", model=str(zoo["a"]), shards=True)
    second = remote.push(hub, other)
    assert first != second
    original = opening._request

    def lying(client, repo_id, repo_type, revision, path, headers, **kwargs):
        response = original(client, repo_id, repo_type, revision, path, headers, **kwargs)
        response.headers["X-Repo-Commit"] = second  # main's, not the one asked for
        return response
    monkeypatch.setattr(opening, "_request", lying)
    with pytest.raises(HubError, match=first):
        remote.open(hub, f"me/cube@{first}")
