"""tools/make_compat_fixtures.py and the fixtures it made agree: every fixture is one it (or
an older commit's writer it runs) builds, and each older fixture names the commit the tool
runs for it, one of this repository's own (tests/format/test_compat_fixtures.py reads them)."""

from __future__ import annotations

import json
import subprocess

import pytest

from envs import once
from helpers import load_tool

pytestmark = once

tool = load_tool("make_compat_fixtures")


def test_every_fixture_is_one_the_tool_builds_and_each_one_it_builds_is_there():
    folders = {path.parent.name for path in tool.OUT.glob("*/fixture.json")}
    assert folders == set(tool.CURRENT) | set(tool.OLD)
    assert not set(tool.CURRENT) & set(tool.OLD)


@pytest.mark.parametrize("name", sorted(tool.OLD))
def test_an_older_fixture_names_the_commit_the_tool_runs_for_it(name):
    commit, env = tool.OLD[name]
    assert env in ("latest", "memos")
    assert json.loads((tool.OUT / name / "fixture.json").read_text())["writer"]["commit"] == commit
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=tool.ROOT,
                             capture_output=True, text=True).stdout.strip()
    if shallow != "false":
        pytest.skip("a shallow clone (or no git) holds no older commit")
    found = subprocess.run(["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=tool.ROOT)
    assert found.returncode == 0, f"{commit} is not a commit of this branch's history"
