"""The fingerprint lockfile, ``cubepack.lock``: build, serialise, parse. Pure logic.

The lock is canonical JSON (sorted keys, fixed layout), so packing an unchanged cube gives the
same bytes. It records every file of the cube except itself (``path -> {sha256, size}``), the
full identity of every pinned model, every activation, and two digests:

- ``content_digest``: sha256 of the canonical JSON of files (without the card ``README.md``),
  models and activations. The model card shows it (the card cannot show a digest of itself).
- ``digest``: sha256 of the canonical JSON of everything else in the lock.

Version 3 adds two optional sections, each covered by ``content_digest`` when present:
``adapters`` (parametric memory: each adapter's file, digest and pinned base model) and
``lineage`` (the cube this one was derived from, and what changed). Version 2 locks (without
them) are read as before.

Version 5 adds ``encryption`` (a private cube, issue #32): the lock of a cube whose files are
age ciphertexts. Only a private cube's lock is version 5 (a lock is written at the lowest
version that holds its sections), so a clear cube stays readable by older cubepacks and a
private one is refused by them by its version, never half-read.

Version 6 adds two optional sections, each written only by a cube that holds it, for the same
reason: ``preferences`` (MemOS's preference memory, issue #39: its file, its embedder's role,
counts, dimension, a sample, probe vectors; see ``sections/preferences.py``) and ``shards``
(issue #40: activation memories many to a file, each shard with an index of its own; see
``sections/shards.py``). A version 6 reader reads both.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from .._util import canonical, constants
from .._util.paths import check_no_collisions, check_relpath
from .._util.revision import is_commit
from ..errors import FormatError, UsageError
from ..identity._identity import ModelIdentity
from . import _fileset as fileset
from ._fileset import is_activation_path
from ._provenance import KINDS, RECORDED
from .sections import MEMORY_SECTIONS, Lock, Pin
from .sections import activations as _activations
from .sections import adapters as _adapters
from .sections import encryption as _encryption
from .sections import files as _files
from .sections import lineage as _lineage
from .sections import models as _models
from .sections import preferences as _preferences
from .sections import shards as _shards
from .sections.activations import PROVENANCE_KEYS, activation_id_key, duplicate_id
from .sections.adapters import BASE_CLAIM
from .sections.lineage import PARENT_LINK_KEYS, PARENT_ORIGIN_KEYS, change_problem

# --- the provenance record of an activation (``activations[item].provenance``) ---------------

# What an activation's producer label says (its ``kind``): ._provenance's labels, in their
# one order of strength.
#: The label of an activation whose KV header names a producer that agrees with the pin.
KV_HEADER = {"kind": RECORDED, "detail": "the KV file's header names its producer"}


def check_provenance(value: Any) -> bool:
    """Is ``value`` a well-formed provenance record (as the lock stores it)?"""
    return (isinstance(value, dict) and value.get("kind") in KINDS
            and isinstance(value.get("detail", ""), str))


# --- the vectors record of an embedder pin (``models[role].vectors``) --------------------------

#: The texts whose vectors a vectors record keeps as its embedder's behavioural fingerprint
#: (``probes``): part of the record's meaning, so part of its format.
VECTOR_PROBES = ("The user likes green tea.", "Paris is the capital of France.",
                 "def add(a, b): return a + b", "Numbers: 3.14159, 2024, -7.")


def check_record(record: Any) -> bool:
    """Is ``record`` a well-formed vectors record (file, dimension, count, sample, probes)?"""
    probes = record.get("probes") if isinstance(record, dict) else None
    return (isinstance(record, dict) and isinstance(record.get("file"), str)
            and type(record.get("dimension")) is int and type(record.get("count")) is int
            and isinstance(record.get("sample"), list)
            and all(isinstance(i, str) for i in record["sample"])
            and (probes is None or (isinstance(probes, list)
                                    and len(probes) == len(VECTOR_PROBES)
                                    and all(isinstance(v, list) for v in probes))))


MAX_LOCK_BYTES = 64 * 1024 * 1024

#: A cube id cubepack gives a cube (``pack --cube-id``): a name, or owner/name as a Hub repo id
#: is, of ASCII letters, digits, '.', '_' and '-', each part starting with a letter or digit,
#: at most 96 characters. It names the cube in its card, its lineage and MemOS's config, so it
#: must survive every file system, URL and shell unquoted.
CUBE_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?"
MAX_CUBE_ID = 96


def check_cube_id(value: Any) -> str:
    """``value`` if it is a cube id by :data:`CUBE_ID_PATTERN`; else a UsageError naming the
    pattern."""
    if isinstance(value, str) and len(value) <= MAX_CUBE_ID and re.fullmatch(CUBE_ID_PATTERN,
                                                                               value):
        return value
    raise UsageError(f"{value!r} is not a cube id: use a name or owner/name of ASCII letters, "
                     f"digits, '.', '_' and '-' (pattern {CUBE_ID_PATTERN}, at most "
                     f"{MAX_CUBE_ID} characters), e.g. alice/travel-notes.")
_HEX64 = re.compile(r"[0-9a-f]{64}")
#: The lock's own fields (not sections): every lock holds each.
FIELDS = ("lock_version", "cubepack_version", "cube_id", "content_digest", "digest")
#: The versions this cubepack reads; keys are closed (nothing unknown, anywhere) from 4 on.
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7)
CLOSED_SINCE = 4


# --- the section registry ----------------------------------------------------------------------

@dataclass(frozen=True)
class Section:
    """One section of the lock, and everything every reader and writer needs of it, so a new
    section cannot exist without its validation, digest, diff, description and attestation
    rule (a test holds each registered section to all five).

    - ``validate(value, lock, version)``: raise :class:`FormatError` naming what is wrong;
    - ``digested(value)``: what of it ``content_digest`` covers (None: nothing);
    - ``entries(value)``: id -> entry, what ``diff`` compares entry by entry;
    - ``describe(entry_id, entry)``: one line naming an entry, for diff and reports;
    - ``attest``: the attestation statement block its entries become (``producers``,
      ``provenance``, ``lineage``), or None when the lock's digests alone state it;
    - ``parse(value, typed, version)``: the section's frozen value (``format/sections/``),
      from its validated JSON (``typed``: the sections parsed before it, by key);
    - ``absent``: its value in a lock that does not hold it (an optional section).
    """

    key: str
    since: int
    required: bool
    validate: Callable[[Any, dict[str, Any], int], None]
    digested: Callable[[Any], Any]
    entries: Callable[[Any], dict[str, Any]]
    describe: Callable[[str, Any], str]
    attest: str | None
    parse: Callable[[Any, dict[str, Any], int], Any]
    absent: Any = None


def _by_key(value: Any) -> dict[str, Any]:
    return dict(value)


def _files_digested(files: dict[str, Any]) -> dict[str, Any]:
    # The card shows content_digest, so it cannot be covered by it.
    return {path: entry for path, entry in files.items() if path != constants.CARD_FILENAME}


def _describe_pin(role: str, pin: dict[str, Any]) -> str:
    identity = pin.get("identity") or {}
    where = (f"{pin['repo_id']}@{pin['revision']}" if pin.get("repo_id") and pin.get("revision")
             else f"{pin.get('name') or 'unnamed'} (weights {identity.get('weights_digest')})")
    return f"model {role}: {where}, {identity.get('dtype', 'no identity')}"


SECTIONS: tuple[Section, ...] = (
    Section("files", 1, True, lambda value, lock, version: _check_files(value),
            _files_digested, _by_key,
            lambda path, entry: (f"file {path}: sha256 {entry.get('sha256')}, "
                                 f"{entry.get('size')} bytes"),
            None, lambda value, typed, version: _files.parse(value)),
    Section("models", 1, True,
            lambda value, lock, version: _check_models(value, version),
            lambda value: value, _by_key, _describe_pin, "producers",
            lambda value, typed, version: _models.parse(value, version)),
    Section("activations", 1, True,
            lambda value, lock, version: (
                _check_activations(value, lock["files"], lock["models"], version),
                _shards.check_listed(lock["files"], lock.get("shards"))),
            lambda value: value, _by_key,
            lambda item, entry: (f"activation {item}: {entry.get('file')}, "
                                 f"{entry.get('token_count')} tokens, {entry.get('kv_dtype')}, "
                                 f"by {entry.get('model_role')} "
                                 f"({(entry.get('provenance') or {}).get('kind', 'unlabelled')})"),
            "provenance",
            lambda value, typed, version: _activations.parse(value, typed["files"])),
    Section("adapters", 3, False,
            lambda value, lock, version: _check_adapters(value, lock["files"], lock["models"],
                                                         version),
            lambda value: value, _by_key,
            lambda name, entry: (f"adapter {name}: {entry.get('digest')}, rank "
                                 f"{entry.get('rank')}, base {entry.get('model_role')}"),
            None,  # its base is a pin (models): stated there
            lambda value, typed, version: _adapters.parse(value, typed["files"]),
            MappingProxyType({})),
    Section("lineage", 3, False,
            lambda value, lock, version: _check_lineage(value, version),
            lambda value: value, lambda value: {"parent": value},
            lambda _, lineage: (f"lineage: parent lock "
                                f"{(lineage.get('parent') or {}).get('lock_digest')} "
                                f"({lineage.get('tool')})"),
            "lineage", lambda value, typed, version: _lineage.parse(value)),
    Section("encryption", 5, False,
            lambda value, lock, version: _check_encryption(value, lock),
            lambda value: value, lambda value: {"encryption": value},
            lambda _, value: (f"encryption: age, {len(value.get('ciphertexts') or [])} "
                              f"ciphertexts, version {value.get('version')}"
                              + (f", series {value['series']} generation "
                                 f"{value['generation']}" if "generation" in value else "")),
            None,  # the ciphertexts' digests are the lock's files: stated there
            lambda value, typed, version: _encryption.parse(value)),
    Section("shards", constants.SHARDED_LOCK_VERSION, False,
            lambda value, lock, version: _shards.check_section(value, lock["files"], version),
            lambda value: value, _by_key, _shards.describe,
            None,  # the shards and indexes are files: their digests state them
            lambda value, typed, version: _shards.parse(value, typed["files"]),
            MappingProxyType({})),
    Section(_preferences.KEY, _preferences.SINCE, False,
            lambda value, lock, version: _preferences.validate(value, lock, len(VECTOR_PROBES)),
            lambda value: value, _by_key, _preferences.describe,
            None,  # its embedder is a pin (models): stated there
            lambda value, typed, version: _preferences.parse(value, typed["files"]),
            MappingProxyType({})),
)
SECTION_KEYS = tuple(section.key for section in SECTIONS)


def content_digest(lock: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of what every section present in ``lock`` covers."""
    return canonical.digest({section.key: section.digested(lock[section.key])
                             for section in SECTIONS if section.key in lock})


def build_lock(*, cube_id: str | None, files: dict[str, dict[str, Any]],
               models: dict[str, dict[str, Any]], cubepack_version: str,
               lineage: dict[str, Any] | None = None,
               encryption: dict[str, Any] | None = None,
               **memories: dict[str, Any] | None) -> dict[str, Any]:
    """Assemble a lock document and compute its digests. ``memories``: each memory kind's
    section by its key (``activations``, ``adapters``...: ``SECTIONS`` names them). An empty
    optional section (no ``adapters``, a None ``lineage``) is left out (a cube without that
    section); a required one absent is empty. The version is the lowest that holds every
    section present (``encryption``: 5), and every lineage change stated (its declaration's).

    Raises:
        TypeError: a section ``SECTIONS`` does not declare.
    """
    unknown = sorted(set(memories) - set(SECTION_KEYS))
    if unknown:
        raise TypeError(f"build_lock: no lock section {', '.join(unknown)}")
    given = {"files": files, "models": models, "lineage": lineage, "encryption": encryption,
             **memories}
    body: dict[str, Any] = {"lock_version": constants.LOCK_VERSION,
                            "cubepack_version": cubepack_version, "cube_id": cube_id}
    for section in SECTIONS:
        value = given.get(section.key)
        if section.required and value is None:
            value = {}
        if section.required or value:
            body[section.key] = value
            body["lock_version"] = max(body["lock_version"], section.since)
    if lineage:  # a change a later kind declared is held from its version on
        body["lock_version"] = max([body["lock_version"]] + [
            _lineage.CHANGES[key].since for key in lineage.get("changes", {})
            if key in _lineage.CHANGES])
    if "shards" in body:  # an appended layout (overlapping ranges, dead bytes) is version 7
        body["lock_version"] = max(body["lock_version"], _shards.lock_version(body["shards"]))
    body["content_digest"] = content_digest(body)
    body["digest"] = canonical.digest(body)
    return body


def sections(lock: dict[str, Any]) -> dict[str, Any]:
    """The optional sections ``lock`` holds (``adapters``, ``lineage``), by key."""
    return {section.key: lock[section.key] for section in SECTIONS
            if not section.required and section.key in lock}


def dumps(lock: dict[str, Any] | Lock) -> str:
    """The lock's bytes, canonical (a parsed :class:`Lock` gives the bytes it was read from)."""
    return canonical.dumps(lock.to_dict() if isinstance(lock, Lock) else lock)


def parse(data: bytes, *, accept_version_1: bool = False) -> Lock:
    """Parse and fully validate lock bytes; return the lock, its sections as frozen values
    (parsed once, here, after every check passed).

    Checks: size, UTF-8 JSON without duplicate keys, known version, every section of the
    registry (its keys, closed from version 4 on; its types; safe paths; no case-folding
    collisions; every activation file listed), and both digests.

    ``accept_version_1``: for ``cubepack upgrade`` only. A version-1 lock (cubepack 0.1) has
    the same layout, but its pins' identities have no compute config and its activations no
    provenance; everything else is checked as for version 2.

    Raises:
        FormatError: malformed, unknown version, or a digest that does not match the content.
        UnsafeInputError: a path that is absolute, escapes the cube, or collides with another.
    """
    if len(data) > MAX_LOCK_BYTES:
        raise FormatError(f"cubepack.lock is {len(data)} bytes, above the {MAX_LOCK_BYTES}-byte limit.")
    try:
        lock = canonical.loads_strict(data.decode("utf-8"),
                                       object_pairs_hook=canonical.unique_pairs)
    except canonical.DuplicateKey as exc:
        raise FormatError(f"cubepack.lock {exc}; a lock must be unambiguous.") from exc
    except canonical.LimitError as exc:
        raise FormatError(f"cubepack.lock is refused: {exc}.") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormatError(f"cubepack.lock is not valid JSON: {exc}") from exc
    if not isinstance(lock, dict):
        raise FormatError("cubepack.lock must hold a JSON object.")
    version = lock.get("lock_version")
    if type(version) is not int:  # not 2.0 or true, which Python compares equal to 2 and 1
        raise FormatError(f"cubepack.lock lock_version must be an integer, found {version!r}.")
    if version == 1 and not accept_version_1:
        raise FormatError("cubepack.lock is version 1, whose pins do not record the models' "
                          "compute config; upgrade the cube with its producer model: cubepack "
                          "upgrade CUBE_DIR --model MODEL.")
    if version not in READABLE_VERSIONS:
        raise FormatError(f"cubepack.lock is version {version!r}; this cubepack reads versions 2 "
                          f"to {READABLE_VERSIONS[-1]}. Upgrade cubepack or re-pack the cube.")
    present = [section for section in SECTIONS if section.since <= version]
    allowed = set(FIELDS) | {section.key for section in present}
    required = set(FIELDS) | {section.key for section in present if section.required}
    unknown, missing = set(lock) - allowed, required - set(lock)
    if unknown or missing:
        raise FormatError(f"cubepack.lock has unexpected keys {sorted(unknown)} or lacks "
                          f"{sorted(missing)}.")
    for key in ("cubepack_version", "content_digest", "digest"):
        if not isinstance(lock[key], str):
            raise FormatError(f"cubepack.lock {key} must be a string.")
    if not isinstance(lock["cube_id"], (str, type(None))):
        raise FormatError("cubepack.lock cube_id must be a string or null.")
    for section in present:
        if section.key in lock:
            section.validate(lock[section.key], lock, version)
    expected = dict(lock)
    claimed = expected.pop("digest")
    if claimed != canonical.digest(expected):
        raise FormatError(f"cubepack.lock digest mismatch: the lock says {claimed!r} but its "
                          f"content hashes to {canonical.digest(expected)!r}; the lock was edited.")
    recomputed = content_digest(lock)
    if lock["content_digest"] != recomputed:
        raise FormatError(f"cubepack.lock content_digest mismatch: expected {recomputed}, found "
                          f"{lock['content_digest']}.")
    return typed(lock)


def typed_pin(role: str, pin: dict[str, Any]) -> Pin:
    """The frozen value of one pin as a writer builds it (pack, before its lock is whole)."""
    return _models.parse({role: pin}, constants.LOCK_VERSION)[role]


def typed(document: dict[str, Any]) -> Lock:
    """The :class:`Lock` of a lock document already validated (by :func:`parse`) or built (by
    :func:`build_lock`): each registered section parsed into its frozen value."""
    version = document["lock_version"]
    values: dict[str, Any] = {}
    for section in SECTIONS:
        values[section.key] = (section.parse(document[section.key], values, version)
                               if section.key in document else section.absent)
    return Lock(version=version, cubepack_version=document["cubepack_version"],
                cube_id=document["cube_id"], content_digest=document["content_digest"],
                digest=document["digest"], document=MappingProxyType(document), **values)


def _closed(value: dict[str, Any], allowed: set[str] | frozenset[str], where: str,
            version: int) -> None:
    """From version 4 on, a key the format does not define is refused, never ignored."""
    unknown = sorted(set(value) - set(allowed))
    if version >= CLOSED_SINCE and unknown:
        raise FormatError(f"cubepack.lock {where} has unknown keys {unknown}; this cubepack "
                          f"knows {sorted(allowed)}. Upgrade cubepack, or re-pack the cube.")


def _check_files(files: Any) -> None:
    if not isinstance(files, dict):
        raise FormatError("cubepack.lock 'files' must be an object.")
    for path, entry in files.items():
        check_relpath(path)
        if path == constants.LOCK_FILENAME:
            raise FormatError("cubepack.lock must not list itself.")
        if not (isinstance(entry, dict) and set(entry) == {"sha256", "size"}
                and isinstance(entry["sha256"], str) and _HEX64.fullmatch(entry["sha256"])
                and type(entry["size"]) is int and 0 <= entry["size"] < 2**50):
            raise FormatError(f"cubepack.lock entry for {path!r} must be {{sha256: 64 hex, size: int}}.")
    check_no_collisions(list(files))


#: A pin's keys: ``reason`` says why a model could not be pinned; ``vectors`` is an embedder's
#: vectors record.
PIN_KEYS = frozenset({"name", "strict", "repo_id", "revision", "identity", "reason", "vectors"})
#: A pinned identity's keys: what ``ModelIdentity.pinned()`` writes (a reader keeping only the
#: fields it knows would drop the rest silently).
IDENTITY_KEYS = frozenset(f.name for f in fields(ModelIdentity)) - {"versions", "config_digest"}
#: A vectors record's keys (see ``check_record``).
VECTOR_RECORD_KEYS = frozenset({"file", "dimension", "count", "sample", "probes"})
#: An activation entry's keys, and its provenance record's (``model``, ``tokens``,
#: ``max_error``, ``at``, ``retokenized``: what a recomputation or re-prefill measured).
ACTIVATION_KEYS = frozenset({"file", "model_role", "token_count", "kv_dtype", "num_layers",
                             "sha256", "provenance"})


def _check_models(models: Any, version: int) -> None:
    legacy = version == 1
    if not isinstance(models, dict):
        raise FormatError("cubepack.lock 'models' must be an object.")
    for role, pin in models.items():
        if not isinstance(pin, dict) or not isinstance(pin.get("strict", False), bool):
            raise FormatError(f"cubepack.lock model {role!r} is malformed.")
        _closed(pin, PIN_KEYS, f"model {role!r}", version)
        for key in ("repo_id", "revision", "name"):
            if not isinstance(pin.get(key), (str, type(None))):
                raise FormatError(f"cubepack.lock model {role!r} has a non-string {key}.")
        if pin.get("revision") is not None and not is_commit(pin["revision"]):
            raise FormatError(f"cubepack.lock model {role!r} pins revision {pin['revision']!r}, "
                              "which is not a 40-hex commit.")
        if "vectors" in pin and not check_record(pin["vectors"]):
            raise FormatError(f"cubepack.lock model {role!r} has a malformed vectors record.")
        if "vectors" in pin:
            _closed(pin["vectors"], VECTOR_RECORD_KEYS, f"model {role!r} vectors", version)
        identity = pin.get("identity")
        if identity is None and not pin.get("strict"):
            continue  # an informational model that could not be pinned
        if not isinstance(identity, dict):
            raise FormatError(f"cubepack.lock model {role!r} lacks its identity.")
        _closed(identity, IDENTITY_KEYS, f"model {role!r} identity", version)
        ModelIdentity.from_dict(identity, legacy=legacy)


def _check_activations(activations: Any, files: dict[str, Any], models: dict[str, Any],
                       version: int) -> None:
    _check_activation_entries(activations, files, models, version)
    ids: dict[str, str] = {}
    for item_id in activations:
        first = ids.setdefault(activation_id_key(item_id), item_id)
        if first != item_id:
            raise FormatError(f"cubepack.lock activations {duplicate_id(first, item_id)}; "
                              "each activation has an id of its own: pack the cube again with "
                              "one of them renamed.")
    # Each KV file under activations/ is exactly one activation's: no file shared by two
    # entries (one label for two items), none left out (its header would go unchecked).
    named: dict[str, str] = {}
    for item_id, entry in activations.items():
        if entry["file"] in named:
            raise FormatError(f"cubepack.lock activations {named[entry['file']]!r} and "
                              f"{item_id!r} name the same file {entry['file']!r}; each "
                              "activation has a file of its own.")
        named[entry["file"]] = item_id
    unlisted = sorted(path for path in files if is_activation_path(path) and path not in named)
    if unlisted:
        raise FormatError(f"cubepack.lock lists {unlisted[0]!r} as a file but not as an "
                          "activation: a KV file under activations/ is always one (its producer "
                          "checked against the pin); pack the cube again.")


def _check_activation_entries(activations: Any, files: dict[str, Any],
                              models: dict[str, Any], version: int) -> None:
    legacy = version == 1
    if not isinstance(activations, dict):
        raise FormatError("cubepack.lock 'activations' must be an object.")
    for item_id, entry in activations.items():
        if isinstance(entry, dict):
            _closed(entry, ACTIVATION_KEYS, f"activation {item_id!r}", version)
            if isinstance(entry.get("provenance"), dict):
                _closed(entry["provenance"], PROVENANCE_KEYS,
                        f"activation {item_id!r} provenance", version)
        if not (isinstance(entry, dict) and isinstance(entry.get("file"), str)
                and isinstance(entry.get("model_role"), str)
                and isinstance(entry.get("kv_dtype"), str)
                and isinstance(entry.get("sha256"), str)
                and all(type(entry.get(key)) is int and entry[key] >= 0
                        for key in ("token_count", "num_layers"))):
            raise FormatError(f"cubepack.lock activation {item_id!r} is malformed.")
        path = entry["file"]
        check_relpath(path)
        if path not in files:
            raise FormatError(f"cubepack.lock activation {item_id!r} names {path!r}, which the "
                              "lock's file list does not hold.")
        if files[path]["sha256"] != entry["sha256"]:
            raise FormatError(f"cubepack.lock activation {item_id!r} and its file entry disagree "
                              "on the sha256.")
        if not check_provenance(entry.get("provenance")) and not (
                legacy and "provenance" not in entry):  # version 1 recorded none
            raise FormatError(f"cubepack.lock activation {item_id!r} lacks a provenance "
                              "(recorded, asserted or recomputed).")
        role = models.get(entry["model_role"])
        if not isinstance(role, dict) or not isinstance(role.get("identity"), dict):
            raise FormatError(f"cubepack.lock activation {item_id!r} names model role "
                              f"{entry['model_role']!r}, which has no pinned identity.")
        if role.get("strict") is not True:  # a producer is strict by definition, whatever the
            raise FormatError(f"cubepack.lock activation {item_id!r} names model role "  # lock
                              f"{entry['model_role']!r}, which is not pinned as strict; the "
                              "producer of an activation always is.")


#: The keys of an ``adapters`` entry (see ``memory/_adapters.py``), exactly.
ADAPTER_KEYS = {"path", "config_file", "weights_file", "digest", "peft_type", "rank",
                "lora_alpha", "target_modules", "dtype", "model_role", "modules", "base"}
#: Version 4 records what else scales the deltas (see ``memory/_adapters.scaling``).
ADAPTER_SCALING_KEYS = {"rank_pattern", "alpha_pattern", "use_rslora"}
_ADAPTER_NAME = re.compile(constants.ADAPTER_NAME_PATTERN)
_MODULE_KINDS = ("linear", "embedding")


def _check_adapters(adapters: Any, files: dict[str, Any], models: dict[str, Any],
                    version: int) -> None:
    """Parametric memory: ``name -> entry`` (see ``memory/_adapters.py``). Each entry names its
    two files (listed, under ``parametric/<name>/``), their digest (recomputed here from the
    files' sha256), the LoRA facts and the strict model role pinning its base."""
    if not isinstance(adapters, dict) or not adapters:
        raise FormatError("cubepack.lock 'adapters' must be a non-empty object.")
    for name, entry in adapters.items():
        what = f"cubepack.lock adapter {name!r}"
        if not _ADAPTER_NAME.fullmatch(name):
            raise FormatError(f"{what}: an adapter's name must be a plain name.")
        keys = ADAPTER_KEYS | (ADAPTER_SCALING_KEYS if version >= CLOSED_SINCE else set())
        if not isinstance(entry, dict) or set(entry) != keys:
            raise FormatError(f"{what} must have exactly the keys {sorted(keys)}.")
        if version >= CLOSED_SINCE and not (
                isinstance(entry["rank_pattern"], dict) and isinstance(entry["alpha_pattern"], dict)
                and isinstance(entry["use_rslora"], bool)
                and all(type(v) is int and v > 0 for v in entry["rank_pattern"].values())
                and all(type(v) in (int, float) for v in entry["alpha_pattern"].values())):
            raise FormatError(f"{what} rank_pattern and alpha_pattern must map patterns to "
                              "numbers (ranks positive integers), use_rslora true or false.")
        path = f"{constants.PARAMETRIC_DIR}/{name}"
        expected = {"path": path, "config_file": f"{path}/{constants.ADAPTER_CONFIG}",
                    "weights_file": f"{path}/{constants.ADAPTER_WEIGHTS}",
                    "model_role": f"adapter.{name}", "peft_type": "LORA"}
        for key, value in expected.items():
            if entry[key] != value:
                raise FormatError(f"{what} {key} must be {value!r}, found {entry[key]!r}.")
        for key in ("config_file", "weights_file"):
            if entry[key] not in files:
                raise FormatError(f"{what} names {entry[key]!r}, which the lock's file list "
                                  "does not hold.")
        recomputed = canonical.digest_of_file_hashes(
            [(constants.ADAPTER_CONFIG, files[entry["config_file"]]["sha256"]),
             (constants.ADAPTER_WEIGHTS, files[entry["weights_file"]]["sha256"])])
        if entry["digest"] != recomputed:
            raise FormatError(f"{what} digest {entry['digest']!r} is not its files' digest "
                              f"{recomputed!r}.")
        if type(entry["rank"]) is not int or entry["rank"] <= 0:
            raise FormatError(f"{what} rank must be a positive integer.")
        if type(entry["lora_alpha"]) not in (int, float):
            raise FormatError(f"{what} lora_alpha must be a number.")
        targets = entry["target_modules"]
        if not ((isinstance(targets, str) and targets) or (
                isinstance(targets, list) and targets
                and all(isinstance(t, str) for t in targets))):
            raise FormatError(f"{what} target_modules must be a regex or a list of names.")
        if not isinstance(entry["dtype"], str):
            raise FormatError(f"{what} dtype must be a string.")
        modules = entry["modules"]
        if not isinstance(modules, dict) or not modules:
            raise FormatError(f"{what} modules must be a non-empty object.")
        for module, fit in modules.items():
            if not (isinstance(fit, dict) and set(fit) == {"kind", "rank", "shape"}
                    and fit["kind"] in _MODULE_KINDS and type(fit["rank"]) is int
                    and fit["rank"] > 0 and isinstance(fit["shape"], list)
                    and len(fit["shape"]) == 2
                    and all(type(d) is int and d >= 0 for d in fit["shape"])):
                raise FormatError(f"{what} module {module!r} must be {{kind: linear|embedding, "
                                  "rank: int, shape: [out, in]}.")
        base = entry["base"]
        if not (isinstance(base, dict) and set(base) == {"source", BASE_CLAIM}
                and isinstance(base["source"], str)
                and isinstance(base[BASE_CLAIM], (str, type(None)))):
            raise FormatError(f"{what} base must be {{source: str, claimed: str or null}}.")
        pin = models.get(entry["model_role"])
        if not isinstance(pin, dict) or pin.get("strict") is not True \
                or not isinstance(pin.get("identity"), dict):
            raise FormatError(f"{what} names model role {entry['model_role']!r}, which is not a "
                              "strict pin with an identity; an adapter's base always is.")


#: The lineage section's keys (see ``trust/_lineage.py``), then its parent's and its changes':
#: every one required but ``changes.embedder``, there only when the embedder changed.
LINEAGE_KEYS = frozenset({"parent", "changes", "tool", "cubepack_version"})
PARENT_KEYS = frozenset(PARENT_LINK_KEYS + PARENT_ORIGIN_KEYS)
#: The changes of lock version 3 (every version's: ``sections.lineage.CHANGES``).
CHANGE_KEYS = frozenset({"models", "retokenized", "reembedded", "adapters_dropped"})
MODEL_CHANGE_KEYS = frozenset(_lineage.MODEL_CHANGE_KEYS)


def _check_lineage(lineage: Any, version: int) -> None:
    """Where the cube came from (see ``trust/_lineage.py``): known keys only, every field's
    type, 64-hex digests, a 40-hex revision (present exactly when the parent's repo is)."""
    def refuse(what: str) -> None:
        raise FormatError(f"cubepack.lock lineage {what}.")

    def exact_keys(value: Any, where: str, required: set[str],
                   optional: frozenset[str] = frozenset()) -> None:
        if not isinstance(value, dict):
            refuse(f"{where} must be an object")
        if not required <= set(value) <= required | optional:
            refuse(f"{where} must hold the keys {sorted(required)}"
                   + (f" (and optionally {sorted(optional)})" if optional else "")
                   + f", found {sorted(value)}")

    def text(value: Any, where: str, *, null: bool = False) -> None:
        if not ((null and value is None) or (isinstance(value, str) and value)):
            refuse(f"{where} must be a non-empty string" + (" or null" if null else ""))

    exact_keys(lineage, "", set(LINEAGE_KEYS))
    parent = lineage["parent"]
    exact_keys(parent, "parent", set(PARENT_KEYS))
    for key in ("lock_digest", "content_digest"):
        if not (isinstance(parent[key], str) and _HEX64.fullmatch(parent[key])):
            refuse(f"parent.{key} must be 64 lowercase hex digits")
    for key in ("cube_id", "repo_id"):
        text(parent[key], f"parent.{key}", null=True)
    if parent["revision"] is not None and not (isinstance(parent["revision"], str)
                                               and is_commit(parent["revision"])):
        refuse("parent.revision must be a 40-hex commit or null")
    if (parent["repo_id"] is None) != (parent["revision"] is None):
        refuse("parent.repo_id and parent.revision must be given together (or both null)")
    # Each kind's changes are declared by its section (``sections.lineage.register_change``).
    problem = change_problem(version, lineage["changes"])
    if problem:
        refuse(problem)
    text(lineage["tool"], "tool")
    text(lineage["cubepack_version"], "cubepack_version")


#: The ``encryption`` section (a private cube, issue #32): its format version, the scheme, the
#: private manifest (the clear cube's lock, encrypted: every plaintext digest), the
#: ciphertexts, public counts and whether the clear names (item ids) are hidden. Version 2
#: (issue #37) adds ``series`` (which private cube this is: drawn by encrypt, kept by rekey)
#: and ``generation`` (its write count: encrypt starts it, each rekey adds one), public and
#: signed with the lock, so anyone holding two signed revisions of a series can tell the newer
#: (a replay of an older one is told apart without a key). Version 1 is still read: a cube of
#: it has no generation to compare. Version 3 counts each memory kind under its lock
#: section's key (any of ``MEMORY_SECTIONS``: a new kind's counts need no format change);
#: versions 1 and 2 count exactly ``COUNT_KEYS``, and are still read.
ENCRYPTION_VERSION = 3
ENCRYPTION_VERSIONS = (1, 2, 3)
ENCRYPTION_SCHEME = "age-encryption.org/v1"
ENCRYPTION_KEYS_V1 = frozenset({"version", "scheme", "manifest", "ciphertexts", "counts",
                                "hidden_names"})
ENCRYPTION_KEYS = ENCRYPTION_KEYS_V1 | {"series", "generation"}
#: A series: 32 lowercase hex digits (128 random bits), drawn by encrypt, kept by rekey.
_SERIES = re.compile(r"[0-9a-f]{32}")
COUNT_KEYS = frozenset({"files", "activations", "adapters", "recipients"})
#: What every version's counts hold; from version 3, beside a count per memory section.
COUNT_BASE_KEYS = frozenset({"files", "recipients"})
#: The largest generation: inside the integers strict JSON reads exactly (+-2**53).
MAX_GENERATION = 2 ** 53 - 1


def generation(lock: Lock | dict[str, Any]) -> int | None:
    """A private cube's generation (its public lock's ``encryption.generation``), or None: a
    clear cube, or a private one written before generations (section version 1). ``lock``:
    parsed, or a lock document as written."""
    if isinstance(lock, Lock):
        return None if lock.encryption is None else lock.encryption.generation
    return (lock.get("encryption") or {}).get("generation")


def series(lock: Lock | dict[str, Any]) -> str | None:
    """A private cube's series (``encryption.series``), or None (as :func:`generation`)."""
    if isinstance(lock, Lock):
        return None if lock.encryption is None else lock.encryption.series
    return (lock.get("encryption") or {}).get("series")


def _check_encryption(value: Any, lock: dict[str, Any]) -> None:
    """A private cube's lock: every ciphertext listed and locked, nothing private in clear
    (no activation entries, adapters or lineage, whose digests and ids are the manifest's; no
    vectors record, whose sample names items)."""
    def refuse(what: str) -> None:
        raise FormatError(f"cubepack.lock encryption {what}.")

    version = value.get("version") if isinstance(value, dict) else None
    if type(version) is not int or version not in ENCRYPTION_VERSIONS:
        raise FormatError(f"cubepack.lock encryption is version {version!r}; this cubepack "
                          f"reads private cubes of versions {ENCRYPTION_VERSIONS[0]} to "
                          f"{ENCRYPTION_VERSIONS[-1]}. Upgrade cubepack.")
    keys = ENCRYPTION_KEYS if version >= 2 else ENCRYPTION_KEYS_V1
    if set(value) != keys:
        refuse(f"version {version} must hold exactly the keys {sorted(keys)}")
    if version >= 2 and not (type(value["generation"]) is int
                             and 1 <= value["generation"] <= MAX_GENERATION):
        refuse(f"generation must be an integer from 1 to {MAX_GENERATION}, found "
               f"{value['generation']!r}")
    if version >= 2 and not (isinstance(value["series"], str)
                             and _SERIES.fullmatch(value["series"])):
        refuse("series must be 32 lowercase hex digits")
    if value["scheme"] != ENCRYPTION_SCHEME:
        refuse(f"scheme must be {ENCRYPTION_SCHEME!r}, found {value['scheme']!r}")
    files = lock["files"]
    if value["manifest"] != fileset.PRIVATE_MANIFEST or value["manifest"] not in files:
        refuse(f"manifest must be {fileset.PRIVATE_MANIFEST!r}, listed in the lock's files")
    ciphertexts = value["ciphertexts"]
    if not (isinstance(ciphertexts, list) and all(isinstance(n, str) for n in ciphertexts)
            and ciphertexts == sorted(set(ciphertexts))):
        refuse("ciphertexts must be a sorted list of distinct names")
    named = set(ciphertexts) | {value["manifest"]}
    for name in files:
        if fileset.is_ciphertext(name) != (name in named):
            refuse(f"and the lock's files disagree on {name!r} (every .age file is a listed "
                   "ciphertext, and only those)")
    if not set(ciphertexts) <= set(files):
        refuse("names a ciphertext the lock's files do not hold")
    counts = value["counts"]
    if not (isinstance(counts, dict)
            and all(type(n) is int and n >= 0 for n in counts.values())):
        refuse("counts must map names to non-negative integers")
    if version < 3 and set(counts) != COUNT_KEYS:
        refuse(f"version {version}'s counts must map exactly {sorted(COUNT_KEYS)}")
    sections = set(MEMORY_SECTIONS)
    if version >= 3 and not (COUNT_BASE_KEYS <= set(counts) <= COUNT_BASE_KEYS | sections):
        refuse(f"counts must hold {sorted(COUNT_BASE_KEYS)}, and beside them only memory "
               f"sections ({', '.join(sorted(sections))}), found {sorted(counts)}")
    if not isinstance(value["hidden_names"], bool):
        refuse("hidden_names must be true or false")
    if lock["activations"] or "adapters" in lock or "lineage" in lock or "shards" in lock:
        refuse("cannot sit beside activation entries, shards, adapters or lineage in clear: a "
               "private cube keeps them in its encrypted manifest")
    for role, pin in lock["models"].items():
        if isinstance(pin, dict) and "vectors" in pin:
            refuse(f"cannot sit beside model {role!r}'s vectors record in clear (its sample "
                   "names memories)")
