"""Signed cubes, interoperable with OpenSSF model signing (``pip install cubepack[sign]``).

A lock proves a cube is what its lock says; anyone who can push can rewrite the lock. A
signature says *who* packed it. cubepack signs the whole cube folder, lock included, with the
``model-signing`` package's public API and an ECDSA key (P-256 or P-384; model_signing takes no
Ed25519), writing ``cubepack.sig``. Stock ``model_signing verify key CUBE --signature
CUBE/cubepack.sig --public_key PUB.pem`` accepts it. Only key-based flows are used: no Sigstore
network flow is ever attempted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from .._util import constants
from ..errors import CubepackError, SignatureError, UsageError

_CURVES = ("secp256r1", "secp384r1")


def _model_signing() -> Any:
    try:
        import OpenSSL  # noqa: F401 - model_signing needs it for key signing but does not declare it
        from model_signing import hashing, signing, verifying
    except ImportError as exc:
        raise CubepackError("Signing needs the optional dependencies: pip install "
                            "'cubepack[sign]' (model-signing and pyopenssl).") from exc
    return hashing, signing, verifying


def _hashing_config(hashing: Any) -> Any:
    # The signature file cannot cover itself; git bookkeeping (.gitattributes) is ignored as the
    # stock model_signing CLI ignores it, so both verify the same set of files.
    return hashing.Config().set_ignored_paths(paths=[constants.SIGNATURE_FILENAME],
                                              ignore_git_paths=True)


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


def write_signature(cube_dir: str | Path, key: str | os.PathLike[str], *,
                    password: str | None = None) -> Path:
    """Write ``cubepack.sig`` over the files a packed cube's lock records.

    Only signs. The caller verifies first (:func:`cubepack.sign` and ``pack --sign-key`` do): the signature's manifest is built from the sha256 values in ``cubepack.lock`` plus the
    lock's own bytes, so no file is hashed again, and a file that no longer matches its lock
    cannot be blessed (the signature records the lock's digest, not the changed bytes).

    Raises:
        CubepackError: the key is unreadable or not ECDSA P-256/P-384, or the cube has no
            readable lock.
    """
    cube = Path(cube_dir)
    check_key(key, private=True, password=password)
    hashing, signing, _ = _model_signing()
    manifest = _manifest_from_lock(cube, hashing)
    target = cube / constants.SIGNATURE_FILENAME
    # Written outside the cube, then renamed in: a temp file inside would be signed too.
    handle, temporary = tempfile.mkstemp(prefix=".cubepack-sig-", dir=cube.parent)
    os.close(handle)
    try:
        (signing.Config().use_elliptic_key_signer(private_key=str(key), password=password)
         .set_hashing_config(_Precomputed(manifest)).sign(cube, temporary))
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target


class _Precomputed:
    """A hashing config for model_signing that returns a manifest we already hold."""

    def __init__(self, manifest: Any):
        self._manifest = manifest

    def hash(self, model_path: Any, **_: Any) -> Any:
        return self._manifest


def _manifest_from_lock(cube: Path, hashing: Any) -> Any:
    """The manifest model_signing would compute for ``cube``, built from the lock's digests.

    The serialization description (hash type, ignored paths) comes from model_signing itself,
    by hashing an empty file list with the same config, so stock ``model_signing verify``
    re-creates exactly this manifest from the files.
    """
    from model_signing import manifest as ms_manifest

    # The digest value type has no public constructor path; this is the only private import.
    from model_signing._hashing.hashing import Digest

    lock_bytes = (cube / constants.LOCK_FILENAME).read_bytes()
    lock = json.loads(lock_bytes)
    digests = {path: entry["sha256"] for path, entry in lock["files"].items()}
    digests[constants.LOCK_FILENAME] = hashlib.sha256(lock_bytes).hexdigest()
    empty = _hashing_config(hashing).hash(cube, files_to_hash=[])
    serialization = ms_manifest.SerializationType.from_args(empty.serialization_type)
    items = [ms_manifest.FileManifestItem(path=PurePosixPath(path),
                                          digest=Digest("sha256", bytes.fromhex(digest)))
             for path, digest in sorted(digests.items())]
    return ms_manifest.Manifest(empty.model_name, items, serialization)


def verify_signature(cube_dir: str | Path, trusted_keys: list[str | os.PathLike[str]]) -> str:
    """Check ``cubepack.sig`` against each trusted public key; return the key that verified.

    Raises:
        SignatureError: unsigned; signed by a key not in ``trusted_keys``; or a signature that
            does not cover this content (naming the files that differ).
    """
    cube = Path(cube_dir)
    signature = cube / constants.SIGNATURE_FILENAME
    if not signature.is_file() or signature.is_symlink():
        raise SignatureError(f"The cube is unsigned: it has no {constants.SIGNATURE_FILENAME}. "
                             "Ask its publisher to sign it (cubepack sign), or do not require "
                             "a signature.")
    if not trusted_keys:
        raise SignatureError("A signature is required but no trusted key was given "
                             "(--trusted-key PUB.pem).")
    hashing, _, verifying = _model_signing()
    content_errors = []
    for key in trusted_keys:
        check_key(key, private=False)
        try:
            (verifying.Config().use_elliptic_key_verifier(public_key=str(key))
             .set_hashing_config(_hashing_config(hashing)).verify(cube, signature))
            return str(key)
        except Exception as exc:  # noqa: BLE001 - model_signing raises ValueError and others
            message = str(exc)
            if "key mismatch" in message.lower() or "public key" in message.lower():
                continue
            content_errors.append(_describe_content_error(message))
    if content_errors:
        raise SignatureError(f"The signature does not cover this content: {content_errors[0]}. "
                             "The cube changed after it was signed.")
    names = ", ".join(str(k) for k in trusted_keys)
    raise SignatureError(f"The cube is signed by a key that is not trusted (trusted: {names}).")


def _describe_content_error(message: str) -> str:
    # model_signing reports a list repr, so a file name may sit in escaped quotes (\').
    files = re.findall(r"Hash mismatch for \\?'([^'\\]+)\\?'", message)
    if files:
        return f"{', '.join(sorted(set(files)))} differ{'s' if len(files) == 1 else ''}"
    extra = re.findall(r"[Ee]xtra files?[^\[]*\[([^\]]*)\]", message)
    missing = re.findall(r"[Mm]issing files?[^\[]*\[([^\]]*)\]", message)
    parts = ([f"files not signed: {extra[0]}"] if extra else []) + \
        ([f"signed files missing: {missing[0]}"] if missing else [])
    # Never echo model_signing's raw text: it prints digests as Python bytes.
    return "; ".join(parts) or "its files differ from the signed ones"
