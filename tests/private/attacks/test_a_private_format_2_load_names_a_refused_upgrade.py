"""Issue #37 item 4 ("`pack` names a format-2 file with the command that upgrades it") and
principle 1 ("the suggested fix works"; errors.md: "Where a refusal suggests a command, that
command works").

The chain: a cube packed by cubepack 0.2 (format-2 KV files, an honest lock) is encrypted
(``encrypt``), then a reader loads one of its caches the documented way,
``load_kv_cache(".../item.kv.safetensors.age", model, decrypt_with=KEY)``. The load logs that
the tensors carry no checksums and says "Add them: cubepack upgrade
<...>/item.kv.safetensors.age --model MODEL": run as printed, upgrade refuses the file (an
age-encrypted file: "export, import and upgrade refuse it"), and an upgrade of the private
cube is refused too ("Upgrade its clear source"), which a reader does not have."""

from __future__ import annotations

import logging
import os
import shlex

import pytest
from private_keys import age_keys

import cubepack
from cubepack.ops._encrypt import encrypt

from adversarial import ITEM, OTHER, relock_file
from helpers import as_format_2, cli_in_process


def test_the_upgrade_a_private_format_2_load_names_works(cube, tmp_path, models, zoo, caplog):
    pytest.importorskip("pyrage")
    for name in (ITEM, OTHER):
        as_format_2(cube / name, cube / name)
        relock_file(cube, name)
    keys = age_keys(tmp_path, "alice")
    encrypt(cube, [keys["alice"][1]])
    caplog.set_level(logging.INFO, logger="cubepack")
    cubepack.load_kv_cache(cube / f"{ITEM}.age", models["a"], decrypt_with=keys["alice"][0])
    [note] = [r.getMessage() for r in caplog.records if "Add them: " in r.getMessage()]
    # Fixed: a private file is never named for an upgrade in place (upgrade refuses it, and
    # writes no plaintext); the owner's route, from the clear source, is named instead.
    assert ".age --model" not in note, note
    assert "cubepack upgrade SOURCE --model MODEL" in note, note
    assert "--continue PRIVATE_CUBE" in note, note
