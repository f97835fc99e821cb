"""The ECDSA keys cubepack signs with (``cubepack.sig`` and the in-toto attestation alike)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UsageError

#: model_signing's elliptic-key signer takes these curves (no Ed25519, no RSA).
_CURVES = ("secp256r1", "secp384r1")


def check_key(path: str | os.PathLike[str], *, private: bool, password: str | None = None) -> None:
    """Refuse keys model_signing cannot use, with a sentence instead of a stack trace."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"Cannot read key {path}: {exc.strerror or exc}.") from exc
    try:
        key = (serialization.load_pem_private_key(data, password.encode() if password else None)
               if private else serialization.load_pem_public_key(data))
    except (ValueError, TypeError) as exc:
        kind = "private" if private else "public"
        raise UsageError(f"{path} is not a PEM {kind} key (or the password is wrong).") from exc
    curve = getattr(getattr(key, "curve", None), "name", None)
    if not isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) or curve not in _CURVES:
        raise UsageError(f"{path} is a {type(key).__name__.lstrip('_')} key"
                            f"{f' on {curve}' if curve else ''}; cube signing takes ECDSA P-256 or "
                            "P-384 keys (model_signing does not support Ed25519 or RSA). Create one "
                            "with: openssl ecparam -name prime256v1 -genkey -noout -out key.pem")
