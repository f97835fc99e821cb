"""Round 30 (issue #30): `verify --recompute --require-provenance recomputed` refuses a cache
that is only within the dtype's noise of the prefill, and its fix reads: write the prefill
with `cubepack pack CUBE --model MODEL --recompute`. Followed literally (MODEL: the producer's
folder) on a MemOS-format cube of a bfloat16 producer, that pack refused: re-pack pinned the
folder in float32 (a folder does not say which dtype it runs in, and only a plain bundle's
headers were asked), so it recomputed in float32 and called the honest cache "not this
model's. Pass --model with its producer" - the producer it had been passed."""

from __future__ import annotations

import sys

import pytest

import cubepack

from places import TESTS

sys.path.insert(0, str(TESTS / "kv"))

from test_recompute import near_cube  # noqa: E402


def test_the_pack_recompute_fix_works_for_a_half_precision_memos_cube(tmp_path, zoo, models):

    bf16, folder = models["a_as_bf16"], str(zoo["a"])
    cube = near_cube(tmp_path, zoo, bf16)
    with pytest.raises(cubepack.VerificationFailed, match="--model MODEL --recompute") as refused:
        cubepack.verify(cube, model=folder, recompute=True, require_provenance="recomputed")
    assert f"cubepack pack {cube} --model MODEL --recompute" in str(refused.value)
    cubepack.pack(cube, model=folder, recompute=True)  # the fix, MODEL = the producer's folder
    report = cubepack.verify(cube, model=folder, recompute=True, require_provenance="recomputed")
    assert report.provenance["item-1"]["exact"] is True
