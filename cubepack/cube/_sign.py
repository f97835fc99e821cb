"""``cubepack sign``: verify a cube, then sign it (a signature never blesses a cube that does not
verify)."""

from __future__ import annotations

import os
from pathlib import Path

from ._signing import check_key, write_signature
from ._verify import verify


def sign(cube_dir: str | Path, key: str | os.PathLike[str], *,
         password: str | None = None) -> Path:
    """Verify the packed cube at ``cube_dir``, then write ``cubepack.sig`` with ``key`` (an ECDSA
    P-256/P-384 private key, PEM) in the OpenSSF model-signing format; return its path.

    Raises:
        VerificationFailed: the cube does not verify (nothing is written).
        CubepackError: the key is unreadable or not ECDSA P-256/P-384.
    """
    check_key(key, private=True, password=password)  # fail before any work
    verify(cube_dir)
    return write_signature(cube_dir, key, password=password)
