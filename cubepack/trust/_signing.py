"""Signed cubes, interoperable with OpenSSF model signing (``pip install cubepack[sign]``).

A lock proves a cube is what its lock says; anyone who can push can rewrite the lock. A
signature says *who* packed it. cubepack signs the whole cube folder, lock included, with the
``model-signing`` package's public API and an ECDSA key (P-256 or P-384; model_signing takes no
Ed25519), writing ``cubepack.sig``. Stock ``model_signing verify key CUBE --signature
CUBE/cubepack.sig --public_key PUB.pem`` accepts it. Only key-based flows are used: no Sigstore
network flow is ever attempted.

Signing first writes the cube's in-toto attestation (``cubepack.intoto.json``, see
:mod:`._attestation`) with the same key; the signature then covers it like any other file, so
stock ``model_signing verify`` still accepts the folder.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from .._util import atomic, constants
from ..errors import CubepackError, SignatureError, UnsafeInputError
from ..format import _fileset as fileset
from ..format import _lock as lockfile
from ..format.sections import shards as shardformat
from ._attestation import Proved, attest
from ._keys import check_key

__all__ = ["check_key", "check_resigning", "verify_lock_signature", "verify_signature",
           "write_signature"]

def _model_signing() -> Any:
    try:
        import OpenSSL  # noqa: F401 - model_signing needs it for key signing but does not declare it
        from model_signing import hashing, signing, verifying
    except ImportError as exc:
        raise CubepackError("Signing needs the optional dependencies: pip install "
                            "'cubepack[sign]' (model-signing and pyopenssl).") from exc
    return hashing, signing, verifying


def _hashing_config(hashing: Any) -> Any:
    # The file-set rule says what a signature leaves out (itself, a download's bookkeeping);
    # model_signing records it in the signature, so stock model_signing verify ignores the
    # same. Git bookkeeping (.gitattributes) is ignored as the stock CLI ignores it.
    return hashing.Config().set_ignored_paths(paths=list(fileset.SIGNATURE_IGNORES),
                                              ignore_git_paths=True)


def write_signature(cube_dir: str | Path, key: str | os.PathLike[str], proved: Proved, *,
                    password: str | None = None) -> Path:
    """Write ``cubepack.intoto.json`` (the lock's signed attestation, stating ``proved``: what
    the signing step established; the rest of the lock as claims), then ``cubepack.sig`` over
    the files a packed cube's lock records, the attestation included.

    Only signs. The caller verifies first (:func:`cubepack.sign` and ``pack --sign-key`` do): the signature's manifest is built from the sha256 values in ``cubepack.lock`` plus the
    lock's own bytes, so no file is hashed again, and a file that no longer matches its lock
    cannot be blessed (the signature records the lock's digest, not the changed bytes).

    Raises:
        CubepackError: the key is unreadable or not ECDSA P-256/P-384, or the cube has no
            readable lock.
    """
    cube = Path(cube_dir)
    check_key(key, private=True, password=password)
    for name in (constants.ATTESTATION_FILENAME, constants.SIGNATURE_FILENAME):
        if (cube / name).is_dir() and not (cube / name).is_symlink():  # before writing either
            raise UnsafeInputError(f"{cube / name} is a folder; signing writes a file there. "
                                   "Remove it and sign again.")
    hashing, signing, _ = _model_signing()
    lock_bytes = (cube / constants.LOCK_FILENAME).read_bytes()
    attestation = attest(lock_bytes, key, proved, password=password,
                         fetch=shardformat.local_fetch(cube))
    manifest = _manifest_from_lock(cube, hashing, lock_bytes, {
        constants.ATTESTATION_FILENAME: hashlib.sha256(attestation).hexdigest()})
    target = cube / constants.SIGNATURE_FILENAME
    attested = cube / constants.ATTESTATION_FILENAME
    before = attested.read_bytes() if attested.is_file() and not attested.is_symlink() else None
    # Written outside the cube, then renamed in: a temp file inside would be signed too. Its
    # name starts ".<cube>." as every temp path beside a target does, so an error names the cube.
    with atomic.placing(cube, elsewhere="copy the cube to a writable folder and sign the copy"):
        handle, temporary = tempfile.mkstemp(prefix=f".{cube.absolute().name}.sig.",
                                             dir=cube.parent)
        os.close(handle)
        try:
            (signing.Config().use_elliptic_key_signer(private_key=str(key), password=password)
             .set_hashing_config(_Precomputed(manifest)).sign(cube, temporary))
            os.chmod(temporary, 0o644)
            atomic.write_bytes(attested, attestation)  # first: the signature names its digest
            try:
                os.replace(temporary, target)
            except BaseException:  # keep the pair consistent: the old attestation, or none
                if before is None:
                    attested.unlink(missing_ok=True)
                else:
                    atomic.write_bytes(attested, before)
                raise
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

    def add_ignored_paths(self, **_: Any) -> None:
        """Verifying passes the signature's ignored paths on: the manifest already left them."""


def _manifest_from_lock(cube: Path, hashing: Any, lock_bytes: bytes,
                        extra: dict[str, str]) -> Any:
    """The manifest model_signing would compute for ``cube``, built from the lock's digests
    (and ``extra``: path -> sha256 of files beside the lock, such as the attestation).

    The serialization description (hash type, ignored paths) comes from model_signing itself,
    by hashing an empty file list with the same config, so stock ``model_signing verify``
    re-creates exactly this manifest from the files.
    """
    from model_signing import manifest as ms_manifest

    # The digest value type has no public constructor path; this is the only private import.
    from model_signing._hashing.hashing import Digest

    lock = lockfile.parse(lock_bytes)
    digests = {path: entry.sha256 for path, entry in lock.files.items()
               if fileset.signature_covers(path)}
    digests[constants.LOCK_FILENAME] = hashlib.sha256(lock_bytes).hexdigest()
    digests.update(extra)
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
    _require_signed(signature.is_file() and not signature.is_symlink(), trusted_keys)
    hashing, _, verifying = _model_signing()
    return _verified_by(trusted_keys, cube, signature, lambda: _hashing_config(hashing),
                        verifying)


def _require_signed(signed: bool, trusted_keys: Any) -> None:
    """The two refusals before any signature is read: none there, or no key to check it with."""
    if not signed:
        raise SignatureError(f"The cube is unsigned: it has no {constants.SIGNATURE_FILENAME}. "
                             "Ask its publisher to sign it (cubepack sign), or do not require "
                             "a signature.")
    if not trusted_keys:
        raise SignatureError("A signature is required but no trusted key was given "
                             "(--trusted-key PUB.pem).")


def verify_lock_signature(lock_bytes: bytes, signature: bytes | None,
                          attestation: bytes | None,
                          trusted_keys: list[str | os.PathLike[str]] | tuple) -> str:
    """A cube's signature checked over its lock alone, its files not at hand (a remote cube
    opened on demand): the manifest the signer signed is rebuilt from the lock's digests, the
    lock's own sha256 and the attestation's (as :func:`write_signature` built it), so the
    signature binds this lock, whose digests bind every file. Returns the key that verified.

    Raises:
        SignatureError: no signature; signed by a key not in ``trusted_keys``; or a signature
            over another lock (or attestation).
    """
    _require_signed(signature is not None, trusted_keys)
    hashing, _, verifying = _model_signing()
    with tempfile.TemporaryDirectory(prefix="cubepack-signed-") as tmp:
        folder = Path(tmp) / "cube"  # empty: the manifest is the lock's, nothing is hashed
        folder.mkdir()
        extra = {} if attestation is None else {
            constants.ATTESTATION_FILENAME: hashlib.sha256(attestation).hexdigest()}
        manifest = _manifest_from_lock(folder, hashing, lock_bytes, extra)
        path = Path(tmp) / constants.SIGNATURE_FILENAME
        path.write_bytes(signature)
        return _verified_by(trusted_keys, folder, path, lambda: _Precomputed(manifest),
                            verifying, covered="this lock")


def _verified_by(trusted_keys: list[str | os.PathLike[str]] | tuple, cube: Path,
                 signature: Path, config: Any, verifying: Any, *,
                 covered: str = "this content") -> str:
    """The first of ``trusted_keys`` whose signature over ``cube`` (hashed by ``config()``)
    verifies; else a SignatureError saying whether the content (``covered``: a cube's files,
    or a lock alone) or the key differs."""
    content_errors = []
    for key in trusted_keys:
        check_key(key, private=False)
        try:
            (verifying.Config().use_elliptic_key_verifier(public_key=str(key))
             .set_hashing_config(config()).verify(cube, signature))
            return str(key)
        except Exception as exc:  # noqa: BLE001 - model_signing raises ValueError and others
            message = str(exc)
            if "key mismatch" in message.lower() or "public key" in message.lower():
                continue
            content_errors.append(_describe_content_error(message))
    if content_errors:
        raise SignatureError(f"The signature does not cover {covered}: {content_errors[0]}. "
                             "The cube changed after it was signed.")
    names = ", ".join(str(k) for k in trusted_keys)
    raise SignatureError(f"The cube is signed by a key that is not trusted (trusted: {names}).")


def check_resigning(cube_dir: str | Path, key: str | os.PathLike[str], *,
                    password: str | None = None,
                    trusted_keys: list[str | os.PathLike[str]] | tuple = (),
                    action: str = "re-sign") -> str:
    """Before ``key`` signs a cube it did not just verify the content of (a private cube's
    ciphertexts, whose plaintext the signer never sees), the signature it replaces must verify
    under ``key``'s own public half or one of ``trusted_keys``: else an attacker's replacement
    (the owner's signature left behind, failing) would be blessed with the owner's key, and a
    claim would gain strength. Return the key that verified.

    Raises:
        SignatureError: the cube is unsigned, or its signature fails under every key tried.
    """
    from cryptography.hazmat.primitives import serialization

    check_key(key, private=True, password=password)
    private = serialization.load_pem_private_key(Path(key).read_bytes(),
                                                 password.encode() if password else None)
    public = private.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    # A public key is no secret: a temp file only because model_signing reads keys by path.
    with tempfile.TemporaryDirectory(prefix="cubepack-pub.") as folder:
        own = Path(folder) / "signing-key.pub.pem"
        own.write_bytes(public)
        try:
            found = verify_signature(cube_dir, [own, *trusted_keys])
        except SignatureError as exc:
            raise SignatureError(
                f"Refusing to {action} {cube_dir} with {key}: its current signature does not "
                f"verify under that key's public half"
                f"{' or a --trusted-key' if trusted_keys else ''} ({exc}) The content may not "
                "be what was signed before, and signing it again would vouch for it unseen. "
                "Fix: pass --trusted-key PUB.pem of whoever signed it, or verify the cube "
                "(cubepack verify --identity KEY) and sign it yourself with cubepack sign; "
                "without --sign-key the cube is left unsigned.") from exc
    return str(key) if found == str(own) else found


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
