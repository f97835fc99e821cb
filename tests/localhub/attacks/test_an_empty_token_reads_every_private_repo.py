"""Adversary (issue #38, item 2): an empty ``--token`` makes an empty bearer token a key.

The promise (docs/reference/local-hub.md, Access): "`--token` (repeatable) makes every write and
every read of a private repo carry one of the tokens", and "A made-up `Authorization: Bearer
anything` reads no more than no token does." docs/how-to/private-endpoint.md starts the server
with `--token "$TEAM_TOKEN"`.

The attack: the server is started as the docs show, with a second token from a variable that
happens to be unset (`--token "$TEAM_TOKEN" --token "$CI_TOKEN"`, CI_TOKEN empty). The team
pushes a private repo with the real token; a stranger sends `Authorization: Bearer ` (nothing
after it), which no client sends by accident and anyone can type.

What happened: `hub serve` takes `--token ""` without a word (it says nothing about an
unprotected endpoint either, since it has "tokens"), and the empty bearer token reads the
private repo's files (200, the private bytes), lists it, and writes to it (deletes it).

The fix is two locks: `hub serve` (and `LocalHub`) refuse an empty token at start, and an
empty bearer token matches nothing, even on an endpoint whose token set holds "" (set behind
the constructor's back here, as a later code path might). The first two tests attack both: the
command as the docs run it must refuse to start, and the endpoint with "" among its tokens must
answer an empty bearer token as it answers none.
"""

from __future__ import annotations

import json

import pytest
from huggingface_hub import CommitOperationAdd

from cubepack.testing.hub import InstrumentedHub

from hub_users import Served, api_for, raw

TEAM = "team-secret-token"
SECRET = b"the private lock of the team\n"


@pytest.fixture
def served(tmp_path):
    """The endpoint as the docs start it with an unset second token; `hub serve` refuses that,
    so the attack goes on against an endpoint whose tokens hold "" anyway."""
    try:
        started = Served(tmp_path / "root", "--token", TEAM, "--token", "")
    except AssertionError:  # refused to start: now the endpoint itself must never match ""
        with InstrumentedHub(tmp_path / "root", tokens=[TEAM]) as hub:
            hub.tokens.add("")
            yield hub
        return
    with started:
        yield started


def test_an_empty_bearer_token_reads_no_more_than_no_token(served, monkeypatch):
    api = api_for(served.url, TEAM, monkeypatch)
    api.create_repo("team/secret", repo_type="dataset", private=True)
    api.create_commit("team/secret", [CommitOperationAdd("cubepack.lock", SECRET)],
                      commit_message="secret", repo_type="dataset")
    path = "/datasets/team/secret/resolve/main/cubepack.lock"
    assert raw(served.url, "GET", path)[0] == 401  # no token: refused
    assert raw(served.url, "GET", path, token="anything")[0] == 401  # made up: refused
    status, data = raw(served.url, "GET", path, token="")
    assert (status, data) == (401, raw(served.url, "GET", path)[1]), \
        f"an empty bearer token read the private file: {status} {data!r}"


def test_an_empty_bearer_token_cannot_delete_a_private_repo(served, monkeypatch):
    api = api_for(served.url, TEAM, monkeypatch)
    api.create_repo("team/secret", repo_type="dataset", private=True)
    status, _ = raw(served.url, "DELETE", "/api/repos/delete", json.dumps(
        {"name": "secret", "organization": "team", "type": "dataset"}).encode(), token="")
    assert status == 401, f"an empty bearer token deleted the team's private repo: {status}"
    assert api.repo_exists("team/secret", repo_type="dataset")


def test_hub_serve_refuses_an_empty_token(tmp_path):
    """The fix the docs' own command needs: `--token "$UNSET"` is a mistake to refuse (or at
    least the one-line warning of an endpoint without tokens), never a key anyone can type."""
    try:
        served = Served(tmp_path / "root", "--token", "")
    except AssertionError:
        return  # refused to start: the fix
    said = served.stop()
    assert "token" in said.lower() and ("empty" in said.lower() or "anyone" in said.lower()), \
        f"hub serve --token '' started without a word: {said!r}"
