"""``cubepack encrypt`` and ``cubepack rekey``: a verified clear cube made private, and a
private cube's recipients changed (see :mod:`._private` for the format and how it opens)."""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .._util import constants
from .._util.checks import Catalogue
from .._util.options import Options
from .._util.paths import resolve_inside
from ..errors import (
    FormatError,
    IntegrityError,
    RefusedError,
    SignatureError,
    UsageError,
    VerificationFailed,
)
from ..format import _fileset as fileset
from ..format import _lock as lockfile
from ..format import _partial as partialformat
from ..trust import _age as age
from ..trust import _generation as generations
from ..trust._policy import TrustPolicy
from ..trust._signing import check_key, check_resigning
from ._private import EncryptResult, is_private, mapped_plaintext, open_private, write_private
from ._sign import sign
from ._verify import require_file_digests, verify

__all__ = ["encrypt", "rekey"]


#: How the record of a generation this process signed says where it was seen.
_WRITTEN_HERE = "written by an encrypt or rekey on this machine"


def _policy(policy: TrustPolicy | None, trusted_keys: Any, consumer: str) -> TrustPolicy:
    """The one policy of an encrypt or rekey: ``trusted_keys`` (``--trusted-key``) as its
    field, honoured whole or refused (a field neither can apply is a UsageError)."""
    policy = TrustPolicy.build(policy, trusted_keys=tuple(trusted_keys) or None)
    policy.require_honoured(consumer)
    return policy


def _signed_by(cube: Path, policy: TrustPolicy, sign_key: str | Path | None,
               password: str | None, progress: bool | None = None, *,
               resigning: bool) -> tuple[Any, str | None]:
    """Verify ``cube`` and say which trusted key signed it (None: no trusted signature).

    Without ``sign_key``: the policy's trusted keys are honoured as verify honours them (given,
    a valid signature by one is required). With it: the cube is verified for its bytes, then
    its current signature must verify under the signing key's own public half or a trusted
    key (:func:`check_resigning`): always when ``resigning`` (a private cube's content, whose
    plaintext the signer never sees), else when it is signed or a signature is required (a
    signature is never moved onto bytes another key vouched for)."""
    if sign_key is None:
        report = verify(cube, policy, progress=progress, raise_on_failure=False)
        # A replay is rekey's own refusal (it names the recipients it would re-add).
        if any(check.name != Catalogue.REPLAY for check in report.failures):
            raise VerificationFailed(report)
        # The encrypted manifest carries the clear lock's digests, each a plaintext's check
        # at decryption: every one computed here (verify proves some shards by their index).
        require_file_digests(report, progress)
        return report, report.signed_by
    report = verify(cube, policy.without(Catalogue.SIGNATURE),
                    progress=progress)
    require_file_digests(report, progress)
    if not resigning and not (cube / constants.SIGNATURE_FILENAME).exists() \
            and not policy.asks(Catalogue.SIGNATURE):
        return report, None
    return report, check_resigning(cube, sign_key, password=password,
                                   trusted_keys=policy.trusted())


def _signers(policy: TrustPolicy, sign_key: str | Path | None,
             password: str | None) -> dict[str, str]:
    """keyid -> key of every key whose signed generations count here: the trusted keys and
    the signing key's own public half."""
    ids = generations.trusted_ids(list(policy.trusted()))
    if sign_key is not None:
        ids[generations.keyid(sign_key, password)] = str(sign_key)
    return ids


@dataclass(frozen=True)
class EncryptOptions(Options):
    """How ``encrypt`` writes a private cube (``cubepack.encrypt``'s keyword arguments; see
    its docstring for each)."""

    VERB: ClassVar[str] = "encrypt"

    hide_names: bool = False
    sign_key: str | Path | None = None
    sign_password: str | None = None
    progress: bool | None = None
    trusted_keys: list[str | Path] | tuple = ()
    policy: TrustPolicy | None = None
    continue_from: str | Path | None = None


@dataclass(frozen=True)
class RekeyOptions(Options):
    """How ``rekey`` changes a private cube's readers (``cubepack.rekey``'s keyword arguments;
    see its docstring for each)."""

    VERB: ClassVar[str] = "rekey"

    add: list[str] | tuple[str, ...] = ()
    remove: list[str] | tuple[str, ...] = ()
    to: list[str] | tuple[str, ...] = ()
    rotate: bool = False
    sign_key: str | Path | None = None
    sign_password: str | None = None
    trusted_keys: list[str | Path] | tuple = ()
    policy: TrustPolicy | None = None


def encrypt(cube_dir: str | Path, recipients: list[str] | tuple[str, ...],
            options: EncryptOptions | None = None, **fields: Any) -> EncryptResult:
    """Encrypt the packed cube at ``cube_dir`` to ``recipients`` (age X25519 keys, SSH
    ed25519/RSA public keys, or files of them), in place and atomically: the cube is verified
    first (a cube that does not verify is never encrypted), then written whole beside itself and
    swapped in. ``hide_names``: ciphertexts are named ``private/<random>.age``, so file names
    carry no item id. ``sign_key``: sign the private cube (its public lock: encrypt-then-sign);
    a clear cube that is already signed must carry a signature that verifies under
    ``sign_key``'s public half or one of ``trusted_keys`` (a signature is never moved onto
    content its signer did not sign).

    The settings are an ``EncryptOptions`` (``options``), or its fields as ``fields``.
    ``trusted_keys`` (or ``policy``, a :class:`TrustPolicy` of which encrypt applies
    ``trusted_keys`` and ``require_signature``): the clear cube must be signed by one of them
    (with ``sign_key``: by one of them or by the signing key itself).

    A private cube starts a new series at generation 1 (another encryption of the same clear
    cube, to other readers, is another private cube). ``continue_from``: a private cube this
    one replaces (its folder, e.g. a pull of it): the new cube continues its series, one
    generation above it (and above any of that series this user has seen signed), so readers
    refuse the revisions it replaces as replays.

    Raises:
        VerificationFailed: the clear cube does not verify, or is not signed by a trusted key.
        UsageError: no or an invalid recipient; the cube is already private (use rekey); a
            policy field encrypt cannot apply; ``continue_from`` not a private cube with a
            generation.
        SignatureError: ``sign_key`` given and the cube's existing signature does not verify
            under it (or ``trusted_keys``).

    Returns:
        an ``EncryptResult``: the cube, its new lock digest, its recipients, the
        ciphertexts written, its series and generation, and the key that signed it (if any).

    Example:
        ```python
        result = cubepack.encrypt("my-cube", ["age1..."], sign_key="signing.pem")
        print(result.recipients, result.generation)
        ```
    """
    partialformat.refuse(cube_dir, "encrypt", "encrypts every file of the cube, memories "
                         "included")
    return _encrypt(Path(cube_dir), recipients, EncryptOptions.build(options, **fields))


def _encrypt(cube: Path, recipients: list[str] | tuple[str, ...],
             options: EncryptOptions) -> EncryptResult:
    hide_names, sign_key, sign_password = (options.hide_names, options.sign_key,
                                           options.sign_password)
    progress, trusted_keys, policy = options.progress, options.trusted_keys, options.policy
    continue_from = options.continue_from
    policy = _policy(policy, trusted_keys, "encrypt")
    parsed = age.parse_recipients(list(recipients))
    if sign_key is not None:
        check_key(sign_key, private=True, password=sign_password)
    previous = _series_of(Path(continue_from), policy, sign_key, sign_password, progress) \
        if continue_from is not None else None
    report, _ = _signed_by(cube, policy, sign_key, sign_password, progress, resigning=False)
    lock = report.lock
    assert lock is not None  # verified, or _signed_by raised
    if is_private(lock):
        raise UsageError(f"{cube} is already a private cube; change its recipients with "
                         "cubepack rekey.")
    if previous is None:
        series, generation = generations.new_series(), 1
    else:
        series = previous[0]
        seen = generations.newest_seen(generations.of_series(series),
                                       _signers(policy, sign_key, sign_password))
        generation = max(previous[1], seen[1].generation if seen else 0) + 1
        if generation > lockfile.MAX_GENERATION:
            raise UsageError(f"--continue {continue_from} is at the last generation "
                             f"({generation - 1}); encrypt without --continue to start a new "
                             "series (readers who saw this one refuse a lower generation).")
    lock_bytes = (cube / constants.LOCK_FILENAME).read_bytes()
    # The lock as written, not as verify resolved it (a sharded cube's memories stay in its
    # shards' indexes: encrypted, like every offset and size in them).
    lock = lockfile.parse(lock_bytes)
    if lock.digest != report.lock.digest:
        raise IntegrityError(f"{cube / constants.LOCK_FILENAME} changed after the cube was "
                             "verified; nothing was encrypted. Pack the cube again.")
    clear = {name: resolve_inside(cube, name) for name in sorted(lock.files)}
    clear[constants.LOCK_FILENAME] = cube / constants.LOCK_FILENAME
    names = {fileset.ciphertext_name(name, secrets.token_hex(16) if hide_names else None): name
             for name in clear}

    def read(name: str) -> bytes:
        data = clear[name].read_bytes()
        expected = lock.files[name].sha256 if name in lock.files \
            else hashlib.sha256(lock_bytes).hexdigest()
        if hashlib.sha256(data).hexdigest() != expected:
            raise IntegrityError(f"{name} changed after the cube was verified; nothing was "
                                 "encrypted. Pack the cube again.")
        return data

    texts = sorted(r.text for r in parsed)
    result = write_private(cube, lock, lock_bytes.decode("utf-8"), names, read, parsed,
                           hidden=hide_names, series=series, generation=generation,
                           history=generations.with_entry([], generation, texts, []))
    if sign_key is not None:
        _sign(cube, sign_key, sign_password)
        result.signed_with = str(sign_key)
        result.unrecorded = _remember(series, sign_key, sign_password, generation, texts,
                                      []) or None
    return result


def _series_of(previous: Path, policy: TrustPolicy, sign_key: str | Path | None,
               password: str | None, progress: bool | None) -> tuple[str, int]:
    """(series, generation) of the private cube at ``previous``, which the new cube continues.
    Read from its public lock only once a key trusted here signed it (``policy``'s trusted
    keys, or the signing key's own public half): an unsigned lock's series and generation are
    whoever pushed it last's word, and signing a continuation of them would make that word
    the owner's (a pusher's own series, on which the owner's signed revisions could replay).

    Raises:
        UsageError: not a private cube with a generation.
        SignatureError: not signed by a trusted key (or the signing key).
    """
    try:
        lock = lockfile.parse((previous / constants.LOCK_FILENAME).read_bytes())
    except (OSError, FormatError) as exc:
        raise UsageError(f"--continue {previous}: its lock cannot be read ({exc}); name the "
                         "folder of the private cube this one replaces (a pull of it).") from None
    series, generation = lockfile.series(lock), lockfile.generation(lock)
    if series is None or generation is None:
        raise UsageError(f"--continue {previous} is not a private cube with a generation (a "
                         "clear cube, or one written before generations: rekey it first, then "
                         "continue it).")
    if sign_key is None and not policy.trusted():
        raise SignatureError(f"--continue {previous}: its series and generation are read from "
                             "its lock, which only a signature you trust makes yours; pass "
                             "--trusted-key PUB.pem of its signer, or --sign-key KEY if you "
                             "signed it.")
    try:
        _, signer = _signed_by(previous, policy, sign_key, password, progress, resigning=True)
    except (SignatureError, VerificationFailed) as exc:
        raise SignatureError(f"--continue {previous}: it is not signed by a key trusted here "
                             f"({exc}), so its series and generation are whoever pushed it "
                             "last's word; continue only a revision you or a trusted key "
                             "signed (pull it again, or pass --trusted-key of its signer).") \
            from None
    if signer is None:
        raise SignatureError(f"--continue {previous} is not signed by a key trusted here; "
                             "continue only a revision you or a trusted key signed.")
    return series, generation


def _sign(cube: Path, key: str | Path, password: str | None) -> None:
    sign(cube, key, password=password)


def _remember(series: str, key: str | Path, password: str | None, generation: int,
              recipients: list[str], history: list[dict[str, Any]]) -> str:
    """Record the generation this process just signed as seen (with its recipients and who
    its history removed), so this user's later verify, pull or rekey of an older one of the
    same cube refuses it, whatever the endpoint's history says by then. "" when recorded,
    else why not (the cube is written and signed either way)."""
    removed = generations.removed_at(history)
    known = generations.Known(generation, _WRITTEN_HERE,
                              recipients=frozenset(map(generations.fingerprint, recipients)),
                              removed=frozenset(map(generations.fingerprint, removed)))
    return generations.record(generations.of_series(series), generations.keyid(key, password),
                              known)


def rekey(cube_dir: str | Path, identity: str | os.PathLike[str],
          options: RekeyOptions | None = None, **fields: Any) -> EncryptResult:
    """Change a private cube's recipients: decrypt it in memory with ``identity``, then write
    every file again encrypted to the new set, in place and atomically, with the same clear
    content and the same ciphertext names, as the next generation (one above the cube's).

    The settings are a ``RekeyOptions`` (``options``), or its fields as ``fields``.
    The new set is ``to`` (every recipient named: the whole set), or the cube's recipients
    with ``add`` and without ``remove``. The cube's own recipient list is kept only when a
    trusted key signed it (``trusted_keys``, or ``policy``'s, or ``sign_key``'s own public
    half): an unsigned cube's list is whoever pushed last's choice, and must not choose who
    reads the rekeyed cube, so without a trusted signature only ``to`` is accepted.

    A revision older than one this user has seen of the same private cube (a signed generation
    of its series below one a verify, pull, encrypt or rekey here recorded) is refused:
    rekeying a replay would give its readers, some of them removed since, the next
    generation. The recipients a rekey adds back after a generation removed them are
    reported (``readded``).

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
            without ``rotate``), no recipient left, ``to`` with ``add``/``remove``, a policy
            field rekey cannot apply.
        RefusedError: ``identity`` is not a recipient; the cube is older than a generation
            this user has seen.
        SignatureError: ``sign_key`` given and the current signature does not verify under
            it (or ``trusted_keys``), nothing decrypted or written; no trusted signature and
            no ``to``.
        VerificationFailed: ``trusted_keys`` given and no valid signature by one of them.

    Returns:
        an ``EncryptResult``: the recipients now, those added, removed and re-added, and
        the new generation.

    Example:
        ```python
        result = cubepack.rekey("my-cube", "me.key", remove=["age1..."], sign_key="signing.pem")
        print(result.removed, result.generation)
        ```
    """
    return _rekey(Path(cube_dir), identity, RekeyOptions.build(options, **fields))


def _rekey(cube: Path, identity: str | os.PathLike[str], options: RekeyOptions) -> EncryptResult:
    add, remove, to, rotate = options.add, options.remove, options.to, options.rotate
    sign_key, sign_password = options.sign_key, options.sign_password
    trusted_keys, policy = options.trusted_keys, options.policy
    if to and (add or remove):
        raise UsageError("--to names every recipient of the rekeyed cube; it cannot be "
                         "combined with --add or --remove (name the whole set with --to, or "
                         "change the cube's own with --add/--remove).")
    if not add and not remove and not rotate and not to:
        raise UsageError("Nothing to change: pass --add RECIPIENT and/or --remove RECIPIENT, "
                         "or --to RECIPIENT for each recipient of the new set (or --rotate for "
                         "new file keys with the same recipients).")
    policy = _policy(policy, trusted_keys, "rekey")
    if sign_key is not None:
        check_key(sign_key, private=True, password=sign_password)
    named = age.parse_recipients(list(to)) if to else None
    added = age.parse_recipients(list(add)) if add else []
    removed = {r.text for r in age.parse_recipients(list(remove))} if remove else set()
    # Intact ciphertexts (and the signature the policy asks for) before anything is decrypted.
    report, signer = _signed_by(cube, policy, sign_key, sign_password, resigning=True)
    public = report.lock
    assert public is not None  # verified, or _signed_by raised
    signers = _signers(policy, sign_key, sign_password) if signer is not None else {}
    seen = generations.newest_seen(generations.scope(public), signers)
    with open_private(cube, identity, public_lock=report.lock) as opened:
        manifest = opened.manifest
        current, kept, generation = _readers(cube, manifest, named, added, removed, rotate,
                                             signer, seen)
        gained = sorted(set(kept) - set(current))
        lost = sorted(set(current) - set(kept))
        history = generations.with_entry(manifest["history"], generation, gained, lost)
        names = manifest["names"]
        folder = opened.folder
        # The staging folder holds no signing files: the old signature, which cannot cover
        # the new ciphertexts, goes with the swap (and comes back only with sign_key).
        # A cube written before generations gets its series now.
        series = manifest["series"] or generations.new_series()
        result = write_private(cube, opened.lock, manifest["lock"], names,
                               lambda name: mapped_plaintext(resolve_inside(folder, name)),
                               list(kept.values()),
                               hidden=opened.public_lock.encryption.hidden_names,
                               series=series, generation=generation, history=history)
    result.added = gained
    result.removed = lost
    result.readded = generations.readded(manifest["history"], gained,
                                         seen[1] if seen is not None else None)
    if sign_key is not None:
        _sign(cube, sign_key, sign_password)
        result.signed_with = str(sign_key)
        result.unrecorded = _remember(series, sign_key, sign_password, generation,
                                      sorted(kept), history) or None
    return result


def _readers(cube: Path, manifest: dict[str, Any], named: list[Any] | None, added: list[Any],
             removed: set[str], rotate: bool, signer: Any,
             seen: tuple[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(the recipients now, the recipients of the rekeyed cube, its generation): the new set
    as asked, refused when it replays a revision seen, keeps a list no trusted key signed,
    removes a stranger or everyone, or changes nothing."""
    current = {r.text: r for text in manifest["recipients"]
               for r in age.parse_recipients([text])}
    generation = (manifest["generation"] or 0) + 1
    if generation > lockfile.MAX_GENERATION:
        raise UsageError(f"{cube} is at the last generation ({generation - 1}); encrypt "
                         "its clear source afresh to start again (readers who saw it "
                         "refuse a lower one).")
    if seen is not None and seen[1].generation >= generation:
        raise _replay(cube, manifest, seen, signer)
    if not generations.manifest_names_readers(signer) and named is None:
        raise SignatureError(
            f"Refusing to keep the recipients of {cube}: it is not signed by a trusted "
            "key, so its recipient list is the word of whoever wrote it last, and would "
            f"choose who reads the rekeyed cube (its {len(current)} recipient(s) now: "
            f"{', '.join(sorted(current))}). Fix: pass --trusted-key PUB.pem of its "
            "signer (or --sign-key KEY, if you signed it), or name every recipient the "
            "rekeyed cube must have: --to RECIPIENT, once for each.")
    unknown = sorted(removed - set(current))
    if unknown:
        raise UsageError(f"Cannot remove {unknown[0][:60]}: it is not a recipient of this "
                         f"cube (its recipients: {len(current)}).")
    if named is not None:
        kept = {r.text: r for r in named}
    else:
        kept = {text: r for text, r in current.items() if text not in removed}
        for r in added:
            kept.setdefault(r.text, r)
    if not kept:
        raise UsageError("Removing every recipient would leave a cube nobody can open; add "
                         "one (--add) in the same rekey.")
    if set(kept) == set(current) and not rotate and manifest["series"]:
        # (A cube written before generations changes anyway: it gets its series.)
        # Rewriting every file would only re-upload the whole cube on the next push.
        raise UsageError(f"Nothing to change: the cube's {len(current)} recipient(s) "
                         "would stay as they are; nothing was written. Pass --rotate to "
                         "re-encrypt to them under new file keys.")
    return current, kept, generation


def _replay(cube: Path, manifest: dict[str, Any], seen: tuple[str, Any],
            signer: str | None) -> RefusedError:
    """The refusal of a rekey of a revision older than one this user has seen: the replay
    rule's sentence, and the recipients of this revision the newer one does not have (a
    rekey would give each of them the next generation)."""
    by, newer = seen
    extra = [text for text in sorted(manifest["recipients"])
             if newer.recipients is not None
             and generations.fingerprint(text) not in newer.recipients]
    return RefusedError(
        f"Refusing to rekey {cube}: "
        + generations.older(manifest["generation"], str(signer), newer, by)
        + (f". A rekey of it would re-add {', '.join(extra)}: not a recipient of generation "
           f"{newer.generation}" if extra else "")
        + (f". This client never saw the recipients of generation {newer.generation}: any "
           "recipient of this revision may be one it removed" if newer.recipients is None
           else "")
        + ". Nothing was written.")
