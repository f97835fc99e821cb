"""Round 30 (issue #30): a private cube whose cache is only within the dtype's noise of the
producer's prefill, verified with its identity under `--recompute --require-provenance
recomputed`, is refused with the fix `cubepack pack CUBE --model MODEL --recompute`. Pack
refuses every private cube ("it is packed already ... pack its clear source"): the fix,
followed literally, fails. For a private cube it must name what works (pack the clear source
with --recompute, then encrypt again)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

import cubepack

sys.path.insert(0, str(Path(__file__).parent.parent / "kv"))

from test_recompute import near_cube  # noqa: E402


def test_a_private_cube_near_refusal_fix_is_refused_by_pack(tmp_path, zoo, models):
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
    fix = re.search(r"`cubepack pack (\S+) --model MODEL --recompute`", str(refused.value))
    assert fix is not None, str(refused.value)
    with pytest.raises(cubepack.UsageError, match="is a private cube"):
        cubepack.pack(fix.group(1), model=bf16, recompute=True)  # followed literally
    # ... so the fix must say what works for a private cube
    assert "private cube, which pack refuses: pack its clear source" in str(refused.value)
    assert "`cubepack encrypt` it again" in str(refused.value)
