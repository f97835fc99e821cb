"""``cubepack encrypt`` and ``cubepack rekey``: a verified clear cube made private, and a
private cube's recipients changed (see :mod:`._private` for the format and how it opens)."""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from .._util import constants
from .._util.paths import resolve_inside
from ..errors import IntegrityError, UsageError
from ..format import _fileset as fileset
from ..trust import _age as age
from ..trust._signing import check_key, check_resigning
from ._private import EncryptResult, is_private, mapped_plaintext, open_private, write_private
from ._sign import sign
from ._verify import verify

__all__ = ["encrypt", "rekey"]


def encrypt(cube_dir: str | Path, recipients: list[str] | tuple[str, ...], *,
            hide_names: bool = False, sign_key: str | Path | None = None,
            sign_password: str | None = None, progress: bool | None = None,
            trusted_keys: list[str | Path] | tuple = ()) -> EncryptResult:
    """Encrypt the packed cube at ``cube_dir`` to ``recipients`` (age X25519 keys, SSH
    ed25519/RSA public keys, or files of them), in place and atomically: the cube is verified
    first (a cube that does not verify is never encrypted), then written whole beside itself and
    swapped in. ``hide_names``: ciphertexts are named ``private/<random>.age``, so file names
    carry no item id. ``sign_key``: sign the private cube (its public lock: encrypt-then-sign);
    a clear cube that is already signed must carry a signature that verifies under
    ``sign_key``'s public half or one of ``trusted_keys`` (a signature is never moved onto
    content its signer did not sign).

    Raises:
        VerificationFailed: the clear cube does not verify.
        UsageError: no or an invalid recipient; the cube is already private (use rekey).
        SignatureError: ``sign_key`` given and the cube's existing signature does not verify
            under it (or ``trusted_keys``).
    """
    cube = Path(cube_dir)
    parsed = age.parse_recipients(list(recipients))
    if sign_key is not None:
        check_key(sign_key, private=True, password=sign_password)
    report = verify(cube, progress=progress)
    if sign_key is not None and (cube / constants.SIGNATURE_FILENAME).exists():
        check_resigning(cube, sign_key, password=sign_password, trusted_keys=trusted_keys)
    lock = report.lock or {}
    if is_private(lock):
        raise UsageError(f"{cube} is already a private cube; change its recipients with "
                         "cubepack rekey.")
    lock_bytes = (cube / constants.LOCK_FILENAME).read_bytes()
    clear = {name: resolve_inside(cube, name) for name in sorted(lock["files"])}
    clear[constants.LOCK_FILENAME] = cube / constants.LOCK_FILENAME
    names = {fileset.ciphertext_name(name, secrets.token_hex(16) if hide_names else None): name
             for name in clear}

    def read(name: str) -> bytes:
        data = clear[name].read_bytes()
        expected = (lock["files"].get(name) or {}).get("sha256") if name in lock["files"] \
            else hashlib.sha256(lock_bytes).hexdigest()
        if hashlib.sha256(data).hexdigest() != expected:
            raise IntegrityError(f"{name} changed after the cube was verified; nothing was "
                                 "encrypted. Pack the cube again.")
        return data

    result = write_private(cube, lock, lock_bytes.decode("utf-8"), names, read, parsed,
                            hidden=hide_names)
    if sign_key is not None:
        _sign(cube, sign_key, sign_password)
        result.signed_with = str(sign_key)
    return result


def _sign(cube: Path, key: str | Path, password: str | None) -> None:
    sign(cube, key, password=password)


def rekey(cube_dir: str | Path, identity: str | os.PathLike[str], *,
          add: list[str] | tuple[str, ...] = (), remove: list[str] | tuple[str, ...] = (),
          rotate: bool = False, sign_key: str | Path | None = None,
          sign_password: str | None = None,
          trusted_keys: list[str | Path] | tuple = ()) -> EncryptResult:
    """Change a private cube's recipients: decrypt it in memory with ``identity``, then write
    every file again encrypted to the new set (``add``, minus ``remove``), in place and
    atomically, with the same clear content and the same ciphertext names.

    Every rekey draws new file keys (the age binding used does not expose a file key, so a
    header cannot be rewritten around the old one); ``rotate`` alone re-encrypts to the same
    recipients under new file keys.
    Removing a recipient does not revoke what they already downloaded. The files change, so
    a push uploads them again; the old signature no longer covers them: ``sign_key`` signs
    the new cube, else it is left unsigned (its signing files removed) and said so. The
    signer never sees the plaintext it signs, so the cube's current signature must verify
    under ``sign_key``'s public half or one of ``trusted_keys`` first (an unsigned cube or a
    replaced one is refused: anyone who can push can swap it).

    Raises:
        UsageError: nothing to change (no option, or every added recipient is one already,
            without ``rotate``), or no recipient left.
        RefusedError: ``identity`` is not a recipient.
        SignatureError: ``sign_key`` given and the current signature does not verify under
            it (or ``trusted_keys``); nothing was decrypted or written.
    """
    cube = Path(cube_dir)
    if not add and not remove and not rotate:
        raise UsageError("Nothing to change: pass --add RECIPIENT and/or --remove RECIPIENT "
                         "(or --rotate for new file keys with the same recipients).")
    if sign_key is not None:
        check_key(sign_key, private=True, password=sign_password)
    report = verify(cube)  # intact ciphertexts before anything is decrypted
    if sign_key is not None:
        check_resigning(cube, sign_key, password=sign_password, trusted_keys=trusted_keys)
    added = age.parse_recipients(list(add)) if add else []
    removed = {r.text for r in age.parse_recipients(list(remove))} if remove else set()
    with open_private(cube, identity, public_lock=report.lock) as opened:
        current = {text: r for text in opened.manifest["recipients"]
                   for r in age.parse_recipients([text])}
        unknown = sorted(removed - set(current))
        if unknown:
            raise UsageError(f"Cannot remove {unknown[0][:60]}: it is not a recipient of this "
                             f"cube (its recipients: {len(current)}).")
        kept = {text: r for text, r in current.items() if text not in removed}
        for r in added:
            kept.setdefault(r.text, r)
        if not kept:
            raise UsageError("Removing every recipient would leave a cube nobody can open; add "
                             "one (--add) in the same rekey.")
        if set(kept) == set(current) and not rotate:
            # Rewriting every file would only re-upload the whole cube on the next push.
            raise UsageError(f"Nothing to change: the cube's {len(current)} recipient(s) "
                             "would stay as they are; nothing was written. Pass --rotate to "
                             "re-encrypt to them under new file keys.")
        names = opened.manifest["names"]
        folder = opened.folder
        # The staging folder holds no signing files: the old signature, which cannot cover
        # the new ciphertexts, goes with the swap (and comes back only with sign_key).
        result = write_private(cube, opened.lock, opened.manifest["lock"], names,
                                lambda name: mapped_plaintext(resolve_inside(folder, name)),
                                list(kept.values()),
                                hidden=opened.public_lock["encryption"]["hidden_names"])
    result.added = sorted(r.text for r in added if r.text not in current)
    result.removed = sorted(removed)
    if sign_key is not None:
        _sign(cube, sign_key, sign_password)
        result.signed_with = str(sign_key)
    return result
