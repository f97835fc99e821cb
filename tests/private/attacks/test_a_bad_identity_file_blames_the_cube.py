"""Brief: identity handling, "messages must not leak anything and be typed". A mistake in the
reader's own key file (a path that does not exist, a key others can read) is raised by
``load_identities`` as UsageError / UnsafeInputError, and ``rekey`` says it so. ``verify``
(and ``pull``, ``load_adapter``, the MemOS hook through it) folds it into a failed check of
the cube instead: ``VerificationFailed``, exit 1, "REFUSED: do not load this cube", and
"not run: the cube's files failed the checks above", about an intact cube whose files
all passed. A script (or a person) reading the exit code or the type concludes the cube was
tampered with; the fix for a typo is not to distrust the cube."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from private_keys import age_keys, private_copy

from helpers import cli_in_process


@pytest.fixture
def private(packed, tmp_path):
    pytest.importorskip("pyrage")
    keys = age_keys(tmp_path, "alice")
    cube = private_copy(packed, tmp_path / "cube", [keys["alice"][1]])
    return cube, keys["alice"][0]


def run_verify(cube, identity, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CUBEPACK_IDENTITY"}
    done = cli_in_process(["verify", cube, "--identity", identity, "--json"], env=env,
                          cwd=tmp_path)
    return done.returncode, json.loads(done.stdout)


def test_a_missing_identity_file_is_a_usage_error_not_a_refused_cube(private, tmp_path):
    cube, _ = private
    code, data = run_verify(cube, tmp_path / "no-such.key", tmp_path)
    assert (code, data["error"]["type"]) == (2, "UsageError"), data["error"]


def test_an_identity_readable_by_others_is_unsafe_input_not_a_refused_cube(private, tmp_path):
    cube, key = private
    loose = tmp_path / "loose.key"
    shutil.copy(key, loose)
    os.chmod(loose, 0o644)
    code, data = run_verify(cube, loose, tmp_path)
    assert data["error"]["type"] == "UnsafeInputError", data["error"]
    details = [c["detail"] for c in data["report"]["checks"]]
    assert not any("files failed" in d for d in details), details
