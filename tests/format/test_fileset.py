"""The file-set rule (``cubepack.format._fileset``): one answer per path, for pack, verify,
sign, push and pull, and the bookkeeping folder named as huggingface_hub names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cubepack._util import constants
from cubepack.format import _fileset as fileset

from envs import once

#: One path of every role, and what the rule must answer for it:
#: (path, locked by pack, tolerated unlisted, hashed by the signature itself).
PATHS = [
    ("activations/a.kv.safetensors", True, False, True),
    ("notes.txt", True, False, True),
    ("config.json", True, False, True),
    (constants.LOCK_FILENAME, False, True, True),
    (constants.CONFIG_FILENAME, False, False, True),
    (constants.CARD_FILENAME, False, False, True),
    (constants.SIGNATURE_FILENAME, False, True, False),
    (constants.ATTESTATION_FILENAME, False, True, True),
    (".gitattributes", True, True, False),
    (".cache/cubepack/origin.json", False, True, False),
    (".cache/huggingface/.gitignore", False, True, False),
    (".cache/huggingface/download/a.kv.safetensors.metadata", False, True, False),
    (".cache/other.txt", True, False, True),  # only the two tools' folders are bookkeeping
    ("docs/.cache/cubepack/origin.json", True, False, True),  # and only at the top
]


@once
@pytest.mark.parametrize("path, locked, tolerated, signed", PATHS)
def test_every_role_has_one_answer(path, locked, tolerated, signed):
    lockable = fileset.lockable([path]) == [path]
    generated = path in fileset.GENERATED
    assert lockable == (locked and not generated)
    assert fileset.is_tolerated(path) == tolerated
    assert fileset.signature_covers(path) == signed
    # A download's bookkeeping is never locked, never signed, always tolerated.
    if fileset.is_bookkeeping(path):
        assert not lockable and not signed and fileset.is_tolerated(path)


def test_the_bookkeeping_folder_is_the_one_huggingface_hub_writes(tmp_path):
    """huggingface_hub's ``_local_folder`` owns the local-dir layout; if it moves the folder,
    this fails and the rule follows it."""
    from huggingface_hub import _local_folder

    made = Path(_local_folder._huggingface_dir(tmp_path))
    assert made.relative_to(tmp_path).as_posix() == fileset.HF_LOCAL_DIR
