"""Promise 2: "A public digest of plaintext would let anyone confirm a guessed ... memory:
such digests are keyed or encrypted", swept over "every output ... --json". ``cubepack pack
--encrypt-to`` blanks the clear pack's item ids from its output, but keeps the clear lock's
``content_digest``: a digest over every plaintext file's sha256 (and the pins and activation
entries), which the private cube keeps only inside its encrypted manifest (its public lock
has another). Printed to a terminal or a CI log, it confirms a guessed cube; so would the
adapters' clear weight digests, kept beside it."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from private_keys import age_keys

from cubepack._util import constants

from helpers import cli_in_process


def test_pack_encrypt_to_json_carries_no_plaintext_digest(packed, tmp_path):
    pytest.importorskip("pyrage")
    keys = age_keys(tmp_path, "alice")
    clear = json.loads((packed / constants.LOCK_FILENAME).read_text())
    cube = tmp_path / "cube"
    shutil.copytree(packed, cube)
    env = {k: v for k, v in os.environ.items() if k != "CUBEPACK_IDENTITY"}
    done = cli_in_process(["pack", cube, "--encrypt-to", keys["alice"][1], "--hide-names",
                           "--json"], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    public = (cube / constants.LOCK_FILENAME).read_text()
    assert clear["content_digest"] not in public  # the public lock keeps it private...
    assert clear["content_digest"] not in done.stdout, "...the command's --json prints it"
