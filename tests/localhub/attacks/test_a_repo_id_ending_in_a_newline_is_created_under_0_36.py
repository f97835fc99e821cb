"""Adversary (issue #38, item 4): under huggingface_hub 0.36 the endpoint creates a repo whose id
ends in a newline, which 2.x and the Hub refuse.

The promise (docs/reference/local-hub.md, What it serves): "repo ids as the installed
huggingface_hub's own `validate_repo_id` takes them (called, not copied; ASCII, a namespace of
at most 96 characters [...])"; cubepack/localhub/_ids.py closes 0.36's gaps so that ids follow
"2.x's and the Hub's" rule: 0.36 reads `\\w` as Unicode and bounds no namespace. Issue #38:
"Repo ids, revisions and paths follow huggingface_hub's own validation".

The attack: `POST /api/repos/create` with the name `cube\\n` (the request path's form,
`/api/models/team/cube%0A`, names it too). 0.36's REPO_ID_REGEX ends in `$` and is applied with
`.match`, and `$` matches before a final newline; 2.x uses `fullmatch`.

What happened: under 0.36 (the memos environment) the repo `team/cube\\n` is created (a folder
named `cube` + newline), a second repo that prints like `team/cube`; under 2.x it is refused, so
a root written by a 0.36 endpoint holds a repo a 2.x endpoint does not serve ("repo folder has
an id huggingface_hub refuses").
"""

from __future__ import annotations

import json

import pytest

from cubepack.localhub._ids import repo_id_problem
from cubepack.testing.hub import InstrumentedHub

from hub_users import raw

TOKEN = "writer"


@pytest.mark.parametrize("repo_id", ["team/cube\n", "cube\n", "team\n/cube"])
def test_a_trailing_newline_is_no_repo_id(repo_id):
    assert repo_id_problem(repo_id) is not None


def test_the_endpoint_refuses_to_create_a_repo_named_with_a_newline(tmp_path):
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN]) as hub:
        status, answer = raw(hub.url, "POST", "/api/repos/create", json.dumps(
            {"name": "cube\n", "organization": "team", "type": "dataset"}).encode(), TOKEN)
        assert status == 400, (status, answer)
        assert not (tmp_path / "root" / "repos" / "datasets" / "team" / "cube\n").exists()
