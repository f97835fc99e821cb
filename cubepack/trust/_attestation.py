"""Signed in-toto attestations of a cube (DSSE envelopes) and the lineage chain they form.

A cube's attestation, ``cubepack.intoto.json``, is an in-toto Statement v1 in a DSSE envelope:

- subject: ``[{"name": "cubepack.lock", "digest": {"sha256": <sha256 of the lock file's
  bytes>}}]``: what anyone can recompute with ``sha256sum cubepack.lock``;
- predicate (:data:`PREDICATE_TYPE`, version 2): the lock's own digests, then every statement
  of the lock a verifier may rely on (producer pins, activation provenance labels, lineage),
  each in exactly one of two blocks: ``proved``, what the signing step established itself
  (pack fingerprinting the models it pins and labelling what it converted, checked or
  recomputed; migrate deriving the lineage; ``cubepack sign`` what its own verification
  proved), and ``claimed``, what it carries from the lock unproved (:func:`predicate_for`).
  A parent's Hub repo and commit (from a pull's origin record) are always claimed.
  A verifier gives ``signed`` basis only to the ``proved`` block
  (:mod:`cubepack.trust._evidence`): a claim does not gain strength by being signed;
- signed over DSSE's pre-authentication encoding (:func:`pae`) with the ECDSA key of ``cubepack
  sign`` (P-256 with SHA-256, P-384 with SHA-384; DER signatures); ``keyid`` is the sha256 of
  the public key's DER SubjectPublicKeyInfo, a hint only: every trusted key is tried.

Version 1 predicates (cubepack before the split) put the lock's labels and lineage in a
``proved`` block whatever the signer proved: they are still read, as claims only
(SECURITY.md's advisory).

A derived cube links to its parent by the parent lock's ``digest`` (``lineage.parent.lock_digest``),
which the parent's attestation states as ``predicate.cube.lock_digest`` next to the subject (its
lock bytes) it vouches for. ``lineage/ancestors.intoto.json`` holds the parent's envelope, then
the grandparent's, and so on (:func:`chain_checks` follows them to a root; every link must be
one its signer derived).

Parsing is strict (bounded sizes, strict JSON without duplicate keys, exact keys and types):
pack and verify read both files with it (:mod:`._content`). No torch, no HTTP; ``cryptography``
only to sign or check a signature.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._util import canonical, constants
from .._util.checks import Catalogue
from .._version import __version__
from ..errors import CubepackError, FormatError
from ..format import _envelope as envelope_format
from ..format import _lock as lockfile
from ..format.sections import Activation, Lock, Locator, Pin
from ..format.sections import shards as shardformat
from ..format._envelope import (
    _LINK_KEYS,
    CLAIMED_BLOCK,
    DERIVING_STEP,
    PAYLOAD_TYPE,
    MEMORIES_KEYS,
    MEMORIES_SUBJECT,
    PREDICATE_TYPE,
    PREDICATE_TYPE_V3,
    PROVED_BLOCK,
    STATEMENT_TYPE,
    STEPS,
    SUBJECT_NAME,
    Envelope,
    _check_predicate,
    _hex64,
    _short,
    envelope_bytes,
    memories_root,
    memories_statement,
    pae,
    parse_envelope_bytes,
    read_ancestors,
    read_envelope,
)
from ._evidence import PROVED, RECOMPUTED, SIGNED, Signed
from ._keys import check_key
from ._report import Check

__all__ = ["Proved", "attest", "attestation_check", "chain_checks", "key_id", "predicate_for",
           "names_these_memories", "sign_statement", "signed_by", "signed_statements",
           "signs_another_lock", "signs_memories_only",
           "statement_for"]

# --- building -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Proved:
    """What a signing step established itself, of the lock it signs: the roles whose pins it
    fingerprinted from the model, the activations whose label it established (checked a header
    against its own fingerprint, converted, recomputed), and whether it derived the lineage
    (only migrate does). Everything else in the lock goes to the predicate as a claim."""

    step: str
    producers: frozenset[str] = frozenset()
    provenance: frozenset[str] = frozenset()
    lineage: bool = False

    @classmethod
    def everything_of(cls, lock: Lock, step: str, *, lineage: bool,
                      carried: frozenset[str] = frozenset()) -> Proved:
        """A step that made every pin and label of ``lock`` itself (pack, migrate), but the
        labels of the memories whose sha256 is in ``carried`` (compact kept them from the last
        lock: its claim, never proved by this step)."""
        return cls(step, frozenset(role for role, pin in lock.models.items() if pin.pinned),
                   frozenset(item for item, entry in lock.activations.items()
                             if entry.sha256 not in carried), lineage)


def _producer(pin: Pin) -> dict[str, Any]:
    """What an attestation states of a pinned model."""
    assert pin.identity is not None
    return {"repo_id": pin.repo_id, "revision": pin.revision,
            "weights_digest": pin.identity.weights_digest, "dtype": pin.identity.dtype}


def _cube(lock: Lock) -> dict[str, Any]:
    return {"cube_id": lock.cube_id, "lock_digest": lock.digest,
            "content_digest": lock.content_digest}


def predicate_for(lock: Lock, proved: Proved, *, memories: bool = True) -> dict[str, Any]:
    """The predicate a signing step gives the (parsed) lock ``lock``: each statement of the
    lock in ``proved`` when the step established it, else in ``claimed``; with ``memories``
    (version 4), every memory's and every other file's sha256 (:func:`memories_statement`).

    Raises:
        FormatError: a step not in the shared format's steps, or ``proved`` says a step other
            than migrate derived a lineage.
    """
    if proved.step not in STEPS:
        raise FormatError(f"an attestation is written by {', '.join(STEPS)}, not {proved.step!r}.")
    if proved.lineage and proved.step != DERIVING_STEP:
        raise FormatError(f"only {DERIVING_STEP} derives a lineage; {proved.step} carries it as "
                          "a claim.")
    lineage = lock.lineage
    blocks: dict[str, dict[str, Any]] = {
        PROVED_BLOCK: {"producers": {}, "provenance": {}, "recomputed": {}, "lineage": None},
        CLAIMED_BLOCK: {"producers": {}, "provenance": {}, "lineage": None, "origin": None}}
    for role, pin in sorted(lock.models.items()):
        if pin.pinned:
            block = PROVED_BLOCK if role in proved.producers else CLAIMED_BLOCK
            blocks[block]["producers"][role] = _producer(pin)
    for item_id, entry in sorted(lock.activations.items()):
        kind = entry.label
        block = PROVED_BLOCK if item_id in proved.provenance else CLAIMED_BLOCK
        blocks[block]["provenance"][item_id] = kind
        if block == PROVED_BLOCK and kind == RECOMPUTED:  # by the pin it names, which it made
            blocks[PROVED_BLOCK]["recomputed"][item_id] = _recomputed(lock, entry)
    if lineage is not None:
        section = {"parent": lineage.parent.link(), "changes": lineage.changes_fields()}
        blocks[PROVED_BLOCK if proved.lineage else CLAIMED_BLOCK]["lineage"] = section
        if lineage.parent.pulled:
            blocks[CLAIMED_BLOCK]["origin"] = lineage.parent.origin()
    predicate = {
        "cube": _cube(lock),
        **blocks,
        "signer": {"step": proved.step, "cubepack_version": __version__},
    }
    if memories:
        statement = memories_statement(lock)
        predicate.update({key: statement[key] for key in MEMORIES_KEYS})
    _check_predicate(predicate, "the lock's attestation predicate", memories=memories)
    return predicate


def _recomputed(lock: Lock, entry: Activation) -> dict[str, Any]:
    """What an attestation states of a recomputed activation: by the pin it names."""
    identity = lock.models[entry.model_role].identity
    assert identity is not None  # an activation's producer always has one (the lock's rule)
    return {"model_role": entry.model_role, "weights_digest": identity.weights_digest,
            "tokens": entry.token_count}


def _predicate_v1(lock: Lock) -> dict[str, Any]:
    """What a version-1 attestation of ``lock`` said: the lock's labels, lineage and pins, all
    under "proved", whatever its signer proved. Only to check an old envelope names this lock
    (its statements are then read as claims)."""
    lineage = lock.lineage
    producers = {role: _producer(pin) for role, pin in sorted(lock.models.items())
                 if pin.pinned}
    provenance, recomputed = {}, {}
    for item_id, entry in sorted(lock.activations.items()):
        provenance[item_id] = entry.label
        if provenance[item_id] == RECOMPUTED:
            recomputed[item_id] = _recomputed(lock, entry)
    changes = lineage.changes if lineage is not None else None
    embedder = changes.embedder if changes is not None else None
    return {
        "cube": _cube(lock),
        "producers": producers,
        "parent": (lineage.parent.link() | lineage.parent.origin()
                   if lineage is not None else None),
        PROVED_BLOCK: {"provenance": provenance, "recomputed": recomputed,
                   "retokenized": sorted(changes.retokenized) if changes else [],
                   "reembedded": changes.reembedded if changes else 0,
                   "embedder": {"from": embedder[0], "to": embedder[1]}
                   if embedder is not None else None},
    }


def statement_for(lock: Lock, lock_bytes: bytes, proved: Proved) -> dict[str, Any]:
    """The in-toto Statement for the lock ``lock`` parsed from ``lock_bytes`` (its sharded
    memories resolved). A clear cube's is version 4: its subjects are the lock's bytes and the
    cube's memories by digest (:func:`memories_root`), which a compaction keeps. A private
    cube's is version 3 (its memories are ciphertexts: named by the lock alone)."""
    subject = [{"name": SUBJECT_NAME,
                "digest": {"sha256": hashlib.sha256(lock_bytes).hexdigest()}}]
    if lock.private:
        return {"_type": STATEMENT_TYPE, "subject": subject, "predicateType": PREDICATE_TYPE_V3,
                "predicate": predicate_for(lock, proved, memories=False)}
    subject.append({"name": MEMORIES_SUBJECT, "digest": {"sha256": memories_root(lock)}})
    return {"_type": STATEMENT_TYPE, "subject": subject, "predicateType": PREDICATE_TYPE,
            "predicate": predicate_for(lock, proved)}


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


def attest(lock_bytes: bytes, key: str | os.PathLike[str], proved: Proved | None = None, *,
           password: str | None = None, fetch: Callable[[Locator], bytes] | None = None) -> bytes:
    """The bytes of ``cubepack.intoto.json`` for the lock file ``lock_bytes``, signed by
    ``key``, stating ``proved`` (what the signing step established; None: nothing, every
    statement a claim); parsed back before they are returned (nothing is written that would
    not read). ``fetch``: reads the cube's files, for a sharded cube, whose memories (and
    their labels) are in its shards' indexes: the statement names every memory."""
    lock = lockfile.parse(lock_bytes)
    if fetch is not None:
        lock = shardformat.resolved(lock, fetch)
    statement = statement_for(lock, lock_bytes, proved or Proved("sign"))
    data = envelope_bytes(sign_statement(statement, key, password=password))
    limit = envelope_format.MAX_ENVELOPE_BYTES
    if len(data) > limit:  # every reader would refuse it unread: never written
        raise FormatError(f"This cube's attestation would be {len(data)} bytes, above the "
                          f"{limit} bytes every reader reads: it names each of its "
                          f"{len(lock.activations)} memories' label and sha256 (about 140 "
                          "bytes a memory, more when recomputed). Split the cube, or sign it "
                          "as several cubes.")
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


def signed_statements(envelope: Envelope, key: str) -> Signed:
    """What ``envelope``'s signer states it proved, once ``key`` verified it: its ``proved``
    block (versions 3 and 2, a version 2 `recomputed` read as a claim); nothing for version 1,
    whose "proved" restated the lock."""
    if envelope.version == 1:
        return Signed(key)
    proved = envelope.predicate[PROVED_BLOCK]
    provenance = dict(proved["provenance"])
    if envelope.version == 2:  # signed under the bound alone: its `recomputed` binds nothing
        provenance = {item: kind for item, kind in provenance.items() if kind != RECOMPUTED}
    return Signed(key, frozenset(proved["producers"]), provenance, proved["lineage"])


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


def _refusal(name: Catalogue, subject: str, detail: str, expected: Any = None,
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


def predicate_mismatches(envelope: Envelope, lock: Lock,
                         present: Collection[str] | None = None, *,
                         layout: bool = True) -> list[tuple[str, Any, Any]]:
    """(field, what the lock gives, what the predicate says) for each field that differs.
    ``layout`` False (a version-4 attestation of another lock of the same memories: a
    compacted cube): the lock's own digests are not compared (they name the signed lock);
    every memory and file, by digest, and every statement are.

    Version 2: the predicate must be exactly what :func:`predicate_for` gives this lock for the
    split its signer states (which statements it proved), so no statement can say other than
    the lock. Version 1: what that version gave. The signer's cubepack version is theirs.
    ``present``: a partial cube's memories (``lock`` holds their entries only): a statement
    about a memory not here has no entry to disagree with, and is left unread."""
    predicate = envelope.predicate
    if envelope.version == 1:
        expected, stated = _predicate_v1(lock), dict(predicate)
        stated.pop("cubepack_version")
    else:
        proved = predicate[PROVED_BLOCK]
        expected = predicate_for(lock, Proved(
            predicate["signer"]["step"], frozenset(proved["producers"]),
            frozenset(proved["provenance"]), proved["lineage"] is not None),
            memories=envelope.version >= 4)
        expected["signer"].pop("cubepack_version")
        stated = {**predicate, "signer": {"step": predicate["signer"]["step"]}}
        if not layout:
            for key in ("lock_digest", "content_digest"):
                expected["cube"][key] = stated["cube"][key]
    # A map of digests is compared name by name: a failure names the memory or the file.
    maps = []
    for key in MEMORIES_KEYS:
        if key in expected:
            want, found = expected.pop(key), stated.pop(key)
            maps += [(f"{key}.{name}", want.get(name), found.get(name))
                     for name in sorted(set(want) | set(found))
                     if want.get(name) != found.get(name)]
    return [(f"predicate.{path}", want, found) for path, want, found in [*_differences(
        expected, stated), *maps] if present is None or want is not None
        or not _about_a_memory_not_here(path, present)]


def _about_a_memory_not_here(path: str, present: Collection[str]) -> bool:
    parts = path.split(".", 2)
    if parts[0] == "memories":
        return path.split(".", 1)[1] not in present
    return len(parts) == 3 and parts[0] in (PROVED_BLOCK, CLAIMED_BLOCK) \
        and parts[1] in {"provenance", "recomputed"} and parts[2] not in present


def _differences(expected: Any, found: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Leaf by leaf, down objects, so a failure names the statement (``proved.producers.
    act_mem``), not the whole block."""
    if isinstance(expected, dict) and isinstance(found, dict) and expected.keys() == found.keys():
        return [difference for key in sorted(expected) for difference in _differences(
            expected[key], found[key], f"{path}.{key}" if path else key)]
    if isinstance(expected, dict) and isinstance(found, dict) and path.count(".") >= 1:
        keys = sorted(set(expected) | set(found))
        return [(f"{path}.{key}", expected.get(key), found.get(key)) for key in keys
                if expected.get(key) != found.get(key)]
    return [] if expected == found else [(path, expected, found)]


def attestation_check(cube: Path, lock: Lock, lock_sha256: str,
                      trusted_keys: tuple[str, ...], required: bool,
                      present: Collection[str] | None = None
                      ) -> tuple[list[Check], Envelope | None, str | None]:
    """The ``attestation`` checks of one cube, the envelope when it verified, and its key.

    Present and trusted keys given: the envelope must be signed by one of them, name this lock
    (sha256 of its bytes) and agree with it. ``required`` (``--require-lineage``): an absent
    attestation, or one that cannot be checked for want of keys, is a failure, never a skip.
    """
    name = constants.ATTESTATION_FILENAME
    path = cube / name
    if path.is_dir() and not path.is_symlink():  # signing would fail on it, half-way
        return [_refusal(Catalogue.ATTESTATION, name, "a folder sits where the cube's attestation "
                         "belongs; remove it", "absent or a regular file", "a folder")], None, None
    if not path.is_file() or path.is_symlink():
        if required:
            return [_refusal(Catalogue.ATTESTATION, name, "missing: the cube carries no signed "
                             "attestation, and lineage is required (--require-lineage); ask its "
                             "publisher to sign it (cubepack sign)", "a DSSE envelope signed by a "
                             "trusted key", "absent")], None, None
        return [Check(Catalogue.ATTESTATION, name, None,
                      "skipped: the cube carries no attestation")], None, None
    if not trusted_keys:
        return [Check(Catalogue.ATTESTATION, name, None,
                      "skipped: no trusted key given")], None, None
    try:
        envelope = read_envelope(path)
    except CubepackError as exc:
        return [_refusal(Catalogue.ATTESTATION, name, str(exc))], None, None
    key = signed_by(envelope, trusted_keys)
    if key is None:
        expected, found = _untrusted(envelope, trusted_keys)
        return [_refusal(Catalogue.ATTESTATION, name, "not signed by a trusted key (or its payload "
                         "was changed after signing)", expected, found)], None, None
    layout = envelope.subject_sha256 == lock_sha256
    if not layout and (envelope.version < 4 or present is not None):
        why = ("a partial cube cannot recompute the digest of every memory its signature names: "
               "pull it whole" if envelope.version >= 4 else
               "moved from another cube, or the lock changed after signing")
        return [Check(Catalogue.ATTESTATION, name, False, f"signed by trusted key {key}, but its "
                      f"subject is another lock ({why})",
                      f"subject sha256 {lock_sha256} (this cubepack.lock)",
                      f"subject sha256 {envelope.subject_sha256}", basis=SIGNED)], None, None
    try:
        differences = predicate_mismatches(envelope, lock, present, layout=layout)
    except CubepackError as exc:  # a lineage section the predicate cannot state
        return [_refusal(Catalogue.ATTESTATION, name, str(exc))], None, None
    what = "this lock" if layout else "this cube's memories, files and statements"
    checks = [Check(Catalogue.ATTESTATION, f"{name} {field}", False,
                    f"signed by trusted key {key}, but its predicate disagrees with {what}",
                    expected, found, basis=SIGNED) for field, expected, found in differences]
    if checks and not layout:  # first what differs of the whole, then each statement
        checks.insert(0, Check(Catalogue.ATTESTATION, name, False, f"signed by trusted key "
                               f"{key}, but its subject is another lock, and its memories "
                               "and statements are not all this cube's (the lock changed after "
                               "signing, or it was moved from another cube): each difference "
                               "follows", f"subject sha256 {lock_sha256} (this cubepack.lock)",
                               f"subject sha256 {envelope.subject_sha256}", basis=SIGNED))
    if checks:
        return checks, None, None
    if envelope.version >= 4 and present is None and memories_root(lock) != envelope.memories_root:
        # Every memory and file agrees: what differs is the rest of the statement, the pins.
        return [Check(Catalogue.ATTESTATION, f"{name} {MEMORIES_SUBJECT}", False,
                      f"signed by trusted key {key}, but the cube's pins (or its cube_id, or "
                      "an entry of another lock section) are not the signed ones: the same "
                      "memories under other pins are another cube",
                      f"{MEMORIES_SUBJECT} sha256 {memories_root(lock)} (this cube)",
                      f"{MEMORIES_SUBJECT} sha256 {envelope.memories_root}",
                      basis=SIGNED)], None, None
    if not layout:
        statement = memories_statement(lock)
        return [Check(Catalogue.ATTESTATION, name, True,
                      f"signed by trusted key {key} over this cube's memories, not its layout: "
                      f"its {MEMORIES_SUBJECT} subject (sha256 {envelope.memories_root}) is "
                      f"recomputed from this lock and every shard index: "
                      f"{len(statement['memories'])} memories, the pins and "
                      f"{len(statement['files'])} other files by sha256. The lock, its shards "
                      f"and indexes are not signed (signed lock sha256 {envelope.subject_sha256}, "
                      f"this one {lock_sha256}: re-laid out since, as compact does); each byte is "
                      f"checked against this lock ({_what_it_proves(envelope)})",
                      basis=SIGNED)], envelope, key
    return [Check(Catalogue.ATTESTATION, name, True,
                  f"signed by trusted key {key}: its subject is this "
                  f"cubepack.lock (sha256 {lock_sha256}) and its predicate agrees with the lock "
                  f"({_what_it_proves(envelope)})", basis=SIGNED)], envelope, key


def names_these_memories(envelope: Envelope, lock: Lock) -> bool:
    """Does the version-4 ``envelope`` (not yet trusted) state exactly the memories, pins,
    files and statements of ``lock`` (its memories resolved), whatever its layout? A re-pack
    keeps such an attestation; verify then checks its signature."""
    try:
        return envelope.version >= 4 and memories_root(lock) == envelope.memories_root \
            and not predicate_mismatches(envelope, lock, layout=False)
    except CubepackError:
        return False


def signs_another_lock(lock_bytes: bytes, attestation: bytes) -> bool:
    """Is ``attestation`` (not trusted: only to word a refusal) a version-4 attestation of
    another lock than ``lock_bytes`` (a cube signed over its memories, compacted since)?"""
    try:
        envelope = parse_envelope_bytes(attestation, constants.ATTESTATION_FILENAME)
    except CubepackError:
        return False
    return signs_memories_only(envelope, hashlib.sha256(lock_bytes).hexdigest())


def signs_memories_only(envelope: Envelope | None, lock_sha256: str) -> bool:
    """Does ``envelope`` (one :func:`attestation_check` passed) sign this cube's memories, but
    another lock (a compacted cube)?"""
    return envelope is not None and envelope.version >= 4 \
        and envelope.subject_sha256 != lock_sha256


def _what_it_proves(envelope: Envelope) -> str:
    if envelope.version == 1:
        return ("a version-1 attestation: its statements are read as claims, since that "
                "version restated the lock whatever its signer proved; sign again")
    proved, claimed = envelope.predicate[PROVED_BLOCK], envelope.predicate[CLAIMED_BLOCK]
    parts = [f"{len(proved[key])} {key} proved by its signer, {len(claimed[key])} claimed"
             for key in ("producers", "provenance") if proved[key] or claimed[key]]
    if proved["lineage"] is not None or claimed["lineage"] is not None:
        parts.append("lineage " + ("derived by its signer" if proved["lineage"] is not None
                                   else "claimed (carried, not derived, by its signer)"))
    return "; ".join(parts) or "nothing beyond the lock's digests"


def _carried(subject: str, where: str, link: dict[str, Any]) -> Check:
    """The refusal of a parent link its signer carried instead of deriving."""
    return _refusal(Catalogue.LINEAGE, subject,
                    f"{where} names parent {link['lock_digest']} as a claim: "
                    "its signer carried the lineage from the lock (a re-pack, or cubepack sign) "
                    "and did not derive it. A derived cube's lineage is signed by the migrate "
                    "that made it: cubepack migrate PARENT --model MODEL --out DIR --sign-key KEY "
                    "(MODEL, or --embedder EMBEDDER, the one the cube was derived for)",
                    "a parent link its signer derived (migrate)", "a carried claim")


def chain_checks(cube: Path, lock: Lock, own: Envelope | None,
                 trusted_keys: tuple[str, ...]) -> list[Check]:
    """The ``lineage`` checks of ``--require-lineage``: the cube's own attestation verified
    (``own``), then each link up to a root: the next envelope of the ancestors' file must be
    signed by a trusted key and state (``predicate.cube``) the lock digest and content digest
    the child's parent link records; its own parent links to the next envelope, and so on, to
    a predicate without a parent. Every failure names the link and what differed."""
    if own is None:
        return [_refusal(Catalogue.LINEAGE, "*",
                         "refused: the cube's own attestation did not verify "
                         "with a trusted key (see the attestation check), so no chain can start "
                         "from it", "this cube's attestation, signed by a trusted key",
                         "none verified")]
    parent, derived = own.parent()
    ancestors = cube / constants.ANCESTORS_FILENAME
    listed = constants.ANCESTORS_FILENAME in lock.files
    if parent is None:
        if listed:
            return [_refusal(Catalogue.LINEAGE, constants.ANCESTORS_FILENAME, "the lock names no "
                             "parent, yet the cube carries ancestors' attestations",
                             "no ancestors (a root cube)", "an ancestors file")]
        return [Check(Catalogue.LINEAGE, "this cube", True,
                      "a root: its signed attestation names no "
                      "parent", basis=SIGNED)]
    if not derived:
        return [_carried(f"link 1: this cube -> parent {parent['lock_digest']}",
                         "the cube's own attestation", parent)]
    if not listed or not ancestors.is_file():
        return [_refusal(Catalogue.LINEAGE, f"link 1: this cube -> parent {parent['lock_digest']}",
                         f"the lock names a parent but the cube carries no "
                         f"{constants.ANCESTORS_FILENAME} (migrate copies it from a parent that "
                         "carries attestations)", "the parent's envelope", "absent")]
    try:
        envelopes = read_ancestors(ancestors)
    except CubepackError as exc:
        return [_refusal(Catalogue.LINEAGE, constants.ANCESTORS_FILENAME, str(exc))]
    checks, child, link = [], "this cube", parent
    for index, envelope in enumerate(envelopes):
        subject = f"link {index + 1}: {child} -> parent {link['lock_digest']}"
        key = signed_by(envelope, trusted_keys)
        if key is None:
            expected, found = _untrusted(envelope, trusted_keys)
            checks.append(_refusal(Catalogue.LINEAGE, subject, f"envelope {index + 1} of "
                                   f"{constants.ANCESTORS_FILENAME} is not signed by a trusted key",
                                   expected, found))
            return checks
        stated = envelope.predicate["cube"]
        # The digests pin the parent; a cube id the link names must be the one it attests too.
        for field in _LINK_KEYS:
            if stated[field] != link[field] and (field != "cube_id" or link[field] is not None):
                shown = (str if field != "cube_id" else _short)
                checks.append(Check(Catalogue.LINEAGE, subject, False,
                                    f"envelope {index + 1} (signed by "
                                    f"{key}) attests another cube than the parent {child}'s "
                                    f"lineage names: its {field} differs",
                                    f"{field} {shown(link[field])}",
                                    f"{field} {shown(stated[field])}", basis=SIGNED))
                return checks
        checks.append(Check(Catalogue.LINEAGE, subject, True, f"envelope {index + 1} is signed by "
                            f"trusted key {key} and attests that lock (subject sha256 "
                            f"{envelope.subject_sha256})", basis=SIGNED))
        child, (link, derived) = f"parent {stated['lock_digest'][:12]}", envelope.parent()
        if link is not None and not derived:
            checks.append(_carried(f"link {index + 2}: {child} -> parent {link['lock_digest']}",
                                   f"envelope {index + 1} of {constants.ANCESTORS_FILENAME}",
                                   link))
            return checks
        if link is None:
            if index + 1 < len(envelopes):
                checks.append(_refusal(Catalogue.LINEAGE, f"envelope {index + 2}",
                                       f"follows the root "
                                       f"(envelope {index + 1} names no parent)",
                                       "no more envelopes", f"{len(envelopes) - index - 1} more"))
            return checks
    checks.append(_refusal(Catalogue.LINEAGE, f"link {len(envelopes) + 1}: {child} -> parent "
                           f"{link['lock_digest']}", f"the chain stops before a root: "
                           f"{constants.ANCESTORS_FILENAME} holds {len(envelopes)} envelope(s) and "
                           "the last names a parent", "that parent's envelope", "absent"))
    return checks


