"""Signed in-toto attestations of a cube (DSSE envelopes) and the lineage chain they form.

A cube's attestation, ``cubepack.intoto.json``, is an in-toto Statement v1 in a DSSE envelope:

- subject: ``[{"name": "cubepack.lock", "digest": {"sha256": <sha256 of the lock file's
  bytes>}}]``: what anyone can recompute with ``sha256sum cubepack.lock``;
- predicate (:data:`PREDICATE_TYPE`): derived from that lock alone (:func:`predicate_for`): the
  lock's own digests, the producer pins, the parent cube (the lock's ``lineage.parent``), what
  pack or migrate proved (activations ``recomputed``, items re-tokenised, memories re-embedded
  and by which embedder), and the signer's cubepack version;
- signed over DSSE's pre-authentication encoding (:func:`pae`) with the ECDSA key of ``cubepack
  sign`` (P-256 with SHA-256, P-384 with SHA-384; DER signatures); ``keyid`` is the sha256 of
  the public key's DER SubjectPublicKeyInfo, a hint only: every trusted key is tried.

A derived cube links to its parent by the parent lock's ``digest`` (``lineage.parent.lock_digest``),
which the parent's attestation states as ``predicate.cube.lock_digest`` next to the subject (its
lock bytes) it vouches for. ``lineage/ancestors.intoto.json`` holds the parent's envelope, then
the grandparent's, and so on (:func:`chain_checks` follows them to a root).

Parsing is strict (bounded sizes, strict JSON without duplicate keys, exact keys and types):
pack and verify read both files with it (:mod:`._content`). No torch, no HTTP; ``cryptography``
only to sign or check a signature.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._util import canonical, constants
from .._util.revision import is_commit
from .._version import __version__
from ..errors import CubepackError, FormatError
from . import _lock as lockfile
from ._keys import check_key
from ._provenance import KINDS, RECOMPUTED
from ._report import PROVED, Check

__all__ = ["PREDICATE_TYPE", "Envelope", "attest", "attestation_check", "chain_checks", "key_id",
           "pae", "predicate_for", "read_ancestors", "read_envelope", "signed_by",
           "statement_for"]

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
#: The predicate this module writes and reads (version 1 of its layout).
PREDICATE_TYPE = "https://cubepack.dev/attestation/cube/v1"
SUBJECT_NAME = constants.LOCK_FILENAME
#: Limits on what is read before it is trusted: an envelope's file, the ancestors' file, the
#: signatures of one envelope, the envelopes of a chain.
MAX_ENVELOPE_BYTES = 16 * 1024 * 1024
MAX_ANCESTORS_BYTES = 64 * 1024 * 1024
MAX_SIGNATURES = 16
MAX_CHAIN = 256
_HEX64 = re.compile(r"[0-9a-f]{64}")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_PARENT_KEYS = ("lock_digest", "content_digest", "cube_id", "repo_id", "revision")


@dataclass(frozen=True)
class Envelope:
    """A parsed DSSE envelope: its payload bytes, signatures (keyid, signature bytes) and the
    in-toto Statement the payload holds (validated, not yet trusted)."""

    payload: bytes
    signatures: tuple[tuple[str, bytes], ...]
    statement: dict[str, Any]

    @property
    def predicate(self) -> dict[str, Any]:
        return self.statement["predicate"]

    @property
    def subject_sha256(self) -> str:
        return self.statement["subject"][0]["digest"]["sha256"]

    @property
    def keyids(self) -> list[str]:
        return [keyid for keyid, _ in self.signatures]


# --- building -----------------------------------------------------------------------------------

def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what is signed (the type cannot be swapped)."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def predicate_for(lock: dict[str, Any]) -> dict[str, Any]:
    """The predicate a lock gives: everything in it is read from the (parsed) lock.

    Raises:
        FormatError: the lock's lineage section has a field of another type than the shared
            format's (so the attestation would not parse).
    """
    lineage = lock.get("lineage") or {}
    changes = lineage.get("changes") or {}
    if not isinstance(changes, dict) or not isinstance(lineage.get("parent"), (dict, type(None))):
        raise FormatError("cubepack.lock lineage must hold a parent object (or none) and a "
                          "changes object; the attestation cannot state it otherwise.")
    producers = {}
    for role, pin in sorted(lock["models"].items()):
        identity = pin.get("identity")
        if isinstance(identity, dict):
            producers[role] = {"repo_id": pin.get("repo_id"), "revision": pin.get("revision"),
                               "weights_digest": identity.get("weights_digest"),
                               "dtype": identity.get("dtype")}
    recomputed = {}
    provenance = {}
    for item_id, entry in sorted(lock["activations"].items()):
        kind = (entry.get("provenance") or {}).get("kind")
        provenance[item_id] = kind
        if kind == RECOMPUTED:  # by the pinned producer: pack and migrate recompute with it
            pin = lock["models"][entry["model_role"]]
            recomputed[item_id] = {"model_role": entry["model_role"],
                                   "weights_digest": pin["identity"]["weights_digest"],
                                   "tokens": entry["token_count"]}
    parent = lineage.get("parent")
    embedder = changes.get("embedder")
    retokenized = changes.get("retokenized") or []
    if isinstance(retokenized, list) and all(isinstance(item, str) for item in retokenized):
        retokenized = sorted(retokenized)  # otherwise left as found, for the check to name
    predicate = {
        "cube": {"cube_id": lock["cube_id"], "lock_digest": lock["digest"],
                 "content_digest": lock["content_digest"]},
        "producers": producers,
        "parent": {key: parent.get(key) for key in _PARENT_KEYS}
        if isinstance(parent, dict) else None,
        "proved": {"provenance": provenance, "recomputed": recomputed,
                   "retokenized": retokenized,
                   "reembedded": changes.get("reembedded") or 0,
                   "embedder": {"from": embedder.get("from"), "to": embedder.get("to")}
                   if isinstance(embedder, dict) else None},
        "cubepack_version": __version__,
    }
    _check_predicate(predicate, "the lock's attestation predicate")
    return predicate


def statement_for(lock: dict[str, Any], lock_bytes: bytes) -> dict[str, Any]:
    """The in-toto Statement for the lock ``lock`` parsed from ``lock_bytes``."""
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": SUBJECT_NAME,
                         "digest": {"sha256": hashlib.sha256(lock_bytes).hexdigest()}}],
            "predicateType": PREDICATE_TYPE, "predicate": predicate_for(lock)}


def sign_statement(statement: dict[str, Any], key: str | os.PathLike[str], *,
                   password: str | None = None) -> dict[str, Any]:
    """A DSSE envelope of ``statement`` signed with the ECDSA private key ``key`` (PEM; the
    caller has checked it with :func:`~._signing.check_key`)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private = serialization.load_pem_private_key(Path(key).read_bytes(),
                                                 password.encode() if password else None)
    payload = canonical.dumps(statement, compact=True).encode("ascii")
    signature = private.sign(pae(PAYLOAD_TYPE, payload), ec.ECDSA(_hash_for(private.curve)))
    return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode("ascii"),
            "signatures": [{"keyid": _key_id(private.public_key()),
                            "sig": base64.b64encode(signature).decode("ascii")}]}


def envelope_bytes(envelope: dict[str, Any]) -> bytes:
    return canonical.dumps(envelope).encode("ascii")


def attest(lock_bytes: bytes, key: str | os.PathLike[str], *,
           password: str | None = None) -> bytes:
    """The bytes of ``cubepack.intoto.json`` for the lock file ``lock_bytes``, signed by
    ``key``; parsed back before they are returned (nothing is written that would not read)."""
    statement = statement_for(lockfile.parse(lock_bytes), lock_bytes)
    data = envelope_bytes(sign_statement(statement, key, password=password))
    parse_envelope_bytes(data, constants.ATTESTATION_FILENAME)
    return data


def _hash_for(curve: Any) -> Any:
    from cryptography.hazmat.primitives import hashes

    return hashes.SHA384() if curve.name == "secp384r1" else hashes.SHA256()


def _key_id(public: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    return hashlib.sha256(public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).hexdigest()


def key_id(public_key: str | os.PathLike[str]) -> str:
    """The keyid of a public key file (PEM): sha256 of its DER SubjectPublicKeyInfo."""
    from cryptography.hazmat.primitives import serialization

    return _key_id(serialization.load_pem_public_key(Path(public_key).read_bytes()))


# --- parsing ------------------------------------------------------------------------------------

def read_envelope(path: Path, name: str = constants.ATTESTATION_FILENAME) -> Envelope:
    """Parse ``cubepack.intoto.json`` strictly. Raises FormatError naming what is wrong."""
    return parse_envelope_bytes(_read_bounded(path, name, MAX_ENVELOPE_BYTES), name)


def read_ancestors(path: Path, name: str = constants.ANCESTORS_FILENAME) -> list[Envelope]:
    """Parse ``lineage/ancestors.intoto.json`` (``{"envelopes": [...]}``, parent first)."""
    document = _loads(_read_bounded(path, name, MAX_ANCESTORS_BYTES), name)
    if not isinstance(document, dict) or set(document) != {"envelopes"} or \
            not isinstance(document["envelopes"], list) or not document["envelopes"]:
        raise FormatError(f'{name} must be {{"envelopes": [a DSSE envelope, ...]}}, parent first.')
    if len(document["envelopes"]) > MAX_CHAIN:
        raise FormatError(f"{name} holds {len(document['envelopes'])} envelopes; at most "
                          f"{MAX_CHAIN} are read.")
    return [parse_envelope(value, f"{name} envelope {index + 1}")
            for index, value in enumerate(document["envelopes"])]


def check_file(path: Path, name: str) -> None:
    """The content check of both files (see :mod:`._content`)."""
    if name == constants.ANCESTORS_FILENAME:
        read_ancestors(path, name)
    else:
        read_envelope(path, name)


def parse_envelope_bytes(data: bytes, where: str) -> Envelope:
    return parse_envelope(_loads(data, where), where)


def parse_envelope(value: Any, where: str) -> Envelope:
    """Validate a decoded DSSE envelope and the Statement in its payload (exact keys, types)."""
    if not isinstance(value, dict) or set(value) != {"payloadType", "payload", "signatures"}:
        raise FormatError(f"{where} must be a DSSE envelope with exactly payloadType, payload "
                          "and signatures.")
    if value["payloadType"] != PAYLOAD_TYPE:
        raise FormatError(f"{where} payloadType must be {PAYLOAD_TYPE}, found "
                          f"{_short(value['payloadType'])}.")
    signatures = value["signatures"]
    if not isinstance(signatures, list) or not 1 <= len(signatures) <= MAX_SIGNATURES:
        raise FormatError(f"{where} must hold 1 to {MAX_SIGNATURES} signatures.")
    parsed = []
    for index, entry in enumerate(signatures):
        if not isinstance(entry, dict) or set(entry) != {"keyid", "sig"} or \
                not isinstance(entry["keyid"], str) or len(entry["keyid"]) > 256:
            raise FormatError(f"{where} signature {index + 1} must be {{keyid: str, sig: "
                              "base64}}.")
        parsed.append((entry["keyid"], _base64(entry["sig"], f"{where} signature {index + 1}")))
    payload = _base64(value["payload"], f"{where} payload")
    statement = _loads(payload, f"{where} payload")
    _check_statement(statement, f"{where} statement")
    return Envelope(payload, tuple(parsed), statement)


def _read_bounded(path: Path, name: str, limit: int) -> bytes:
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise FormatError(f"{name} is larger than {limit} bytes; refused unread.")
    return data


def _loads(data: bytes, where: str) -> Any:
    try:
        return canonical.loads_strict(data, object_pairs_hook=canonical.unique_pairs)
    except (UnicodeDecodeError, ValueError) as exc:  # DuplicateKey and LimitError included
        raise FormatError(f"{where} is not strict JSON: {exc}.") from exc


def _base64(text: Any, where: str) -> bytes:
    if not isinstance(text, str) or len(text) % 4 or not _BASE64.fullmatch(text):
        raise FormatError(f"{where} must be standard padded base64.")
    try:
        data = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise FormatError(f"{where} is not valid base64: {exc}.") from exc
    if base64.b64encode(data).decode("ascii") != text:  # one spelling per bytes: no malleable file
        raise FormatError(f"{where} must be canonical base64 (its padding bits are not zero).")
    return data


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _require(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise FormatError(f"{where}: {what}.")


def _exact(value: Any, keys: set[str], where: str) -> None:
    _require(isinstance(value, dict) and set(value) == keys, where,
             f"must be an object with exactly {', '.join(sorted(keys))}")


def _text(value: Any, nullable: bool = False) -> bool:
    return isinstance(value, str) or (nullable and value is None)


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


def _check_statement(statement: Any, where: str) -> None:
    _exact(statement, {"_type", "subject", "predicateType", "predicate"}, where)
    _require(statement["_type"] == STATEMENT_TYPE, where, f"_type must be {STATEMENT_TYPE}")
    _require(statement["predicateType"] == PREDICATE_TYPE, where,
             f"predicateType must be {PREDICATE_TYPE}, found "
             f"{_short(statement['predicateType'])}")
    subject = statement["subject"]
    _require(isinstance(subject, list) and len(subject) == 1, where,
             "subject must name exactly one artifact (the lock)")
    _exact(subject[0], {"name", "digest"}, f"{where} subject")
    _require(subject[0]["name"] == SUBJECT_NAME, where, f"the subject must be {SUBJECT_NAME}")
    _exact(subject[0]["digest"], {"sha256"}, f"{where} subject digest")
    _require(_hex64(subject[0]["digest"]["sha256"]), where,
             "the subject's sha256 must be 64 lower-case hex digits")
    _check_predicate(statement["predicate"], f"{where} predicate")


def _check_predicate(predicate: Any, where: str) -> None:
    _exact(predicate, {"cube", "producers", "parent", "proved", "cubepack_version"}, where)
    cube = predicate["cube"]
    _exact(cube, {"cube_id", "lock_digest", "content_digest"}, f"{where} cube")
    _require(_text(cube["cube_id"], True) and _hex64(cube["lock_digest"])
             and _hex64(cube["content_digest"]), f"{where} cube",
             "cube_id is a string or null, both digests 64 hex")
    producers = predicate["producers"]
    _require(isinstance(producers, dict), where, "producers must be an object")
    for role, pin in producers.items():
        _exact(pin, {"repo_id", "revision", "weights_digest", "dtype"},
               f"{where} producer {role!r}")
        _require(_text(pin["repo_id"], True) and (pin["revision"] is None
                                                  or is_commit(pin["revision"]))
                 and _text(pin["weights_digest"]) and _text(pin["dtype"]),
                 f"{where} producer {role!r}", "repo_id and a 40-hex revision or null, "
                 "weights_digest and dtype strings")
    parent = predicate["parent"]
    if parent is not None:
        _exact(parent, set(_PARENT_KEYS), f"{where} parent")
        _require(_hex64(parent["lock_digest"]) and _hex64(parent["content_digest"])
                 and _text(parent["cube_id"], True) and _text(parent["repo_id"], True)
                 and (parent["revision"] is None or is_commit(parent["revision"])),
                 f"{where} parent", "both digests 64 hex, cube_id and repo_id strings or null, "
                 "revision 40 hex or null")
    proved = predicate["proved"]
    _exact(proved, {"provenance", "recomputed", "retokenized", "reembedded", "embedder"},
           f"{where} proved")
    _require(isinstance(proved["provenance"], dict)
             and all(kind in KINDS for kind in proved["provenance"].values()),
             f"{where} proved.provenance", f"item -> one of {', '.join(KINDS)}")
    _require(isinstance(proved["recomputed"], dict), f"{where} proved.recomputed",
             "must be an object")
    for item_id, entry in proved["recomputed"].items():
        _exact(entry, {"model_role", "weights_digest", "tokens"},
               f"{where} proved.recomputed {item_id!r}")
        _require(_text(entry["model_role"]) and _text(entry["weights_digest"])
                 and type(entry["tokens"]) is int and entry["tokens"] >= 0
                 and proved["provenance"].get(item_id) == RECOMPUTED,
                 f"{where} proved.recomputed {item_id!r}",
                 "model_role and weights_digest strings, tokens a count, the item labelled "
                 "recomputed")
    _require(isinstance(proved["retokenized"], list)
             and all(isinstance(item, str) for item in proved["retokenized"]),
             f"{where} proved.retokenized", "must be a list of item ids")
    _require(type(proved["reembedded"]) is int and proved["reembedded"] >= 0,
             f"{where} proved.reembedded", "must be a count")
    embedder = proved["embedder"]
    if embedder is not None:
        _exact(embedder, {"from", "to"}, f"{where} proved.embedder")
        _require(_text(embedder["from"], True) and _text(embedder["to"], True),
                 f"{where} proved.embedder", "from and to are labels or null")
    _require(_text(predicate["cubepack_version"]), where, "cubepack_version must be a string")


# --- checking -----------------------------------------------------------------------------------

def signed_by(envelope: Envelope, trusted_keys: list[str] | tuple[str, ...]) -> str | None:
    """The first trusted public key (a PEM path) whose signature over the envelope's PAE
    verifies, or None. The envelope's keyids are hints, never trusted: every key is tried."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    message = pae(PAYLOAD_TYPE, envelope.payload)
    for key in trusted_keys:
        check_key(key, private=False)
        public = serialization.load_pem_public_key(Path(key).read_bytes())
        for _, signature in envelope.signatures:
            try:
                public.verify(signature, message, ec.ECDSA(_hash_for(public.curve)))
                return str(key)
            except InvalidSignature:
                continue
    return None


def _refusal(name: str, subject: str, detail: str, expected: Any = None,
             found: Any = None) -> Check:
    """A failed check no trusted signature stands behind (an absent, malformed or untrusted
    envelope, a missing link): its basis is what this process found, never ``signed``."""
    return Check(name, subject, False, detail, expected, found, basis=PROVED)


def _untrusted(envelope: Envelope, trusted_keys: tuple[str, ...]) -> tuple[str, str]:
    """(expected, found) for an envelope no trusted key signed."""
    wanted = ", ".join(f"{key} (keyid {key_id(key)[:16]})" for key in trusted_keys)
    # A keyid is the envelope author's text: shown raw only when it is hex, else quoted.
    keyids = ", ".join(k[:16] if _hex64(k) else _short(k) for k in envelope.keyids)
    return (f"a signature by a trusted key: {wanted}",
            f"signatures by keyid {keyids}, none valid under a trusted key")


def predicate_mismatches(predicate: dict[str, Any],
                         lock: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, what the lock gives, what the predicate says) for each field that differs; the
    signer's cubepack version is theirs to state."""
    expected = predicate_for(lock)
    found = []
    for key in sorted(set(expected) - {"cubepack_version"}):
        if key == "producers":
            for role in sorted(set(expected[key]) | set(predicate[key])):
                if expected[key].get(role) != predicate[key].get(role):
                    found.append((f"predicate.producers.{role}", expected[key].get(role),
                                  predicate[key].get(role)))
        elif expected[key] != predicate[key]:
            found.append((f"predicate.{key}", expected[key], predicate[key]))
    return found


def attestation_check(cube: Path, lock: dict[str, Any], lock_sha256: str,
                      trusted_keys: tuple[str, ...], required: bool
                      ) -> tuple[list[Check], Envelope | None, str | None]:
    """The ``attestation`` checks of one cube, the envelope when it verified, and its key.

    Present and trusted keys given: the envelope must be signed by one of them, name this lock
    (sha256 of its bytes) and agree with it. ``required`` (``--require-lineage``): an absent
    attestation, or one that cannot be checked for want of keys, is a failure, never a skip.
    """
    name = constants.ATTESTATION_FILENAME
    path = cube / name
    if path.is_dir() and not path.is_symlink():  # signing would fail on it, half-way
        return [_refusal("attestation", name, "a folder sits where the cube's attestation "
                         "belongs; remove it", "absent or a regular file", "a folder")], None, None
    if not path.is_file() or path.is_symlink():
        if required:
            return [_refusal("attestation", name, "missing: the cube carries no signed "
                             "attestation, and lineage is required (--require-lineage); ask its "
                             "publisher to sign it (cubepack sign)", "a DSSE envelope signed by a "
                             "trusted key", "absent")], None, None
        return [Check("attestation", name, None, "skipped: the cube carries no attestation")], \
            None, None
    if not trusted_keys:
        return [Check("attestation", name, None, "skipped: no trusted key given")], None, None
    try:
        envelope = read_envelope(path)
    except CubepackError as exc:
        return [_refusal("attestation", name, str(exc))], None, None
    key = signed_by(envelope, trusted_keys)
    if key is None:
        expected, found = _untrusted(envelope, trusted_keys)
        return [_refusal("attestation", name, "not signed by a trusted key (or its payload "
                         "was changed after signing)", expected, found)], None, None
    if envelope.subject_sha256 != lock_sha256:
        return [Check("attestation", name, False, f"signed by trusted key {key}, but its "
                      "subject is another lock (moved from another cube, or the lock changed "
                      "after signing)", f"subject sha256 {lock_sha256} (this cubepack.lock)",
                      f"subject sha256 {envelope.subject_sha256}", basis="signed")], None, None
    try:
        differences = predicate_mismatches(envelope.predicate, lock)
    except CubepackError as exc:  # a lineage section the predicate cannot state
        return [_refusal("attestation", name, str(exc))], None, None
    if differences:
        return [Check("attestation", f"{name} {field}", False, f"signed by trusted key {key}, "
                      "but its predicate disagrees with this lock", expected, found,
                      basis="signed") for field, expected, found in differences], None, None
    return [Check("attestation", name, True, f"signed by trusted key {key}: its subject is this "
                  f"cubepack.lock (sha256 {lock_sha256}) and its predicate (pins, parent, what "
                  "was proved) agrees with the lock", basis="signed")], envelope, key


def chain_checks(cube: Path, lock: dict[str, Any], own: Envelope | None,
                 trusted_keys: tuple[str, ...]) -> list[Check]:
    """The ``lineage`` checks of ``--require-lineage``: the cube's own attestation verified
    (``own``), then each link up to a root: the next envelope of the ancestors' file must be
    signed by a trusted key and state (``predicate.cube``) the lock digest and content digest
    the child's parent link records; its own parent links to the next envelope, and so on, to
    a predicate without a parent. Every failure names the link and what differed."""
    if own is None:
        return [_refusal("lineage", "*", "refused: the cube's own attestation did not verify "
                         "with a trusted key (see the attestation check), so no chain can start "
                         "from it", "this cube's attestation, signed by a trusted key",
                         "none verified")]
    parent = own.predicate["parent"]
    ancestors = cube / constants.ANCESTORS_FILENAME
    listed = constants.ANCESTORS_FILENAME in lock["files"]
    if parent is None:
        if listed:
            return [_refusal("lineage", constants.ANCESTORS_FILENAME, "the lock names no "
                             "parent, yet the cube carries ancestors' attestations",
                             "no ancestors (a root cube)", "an ancestors file")]
        return [Check("lineage", "this cube", True, "a root: its signed attestation names no "
                      "parent", basis="signed")]
    if not listed or not ancestors.is_file():
        return [_refusal("lineage", f"link 1: this cube -> parent {parent['lock_digest']}",
                         f"the lock names a parent but the cube carries no "
                         f"{constants.ANCESTORS_FILENAME} (migrate copies it from a parent that "
                         "carries attestations)", "the parent's envelope", "absent")]
    try:
        envelopes = read_ancestors(ancestors)
    except CubepackError as exc:
        return [_refusal("lineage", constants.ANCESTORS_FILENAME, str(exc))]
    checks, child, link = [], "this cube", parent
    for index, envelope in enumerate(envelopes):
        subject = f"link {index + 1}: {child} -> parent {link['lock_digest']}"
        key = signed_by(envelope, trusted_keys)
        if key is None:
            expected, found = _untrusted(envelope, trusted_keys)
            checks.append(_refusal("lineage", subject, f"envelope {index + 1} of "
                                   f"{constants.ANCESTORS_FILENAME} is not signed by a trusted key",
                                   expected, found))
            return checks
        stated = envelope.predicate["cube"]
        # The digests pin the parent; a cube id the link names must be the one it attests too.
        for field in ("lock_digest", "content_digest", "cube_id"):
            if stated[field] != link[field] and (field != "cube_id" or link[field] is not None):
                shown = (str if field != "cube_id" else _short)
                checks.append(Check("lineage", subject, False, f"envelope {index + 1} (signed by "
                                    f"{key}) attests another cube than the parent {child}'s "
                                    f"lineage names: its {field} differs",
                                    f"{field} {shown(link[field])}",
                                    f"{field} {shown(stated[field])}", basis="signed"))
                return checks
        checks.append(Check("lineage", subject, True, f"envelope {index + 1} is signed by "
                            f"trusted key {key} and attests that lock (subject sha256 "
                            f"{envelope.subject_sha256})", basis="signed"))
        child, link = f"parent {stated['lock_digest'][:12]}", envelope.predicate["parent"]
        if link is None:
            if index + 1 < len(envelopes):
                checks.append(_refusal("lineage", f"envelope {index + 2}", f"follows the root "
                                       f"(envelope {index + 1} names no parent)",
                                       "no more envelopes", f"{len(envelopes) - index - 1} more"))
            return checks
    checks.append(_refusal("lineage", f"link {len(envelopes) + 1}: {child} -> parent "
                           f"{link['lock_digest']}", f"the chain stops before a root: "
                           f"{constants.ANCESTORS_FILENAME} holds {len(envelopes)} envelope(s) and "
                           "the last names a parent", "that parent's envelope", "absent"))
    return checks


