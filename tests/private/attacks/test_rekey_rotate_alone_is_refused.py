"""Promise 5: "removing a recipient does not revoke what they already downloaded (rotate by
re-encrypting to new file keys: ``--rotate``)". The CLI offers ``rekey --rotate`` ("New
file keys for every file"), and the docs say rekey "draws new file keys (so --rotate is what
always happens)". Yet ``cubepack rekey CUBE --identity KEY --rotate`` alone, the rotation
itself with the same readers, is refused as "Nothing to change": the only way to rotate is to
add or remove someone. (``rekey(..., rotate=True)`` in Python: the same.)"""

from __future__ import annotations

import os

import pytest
from private_keys import age_keys, private_copy

from cubepack.format import _fileset as fileset

from helpers import cli_in_process


def test_rekey_rotate_rotates_with_the_same_recipients(packed, tmp_path):
    pytest.importorskip("pyrage")
    keys = age_keys(tmp_path, "alice")
    cube = private_copy(packed, tmp_path / "cube", [keys["alice"][1]])
    before = (cube / fileset.PRIVATE_MANIFEST).read_bytes()
    env = {k: v for k, v in os.environ.items() if k != "CUBEPACK_IDENTITY"}
    # Issue #37: an unsigned cube's own recipient list is not kept unnamed: --to names it.
    done = cli_in_process(["rekey", cube, "--identity", keys["alice"][0], "--rotate", "--to",
                           keys["alice"][1]], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (cube / fileset.PRIVATE_MANIFEST).read_bytes() != before  # new file keys
