"""A private cube's generation: the replay rule, what this user has seen, the recipient history.

A private cube carries a series and a generation (issue #37): ``encrypt`` draws a new series
(a random id: this private cube, whoever else encrypts the same clear cube) at generation 1,
or continues one (``--continue``); each ``rekey`` keeps the series and adds one to the
generation. Both are public (the lock's ``encryption`` section) and signed with the lock, and
the encrypted manifest repeats them with the recipient history (who each generation added and
removed). The rule, in one place: **a revision of a series whose generation, signed by a
trusted key, is lower than another of the same series signed by a trusted key is older**;
loading it (a replay: an older revision pushed back, e.g. after a reader was removed) or
rekeying it is refused. An unsigned generation, or one no trusted key signed, is a claim:
compared with nothing.

Where a newer revision can be known from:

- what this user has seen (:func:`seen_check`): every verify, pull, encrypt and rekey that
  establishes a trusted signature over a generation records it under ``$CUBEPACK_CACHE/
  generations/`` (one file a series; the newest per signing key; atomic writes under a file
  lock). A fresh client has seen nothing;
- the branches' commit history on the endpoint (:func:`history_check`, run by the Hub layer:
  pull and ``verify --remote``): every commit's lock (and the attestation of one claiming a
  newer generation). A writer who rewrites or squashes the history removes what it would
  find; only what this user has seen survives that.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._util import atomic, canonical, constants
from .._util.checks import Catalogue
from ..errors import CubepackError, FormatError
from ..format import _lock as lockfile
from ..format._envelope import parse_envelope_bytes
from ._age import canonical_recipient
from ._attestation import signed_by
from ._report import Check

__all__ = ["Known", "claimed_generation", "fingerprint", "history_check", "keyid",
           "new_series", "newest_seen", "of_series", "older", "readded", "record", "remember",
           "scope", "seen_check",
           "signed_generation", "skip_reason", "trusted_ids", "with_entry"]

#: The checks this module makes (a report's ``replay`` lines).
_CHECK = Catalogue.REPLAY
_FORMAT = "cubepack.seen-generations"
_VERSION = 1
_ENTRY_KEYS = frozenset({"generation", "where", "commit", "recorded", "recipients", "removed"})
_FOLDER = "generations"
#: What a fresh client cannot check, said wherever it could not.
SQUASH = ("a writer who rewrites or squashes the branch's history removes the newer revisions "
          "the history walk would find: only generations this client has seen survive that")


@dataclass(frozen=True)
class Known:
    """A generation of a cube some trusted key signed, and where it was seen. ``recipients``
    and ``removed``: sha256 of each recipient's text (:func:`fingerprint`) of that generation,
    and of every recipient its history removed, when whoever recorded it could read them."""

    generation: int
    where: str
    commit: str | None = None
    recorded: str | None = None
    recipients: frozenset[str] | None = None
    removed: frozenset[str] | None = None


def fingerprint(recipient: str) -> str:
    """How a record names a recipient: the sha256 of its text (a public key; not kept in
    clear in the user's cache, which a reader of the disk could list)."""
    return hashlib.sha256(recipient.encode("utf-8")).hexdigest()


def keyid(key: str | os.PathLike[str], password: str | None = None) -> str:
    """The signer's id of a key file: sha256 of the DER SubjectPublicKeyInfo of a public PEM
    key, or of a private key's public half (the attestation's ``keyid``)."""
    from cryptography.hazmat.primitives import serialization

    data = Path(key).read_bytes()
    if b"PRIVATE KEY" in data:
        public = serialization.load_pem_private_key(
            data, password.encode() if password else None).public_key()
    else:
        public = serialization.load_pem_public_key(data)
    return hashlib.sha256(public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).hexdigest()


def scope(lock: dict[str, Any]) -> dict[str, str] | None:
    """What a record is kept for: the private cube's series, or None (written before
    generations: nothing to compare)."""
    return of_series(lockfile.series(lock))


def of_series(series: str | None) -> dict[str, str] | None:
    """The record's key of ``series`` (None: none)."""
    return {"series": series} if series is not None else None


def new_series() -> str:
    """A new series: 128 random bits, as the lock writes them."""
    import secrets

    return secrets.token_hex(16)


# --- the records --------------------------------------------------------------------------------

def _path(where: dict[str, str]) -> Path:
    name = hashlib.sha256(canonical.dumps(where).encode("utf-8")).hexdigest()[:32]
    return constants.cache_dir() / _FOLDER / f"{name}.json"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One writer of a record at a time (a read, then a write): two processes recording at
    once would otherwise drop the higher generation."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _read(where: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The record's entries (signer keyid -> entry); none when there is no record.

    Raises:
        FormatError: the record is not one cubepack wrote (naming the file and the fix).
    """
    path = _path(where)
    if not path.is_file():
        return {}
    try:
        record = canonical.loads_strict(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise FormatError(f"The record of the generations seen, {path}, cannot be read "
                          f"({exc.strerror}); make it readable, or remove it (what it recorded "
                          "is lost).") from None
    except (UnicodeDecodeError, ValueError):
        record = None
    signers = record.get("signers") if isinstance(record, dict) else None
    if not (isinstance(record, dict) and record.get("format") == _FORMAT
            and record.get("version") == _VERSION and record.get("scope") == where
            and isinstance(signers, dict)
            and all(isinstance(entry, dict) and set(entry) == _ENTRY_KEYS
                    and type(entry["generation"]) is int for entry in signers.values())):
        raise FormatError(f"The record of the generations seen, {path}, is not one cubepack "
                          "wrote; remove it (what it recorded is lost: the next verify or "
                          "pull records again).")
    return signers


def _known(entry: dict[str, Any]) -> Known:
    return Known(entry["generation"], entry["where"], entry["commit"], entry["recorded"],
                 None if entry["recipients"] is None else frozenset(entry["recipients"]),
                 None if entry["removed"] is None else frozenset(entry["removed"]))


def newest_seen(where: dict[str, str] | None,
                signers: dict[str, str]) -> tuple[str, Known] | None:
    """The highest generation this user has recorded for ``where`` signed by one of
    ``signers`` (keyid -> key file, the keys trusted now), with that key file; or None.
    Raises FormatError (see _read)."""
    if where is None:
        return None
    entries = [(signers[key], _known(entry)) for key, entry in _read(where).items()
               if key in signers]
    return max(entries, key=lambda pair: pair[1].generation, default=None)


def trusted_ids(keys: list[str]) -> dict[str, str]:
    """keyid -> key file, for the keys a caller trusts (public PEM files)."""
    return {keyid(key): str(key) for key in keys}


def remember(where: dict[str, str] | None, signer: str, known: Known) -> None:
    """Record that ``signer`` (a keyid) signed ``known`` for ``where``: kept when it is the
    highest generation recorded for that signer (or the same one, now with its recipients)."""
    if where is None:
        return
    path = _path(where)
    with _locked(path):
        signers = _read(where)
        old = signers.get(signer)
        if old is not None and (old["generation"] > known.generation or (
                old["generation"] == known.generation
                and (known.recipients is None or old["recipients"] is not None))):
            return
        signers[signer] = {
            "generation": known.generation, "where": known.where, "commit": known.commit,
            "recorded": known.recorded or datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%d %H:%M UTC"),
            "recipients": None if known.recipients is None else sorted(known.recipients),
            "removed": None if known.removed is None else sorted(known.removed)}
        atomic.write_text(path, canonical.dumps({"format": _FORMAT, "version": _VERSION,
                                                 "scope": where, "signers": signers}))


def record(where: dict[str, str] | None, signer: str, known: Known) -> str:
    """:func:`remember`, saying instead of raising when it could not write the record (a
    read-only cache must not refuse a cube): "" when recorded, else a note for the check."""
    try:
        remember(where, signer, known)
    except (OSError, CubepackError) as exc:
        return (f" (not recorded in {constants.cache_dir() / _FOLDER}: {exc}; a later squash "
                "of the history would hide it from this client)")
    return ""


# --- the recipient history ----------------------------------------------------------------------

def with_entry(history: list[dict[str, Any]], generation: int, added: list[str],
               removed: list[str]) -> list[dict[str, Any]]:
    """``history`` and the entry of ``generation``: the recipients it added and removed."""
    return [*history, {"generation": generation, "added": sorted(added),
                       "removed": sorted(removed)}]


def removed_at(history: list[dict[str, Any]]) -> dict[str, int]:
    """Each recipient whose last change in ``history`` removed it -> that generation."""
    last: dict[str, int | None] = {}
    for entry in history:  # by the key, however the record spelled it
        for recipient in entry["added"]:
            last[canonical_recipient(recipient)] = None
        for recipient in entry["removed"]:
            last[canonical_recipient(recipient)] = entry["generation"]
    return {recipient: at for recipient, at in last.items() if at is not None}


def readded(history: list[dict[str, Any]], recipients: list[str],
            known: Known | None = None) -> list[dict[str, Any]]:
    """The recipients of ``recipients`` that a generation removed and none added back since
    (``history``), or that ``known`` (a newer generation this user saw) records as removed:
    ``[{"recipient", "removed_at"}]`` (``removed_at`` None: removed by ``known``'s history,
    at a generation it does not say)."""
    gone = removed_at(history)
    found = []
    for recipient in sorted(recipients):
        if recipient in gone:
            found.append({"recipient": recipient, "removed_at": gone[recipient]})
        elif known is not None and known.removed and fingerprint(recipient) in known.removed:
            found.append({"recipient": recipient, "removed_at": None})
    return found


# --- the checks ---------------------------------------------------------------------------------

def claimed_generation(lock_bytes: bytes, series: str) -> int | None:
    """The generation another revision's lock claims in ``series`` (None: not a readable
    private lock of that series). A claim: only worth checking the signature of when it is
    higher than the revision at hand."""
    try:
        lock = lockfile.parse(lock_bytes)
    except CubepackError:
        return None
    return lockfile.generation(lock) if lockfile.series(lock) == series else None


def signed_generation(lock_bytes: bytes, envelope: bytes, trusted: list[str],
                      series: str) -> tuple[int, str] | None:
    """(generation, trusted key) of another revision of ``series``, from its lock file's
    bytes and its attestation's (``cubepack.intoto.json``), when a trusted key signed that
    attestation and its subject is that lock; else None (another series, unsigned, signed by
    a key not trusted, malformed). The attestation's subject is the lock's sha256, so one
    signature binds the generation."""
    generation = claimed_generation(lock_bytes, series)
    try:
        statement = parse_envelope_bytes(envelope, "cubepack.intoto.json")
    except CubepackError:
        return None
    if generation is None or \
            statement.subject_sha256 != hashlib.sha256(lock_bytes).hexdigest():
        return None
    key = signed_by(statement, tuple(trusted))
    return (generation, key) if key is not None else None


def skip_reason(lock: dict[str, Any], key: str | None) -> str | None:
    """Why no generation of the private cube ``lock`` (signed by trusted key ``key``, or None)
    can be compared, or None when it can (then a history is worth walking)."""
    if lockfile.generation(lock) is None or lockfile.series(lock) is None:
        # The fix that works: a signed cube's rekey keeps its readers; an unsigned one's
        # recipients are whoever wrote it last's word, so each reader is named (--to).
        fix = ("cubepack rekey CUBE --identity IDENTITY --rotate --sign-key SIGNING_KEY"
               if key is not None else  # unsigned: no signature to re-sign, readers named
               "cubepack rekey CUBE --identity IDENTITY --to RECIPIENT (once for each "
               "reader), then cubepack sign CUBE --key SIGNING_KEY")
        return ("skipped: written before private cubes had generations (its lock's encryption "
                "section is version 1), so no revision of it can be told older than another; "
                f"rekey it to give it one ({fix})")
    if key is None:
        return (f"skipped: generation {lockfile.generation(lock)} is its signer's word: "
                "without a signature by a trusted key (--trusted-key PUB.pem) no revision can "
                "be told older than another")
    return None


def older(generation: int | None, key: str, newer: Known, by: str) -> str:
    """The sentence of a replay: generation ``generation`` (signed by ``key``; None: a cube
    written before generations) is older than ``newer``, signed by trusted key ``by``; and
    where the newest is."""
    this = f"generation {generation}" if generation is not None else \
        "this revision, written before generations,"
    return (f"{this} (signed by trusted key {key}) is older than generation "
            f"{newer.generation} of this private cube (its series), signed by trusted key "
            f"{by}, {newer.where}" + (f" (recorded {newer.recorded})" if newer.recorded else "")
            + ": an older revision pushed back (a replay) can still be read by a reader "
              "removed since, and loading it rolls the memories back. The newest known is "
              f"generation {newer.generation}"
            + (f", at commit {newer.commit}" if newer.commit else ""))


def seen_check(lock: dict[str, Any], key: str | None, trusted: list[str], *,
               where: str) -> Check:
    """The ``replay`` check of a private cube against what this user has seen, then the
    record of its generation when a trusted key (``key``, one of ``trusted``) signed it.
    ``where``: how the record will say it was seen (``"in a verify of DIR"``)."""
    generation = lockfile.generation(lock)
    subject = "generations seen by this client"
    skipped = skip_reason(lock, key)
    if skipped is not None:
        return Check(_CHECK, subject, None, skipped)
    assert key is not None and generation is not None
    at = scope(lock)
    try:
        seen = newest_seen(at, trusted_ids([*trusted, key]))
    except CubepackError as exc:
        return Check(_CHECK, subject, False, str(exc))
    note = record(at, keyid(key), Known(generation, where))
    by, newest = seen if seen is not None else (key, None)
    if newest is not None and newest.generation > generation:
        return Check(_CHECK, subject, False, older(generation, key, newest, by) + note,
                     f"generation {newest.generation} or newer", f"generation {generation}")
    if newest is None:
        return Check(_CHECK, subject, True, f"generation {generation}, signed by trusted key "
                     f"{key}: this client had seen no generation of this cube before, so only "
                     "the endpoint's history (walked by pull and verify --remote) can show a "
                     f"newer one, and {SQUASH}{note}")
    return Check(_CHECK, subject, True, f"generation {generation}, signed by trusted key {key}, "
                 f"is the newest this client has seen of this cube (it saw generation "
                 f"{newest.generation} {newest.where}){note}")


def history_check(lock: dict[str, Any], key: str | None, found: list[tuple[int, str, str]],
                  *, walked: int, where: str) -> Check:
    """The ``replay`` check of a private cube against the signed revisions of its series that
    the endpoint's history holds with a higher generation: ``found``, (generation, commit,
    trusted key) of each, out of ``walked`` commits of ``where`` (the branches and endpoint,
    for the message). The newest found is recorded as seen (a later squash cannot take it from
    this user)."""
    generation = lockfile.generation(lock)
    subject = f"history of {where}"
    skipped = skip_reason(lock, key)
    if skipped is not None:
        return Check(_CHECK, subject, None, skipped)
    assert key is not None and generation is not None
    newest = max(found, default=None)
    if newest is not None and newest[0] > generation:
        known = Known(newest[0], f"at commit {newest[1]} of {where}", newest[1])
        note = record(scope(lock), keyid(newest[2]), known)
        return Check(_CHECK, subject, False, older(generation, key, known, newest[2]) + note,
                     f"generation {newest[0]} or newer", f"generation {generation}")
    return Check(_CHECK, subject, True, f"generation {generation}: none of the {walked} "
                 "commit(s) walked holds a newer generation of this private cube signed by a "
                 f"trusted key; {SQUASH}")


def manifest_names_readers(signed_by: str | None) -> bool:
    """May a private cube's manifest choose who reads a re-encryption of its memories (a
    ``rekey`` keeping its recipients, a MemOS dump of what it held)? Only when a trusted key's
    signature covered the cube (``signed_by``: the signature covers the public lock, which pins
    the manifest's ciphertext). An unsigned (or untrusted) manifest is whoever wrote it last's
    word: the user names the readers instead. The one owner of that rule."""
    return signed_by is not None
