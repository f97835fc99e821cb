"""Round 30 (issue #30): `pull --recompute --require-provenance recomputed` of a cube whose
cache is only within the dtype's noise of the producer's prefill refuses, and its fix reads
`cubepack pack CUBE --model MODEL --recompute`, CUBE being the folder verify was given: pull's
staging folder, deleted as the refusal is raised. Followed literally, the command names a
folder that does not exist (the older fix, `cubepack verify CUBE --recompute ...`, too)."""

from __future__ import annotations

import re
import sys

import pytest

import cubepack
from cubepack.hub import pull, push
from cubepack.testing.hub import InstrumentedHub

from places import TESTS

sys.path.insert(0, str(TESTS / "kv"))

from test_recompute import near_cube  # noqa: E402

from data import HUB_TOKEN  # noqa: E402


def test_a_pull_refusals_fix_names_the_folder_asked_for_not_its_staging(tmp_path, zoo, models):

    bf16 = models["a_as_bf16"]
    cube = near_cube(tmp_path, zoo, bf16)
    with InstrumentedHub(tmp_path / "hub-root", tokens=[HUB_TOKEN]) as hub:
        sha = push(cube, "ns/near", endpoint=hub.url, token=HUB_TOKEN,
                   allow_local_paths=True).commit_sha
        with pytest.raises(cubepack.VerificationFailed, match="--recompute") as refused:
            pull(f"ns/near@{sha}", endpoint=hub.url, local_dir=tmp_path / "placed",
                 cache_dir=tmp_path / "c", model=bf16, recompute=True,
                 require_provenance="recomputed")
    named = re.findall(r"`cubepack \w+ (\S+) ", str(refused.value))
    assert named, str(refused.value)
    # Fixed: the fix names the folder the user asked for, and says to pull into it first
    # (nothing was placed); never pull's staging folder, removed with the refusal.
    for folder in named:
        assert folder == str(tmp_path / "placed"), f"the fix names {folder}"
    assert "pull it first without the requirement that failed" in str(refused.value)
    # and the command stays one a user can paste
    assert f"`cubepack pack {tmp_path / 'placed'} --model MODEL --recompute`" in str(refused.value)
    assert not (tmp_path / "placed").exists()
