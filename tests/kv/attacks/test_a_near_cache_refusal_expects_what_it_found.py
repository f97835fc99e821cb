"""Round 30 (issue #30): a cache within the dtype's noise of the prefill, refused under
`--require-provenance recomputed`, was reported as "expected recomputed, proved or signed,
found recomputed (proved)": what was found reads as what was expected. The found side must
say what fell short."""

from __future__ import annotations

import sys

import pytest

import cubepack

from places import TESTS

sys.path.insert(0, str(TESTS / "kv"))

from test_recompute import near_cube  # noqa: E402


def test_a_near_cache_refusal_says_the_cache_was_not_bit_for_bit(tmp_path, zoo, models):

    bf16 = models["a_as_bf16"]
    cube = near_cube(tmp_path, zoo, bf16)
    with pytest.raises(cubepack.VerificationFailed) as refused:
        cubepack.verify(cube, model=bf16, recompute=True, require_provenance="recomputed")
    [check] = [c for c in refused.value.report.checks if c.name == "provenance"]
    assert check.found != "recomputed (proved)"
    assert "not bit for bit" in check.found
