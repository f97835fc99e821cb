"""Round 30 (issue #30): a private cube whose cache is only within the dtype's noise of the
producer's prefill, verified with its identity under `--recompute --require-provenance
recomputed`, is refused with the fix `cubepack pack CUBE --model MODEL --recompute`. Pack
refuses every private cube ("it is packed already ... pack its clear source"): the fix,
followed literally, fails. For a private cube it must name what works (pack the clear source
with --recompute, then encrypt again)."""

from __future__ import annotations

import os
import sys

import pytest

import cubepack

from places import TESTS

sys.path.insert(0, str(TESTS / "kv"))

from test_recompute import near_cube  # noqa: E402


def test_a_private_cube_near_refusal_names_a_fix_through_its_clear_source(tmp_path, zoo, models):
    pyrage = pytest.importorskip("pyrage", reason="private cubes need cubepack[private]")
    from cubepack.ops._encrypt import encrypt

    identity = pyrage.x25519.Identity.generate()
    key = tmp_path / "alice.key"
    key.write_text(f"# public key: {identity.to_public()}\n{identity}\n")
    os.chmod(key, 0o600)
    bf16 = models["a_as_bf16"]
    cube = near_cube(tmp_path, zoo, bf16)
    encrypt(cube, [str(identity.to_public())])
    with pytest.raises(cubepack.VerificationFailed) as refused:
        cubepack.verify(cube, decrypt_with=key, model=bf16, recompute=True,
                        require_provenance="recomputed")
    message = str(refused.value)
    # Pack refuses every private cube, so the fix must not name this cube as pack's target...
    with pytest.raises(cubepack.UsageError, match="is a private cube"):
        cubepack.pack(cube, model=bf16, recompute=True)
    assert f"cubepack pack {cube}" not in message, message
    # ... it names what works for a private cube: its clear source, then encrypt again.
    assert "prefill into its clear source with `cubepack pack SOURCE --model MODEL " in message
    assert "`cubepack encrypt` it again" in message


def test_a_clear_cube_near_refusal_names_the_cube_and_no_private_step(tmp_path, zoo, models):
    """The same refusal for a clear cube: the fix packs this cube (which works: the next
    verify is bit for bit), with nothing about private cubes in it."""
    bf16 = models["a_as_bf16"]
    cube = near_cube(tmp_path, zoo, bf16)
    with pytest.raises(cubepack.VerificationFailed) as refused:
        cubepack.verify(cube, model=bf16, recompute=True, require_provenance="recomputed")
    message = str(refused.value)
    assert f"`cubepack pack {cube} --model MODEL --recompute`" in message, message
    assert "private" not in message and "encrypt" not in message, message
    cubepack.pack(cube, model=bf16, recompute=True)  # the fix, followed
    cubepack.verify(cube, model=bf16, recompute=True, require_provenance="recomputed")
