"""DSSE envelopes holding in-toto Statements about a cube's lock, parsed strictly (the
format; what a predicate means, and whether to trust a signature, is
:mod:`cubepack.trust._attestation`'s).

Limits apply before anything is trusted (an envelope's file, the ancestors' file, the
signatures of one envelope, the envelopes of a chain); JSON is strict (no duplicate keys,
bounded depth); keys and types are exact, in every predicate version: version 4 (version 3's
keys, plus every memory's and every other file's sha256, and a second subject, the cube's
memories, :func:`memories_statement`), versions 3 and 2 (statements split into a ``proved``
and a ``claimed`` block, a ``signer``) and version 1 (read only).
No torch, no HTTP, no cryptography.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._util import canonical, constants
from .._util.revision import is_commit
from . import _fileset as fileset
from ..errors import FormatError
from ._lock import PARENT_LINK_KEYS, PARENT_ORIGIN_KEYS, SECTION_KEYS
from ._provenance import KINDS, RECOMPUTED

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
#: The predicate this module writes (version 3: each statement in a proved or claimed block;
#: a ``recomputed`` label is in the proved block only for a cache that was its signer's own
#: prefill bit for bit). Version 2 has the same shape, but its signers put there any cache
#: within the proof's bound, which does not bind an answer: its ``recomputed`` statements are
#: read as claims (:func:`cubepack.trust._attestation.signed_statements`).
PREDICATE_TYPE_V3 = "https://cubepack.dev/attestation/cube/v3"
#: Version 4 (written for a clear cube): version 3's predicate plus ``memories`` (id -> sha256)
#: and ``files`` (every other file's sha256), and a second subject, ``cube.memories``: the
#: digest of :func:`memories_statement`, which names memories by digest, not the files that
#: store them, so it survives a compaction (issue #40).
PREDICATE_TYPE = "https://cubepack.dev/attestation/cube/v4"
PREDICATE_TYPE_V2 = "https://cubepack.dev/attestation/cube/v2"
#: The two blocks of a version-2 predicate, named after the basis each statement has for its
#: signer (what the verifier makes of them is :mod:`cubepack.trust._evidence`'s to decide).
PROVED_BLOCK, CLAIMED_BLOCK = "proved", "claimed"
#: The first version (one "proved" block restating the lock): read, as claims only.
PREDICATE_TYPE_V1 = "https://cubepack.dev/attestation/cube/v1"
PREDICATE_TYPES = (PREDICATE_TYPE, PREDICATE_TYPE_V3, PREDICATE_TYPE_V2, PREDICATE_TYPE_V1)
#: The steps that sign, and the only one that derives a lineage.
STEPS = ("pack", "migrate", "sign")
DERIVING_STEP = "migrate"
SUBJECT_NAME = constants.LOCK_FILENAME
#: Version 4's second subject: the cube's memories, pins and other files, by digest.
MEMORIES_SUBJECT = "cube.memories"
#: Version 4's keys beyond version 3's: the memories and the other files, each by sha256.
MEMORIES_KEYS = ("memories", "files")
#: Limits on what is read before it is trusted: an envelope's file, the ancestors' file, the
#: signatures of one envelope, the envelopes of a chain.
MAX_ENVELOPE_BYTES = 16 * 1024 * 1024
MAX_ANCESTORS_BYTES = 64 * 1024 * 1024
MAX_SIGNATURES = 16
MAX_CHAIN = 256
_HEX64 = re.compile(r"[0-9a-f]{64}")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_PARENT_KEYS = PARENT_LINK_KEYS + PARENT_ORIGIN_KEYS
#: The parent link a signer can derive (the parent's lock it read); where the parent was
#: pulled from (``repo_id``, ``revision``) comes from a pull's origin record: a claim.
_LINK_KEYS = PARENT_LINK_KEYS
_ORIGIN_KEYS = PARENT_ORIGIN_KEYS
_BLOCK_KEYS = {"producers", "provenance", "recomputed", "lineage"}
_CLAIMED_KEYS = {"producers", "provenance", "lineage", "origin"}


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
    def memories_root(self) -> str | None:
        """Version 4's ``cube.memories`` digest (None before version 4)."""
        subject = self.statement["subject"]
        return subject[1]["digest"]["sha256"] if len(subject) > 1 else None

    @property
    def keyids(self) -> list[str]:
        return [keyid for keyid, _ in self.signatures]

    @property
    def version(self) -> int:
        return PREDICATE_TYPES[::-1].index(self.statement["predicateType"]) + 1

    def parent(self) -> tuple[dict[str, Any] | None, bool]:
        """(the parent link this envelope states, whether its signer derived it). A root
        states none (derived: the signer signed a lock that names no parent). Version 1 put
        every lock's lineage under "proved": read as a claim."""
        predicate = self.predicate
        if self.version == 1:
            parent = predicate["parent"]
            return (None, True) if parent is None else (parent, False)
        if predicate[PROVED_BLOCK]["lineage"] is not None:
            return predicate[PROVED_BLOCK]["lineage"]["parent"], True
        if predicate[CLAIMED_BLOCK]["lineage"] is not None:
            return predicate[CLAIMED_BLOCK]["lineage"]["parent"], False
        return None, True


def memories_statement(lock: Any) -> dict[str, Any]:
    """What version 4's ``cube.memories`` subject is the sha256 of (canonical JSON), for a lock
    whose sharded memories are resolved (every index read): the cube's id and pins (the lock's
    ``models``, whole), its other sections whole but the ones named here by digest (``files``,
    ``activations``, ``shards``), every memory's sha256 by id, and every other file's sha256 by
    path. The
    files that store memories (a memory's own file, shards, their indexes) and the card (it shows
    the lock's digests) are left out: a compaction rewrites them, and the memories they hold are
    named by digest. So are the files pack generates from the lock (``cubepack.yaml``, which
    lists the shards, and the card): verify checks them against the lock. Two cubes with the
    same statement hold the same memories, pins and other files."""
    storage = {entry.file for entry in lock.activations.values()} | set(lock.shards) \
        | {shard.index for shard in lock.shards.values()} | set(fileset.GENERATED)
    document = lock.to_dict()
    return {"format": "cubepack.memories", "version": 1, "cube_id": lock.cube_id,
            "models": document["models"],
            # every other section whole (adapters, preferences, lineage...): compact keeps them
            "sections": {key: document[key] for key in SECTION_KEYS if key in document
                         and key not in ("files", "activations", "shards", "models")},
            "memories": {item: entry.sha256 for item, entry in sorted(lock.activations.items())},
            "files": {path: entry.sha256 for path, entry in sorted(lock.files.items())
                      if path not in storage}}


def memories_root(lock: Any) -> str:
    """The sha256 of :func:`memories_statement` (canonical JSON)."""
    return canonical.digest(memories_statement(lock))


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what is signed (the type cannot be swapped)."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def envelope_bytes(envelope: dict[str, Any]) -> bytes:
    return canonical.dumps(envelope).encode("ascii")


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
    _require(statement["predicateType"] in PREDICATE_TYPES, where,
             f"predicateType must be {PREDICATE_TYPE} (or the older {PREDICATE_TYPE_V2} or "
             f"{PREDICATE_TYPE_V1}), found "
             f"{_short(statement['predicateType'])}")
    subject = statement["subject"]
    names = (SUBJECT_NAME, MEMORIES_SUBJECT) if statement["predicateType"] == PREDICATE_TYPE \
        else (SUBJECT_NAME,)
    _require(isinstance(subject, list) and len(subject) == len(names), where,
             f"subject must name exactly {' and '.join(names)}")
    for entry, name in zip(subject, names):
        _exact(entry, {"name", "digest"}, f"{where} subject")
        _require(entry["name"] == name, where, f"the subjects must be {', '.join(names)}")
        _exact(entry["digest"], {"sha256"}, f"{where} subject digest")
        _require(_hex64(entry["digest"]["sha256"]), where,
                 "a subject's sha256 must be 64 lower-case hex digits")
    if statement["predicateType"] == PREDICATE_TYPE_V1:
        _check_predicate_v1(statement["predicate"], f"{where} predicate")
    else:
        _check_predicate(statement["predicate"], f"{where} predicate",
                         memories=statement["predicateType"] == PREDICATE_TYPE)


def _check_cube(cube: Any, where: str) -> None:
    _exact(cube, {"cube_id", "lock_digest", "content_digest"}, f"{where} cube")
    _require(_text(cube["cube_id"], True) and _hex64(cube["lock_digest"])
             and _hex64(cube["content_digest"]), f"{where} cube",
             "cube_id is a string or null, both digests 64 hex")


def _check_producers(producers: Any, where: str) -> None:
    _require(isinstance(producers, dict), where, "producers must be an object")
    for role, pin in producers.items():
        _exact(pin, {"repo_id", "revision", "weights_digest", "dtype"},
               f"{where} producer {role!r}")
        _require(_text(pin["repo_id"], True) and (pin["revision"] is None
                                                  or is_commit(pin["revision"]))
                 and _text(pin["weights_digest"]) and _text(pin["dtype"]),
                 f"{where} producer {role!r}", "repo_id and a 40-hex revision or null, "
                 "weights_digest and dtype strings")


def _check_link(link: Any, keys: tuple[str, ...], where: str) -> None:
    _exact(link, set(keys), where)
    _require(all(_hex64(link[key]) for key in ("lock_digest", "content_digest") if key in keys)
             and all(_text(link[key], True) for key in ("cube_id", "repo_id") if key in keys)
             and ("revision" not in keys or link["revision"] is None
                  or is_commit(link["revision"])),
             where, "both digests 64 hex, cube_id and repo_id strings or null, revision 40 hex "
             "or null")


def _check_lineage_block(lineage: Any, where: str) -> None:
    if lineage is not None:
        _exact(lineage, {"parent", "changes"}, where)
        _check_link(lineage["parent"], _LINK_KEYS, f"{where} parent")
        _require(isinstance(lineage["changes"], dict), where, "changes must be an object")


def _check_predicate(predicate: Any, where: str, *, memories: bool = True) -> None:
    """Versions 2 and 3: cube, proved, claimed, signer; each statement in one block. Version 4
    (``memories``): also ``memories`` (id -> sha256) and ``files`` (path -> sha256)."""
    _exact(predicate, {"cube", PROVED_BLOCK, CLAIMED_BLOCK, "signer",
                       *(MEMORIES_KEYS if memories else ())}, where)
    for key in MEMORIES_KEYS if memories else ():
        _require(isinstance(predicate[key], dict) and all(
            isinstance(name, str) and _hex64(digest) for name, digest in predicate[key].items()),
            f"{where} {key}", "name -> sha256 (64 lower-case hex digits)")
    _check_cube(predicate["cube"], where)
    proved, claimed = predicate[PROVED_BLOCK], predicate[CLAIMED_BLOCK]
    _exact(proved, _BLOCK_KEYS, f"{where} proved")
    _exact(claimed, _CLAIMED_KEYS, f"{where} claimed")
    for name, block in ((PROVED_BLOCK, proved), (CLAIMED_BLOCK, claimed)):
        _check_producers(block["producers"], f"{where} {name}")
        _require(isinstance(block["provenance"], dict)
                 and all(kind in KINDS for kind in block["provenance"].values()),
                 f"{where} {name}.provenance", f"item -> one of {', '.join(KINDS)}")
        _check_lineage_block(block["lineage"], f"{where} {name}.lineage")
    _require(not set(proved["producers"]) & set(claimed["producers"])
             and not set(proved["provenance"]) & set(claimed["provenance"])
             and (proved["lineage"] is None or claimed["lineage"] is None), where,
             "a statement is proved or claimed, never both")
    _check_recomputed(proved["recomputed"], proved["provenance"], f"{where} proved")
    if claimed["origin"] is not None:
        _check_link(claimed["origin"], _ORIGIN_KEYS, f"{where} claimed.origin")
    signer = predicate["signer"]
    _exact(signer, {"step", "cubepack_version"}, f"{where} signer")
    _require(signer["step"] in STEPS and _text(signer["cubepack_version"]), f"{where} signer",
             f"step is one of {', '.join(STEPS)}, cubepack_version a string")
    _require(proved["lineage"] is None or signer["step"] == DERIVING_STEP, f"{where} proved",
             f"only {DERIVING_STEP} derives a lineage")


def _check_recomputed(recomputed: Any, provenance: dict[str, Any], where: str) -> None:
    _require(isinstance(recomputed, dict), f"{where}.recomputed", "must be an object")
    for item_id, entry in recomputed.items():
        _exact(entry, {"model_role", "weights_digest", "tokens"},
               f"{where}.recomputed {item_id!r}")
        _require(_text(entry["model_role"]) and _text(entry["weights_digest"])
                 and type(entry["tokens"]) is int and entry["tokens"] >= 0
                 and provenance.get(item_id) == RECOMPUTED,
                 f"{where}.recomputed {item_id!r}",
                 "model_role and weights_digest strings, tokens a count, the item labelled "
                 "recomputed")


def _check_predicate_v1(predicate: Any, where: str) -> None:
    """Version 1 (read only): cube, producers, parent, one "proved" block, cubepack_version."""
    _exact(predicate, {"cube", "producers", "parent", PROVED_BLOCK, "cubepack_version"}, where)
    _check_cube(predicate["cube"], where)
    _check_producers(predicate["producers"], where)
    if predicate["parent"] is not None:
        _check_link(predicate["parent"], _PARENT_KEYS, f"{where} parent")
    proved = predicate[PROVED_BLOCK]
    _exact(proved, {"provenance", "recomputed", "retokenized", "reembedded", "embedder"},
           f"{where} proved")
    _require(isinstance(proved["provenance"], dict)
             and all(kind in KINDS for kind in proved["provenance"].values()),
             f"{where} proved.provenance", f"item -> one of {', '.join(KINDS)}")
    _check_recomputed(proved["recomputed"], proved["provenance"], f"{where} proved")
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
