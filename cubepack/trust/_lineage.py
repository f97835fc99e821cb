"""Lineage: the cube a derived cube came from, and what changed (no torch, no HTTP).

``cubepack migrate`` writes the lock's ``lineage`` section (validated by
:func:`cubepack.format._lock._check_lineage`)::

    {"parent": {"lock_digest", "content_digest", "cube_id", "repo_id", "revision"},
     "changes": {"models": {role: {"from", "to", "from_weights", "to_weights"}},
                 "embedder": {"from", "to"},            # only when it changed
                 "retokenized": [item ids], "reembedded": int, "adapters_dropped": [names]},
     "tool": "cubepack migrate", "cubepack_version": str}

``repo_id`` / ``revision`` name the Hub commit the parent was pulled from (its pull's origin
record), when the parent's lock is still the one that commit holds and this user's pull wrote
that record; otherwise both are null and the chain cannot be followed past it. The folder's
record (``.cache/cubepack/origin.json``) is a file anyone handing over a folder can write, so a
pull also records what it fetched in cubepack's own cache (:func:`record_pull`: the lock's
sha256 -> repo and commit), and only a record found there counts. ``cubepack lineage --follow``
(:mod:`cubepack.hub._lineage`) fetches each parent's lock at that commit and requires its digest
to be the one recorded here.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._util import atomic, canonical, constants
from .._util.paths import managed_folder, regular_file, resolve_inside, resolve_owned_root
from .._util.revision import is_commit
from .._version import __version__
from ..errors import FormatError, UnsafeInputError
from ..format._fileset import ORIGIN_FILE
from ..format.sections import Lock, Pin
from ..format.sections.lineage import stated_changes
from ..trust._evidence import CLAIMED

TOOL = "cubepack migrate"
PEFT_CONFIG = "adapter_config.json"


#: The folder of ``$CUBEPACK_CACHE`` where pulls record what they fetched (one folder per
#: lock sha256, one file per repo and commit it was fetched from).
PULLS_DIR = "pulls"


def _pull_record(repo_id: str, repo_type: str, commit: str,
                 lock_sha256: str) -> tuple[str, str]:
    """(file name, text) of the record of one pull in cubepack's cache."""
    text = canonical.dumps({"repo_id": repo_id, "repo_type": repo_type, "commit_sha": commit,
                            "lock_sha256": lock_sha256})
    return hashlib.sha256(text.encode("utf-8")).hexdigest() + ".json", text


def record_pull(repo_id: str, repo_type: str, commit: str, lock_bytes: bytes) -> None:
    """Record in cubepack's own cache that this user's pull fetched the lock ``lock_bytes`` from
    ``repo_id`` at ``commit``: what :func:`pulled_from` requires before a folder's origin record
    names a parent (a record in the folder is anyone's to write).

    Raises:
        UnsafeInputError: the cache's folders are someone else's, or symlinks.
        UsageError: the cache cannot be written.
    """
    lock_sha256 = hashlib.sha256(lock_bytes).hexdigest()
    folder = managed_folder(constants.cache_dir(), (PULLS_DIR, lock_sha256),
                            what="CUBEPACK_CACHE")
    name, text = _pull_record(repo_id, repo_type, commit, lock_sha256)
    with atomic.placing(folder, elsewhere="set CUBEPACK_CACHE to a writable folder"):
        atomic.write_text(folder / name, text)


def _recorded(repo_id: str, repo_type: str, commit: str, lock_sha256: str) -> bool:
    """Did this user's pull (:func:`record_pull`) fetch that lock from that commit? Read
    without following a symlink, and only a record this user owns (nobody else can make one)."""
    name, text = _pull_record(repo_id, repo_type, commit, lock_sha256)
    try:
        root = resolve_owned_root(constants.cache_dir(), "CUBEPACK_CACHE")
        path = regular_file(root, f"{PULLS_DIR}/{lock_sha256}/{name}")
        owner = getattr(os, "getuid", lambda: None)()
        if owner is not None and os.lstat(path).st_uid != owner:
            return False
        return path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError, UnsafeInputError):
        return False  # absent, unreadable or not a regular file of ours: no record


def pulled_from(cube: Path, lock_bytes: bytes) -> tuple[str | None, str | None]:
    """(repo id, commit) the cube was pulled from, by its pull's origin record, when that
    record is well-formed, its lock is byte for byte the one pulled, and this user's pull wrote
    it (:func:`record_pull`); else (None, None): never pulled, re-packed since (then it is not
    that commit's cube), or a record nobody's pull here wrote (hand-made, or a folder pulled by
    someone else)."""
    path = cube / ORIGIN_FILE
    if path.is_symlink() or not path.is_file():
        return None, None
    try:
        origin = canonical.loads_strict(path.read_bytes())
    except ValueError:
        return None, None
    if not isinstance(origin, dict):
        return None, None
    repo_id, sha, files = origin.get("repo_id"), origin.get("commit_sha"), origin.get("files")
    repo_type = origin.get("repo_type")
    entry = files.get(constants.LOCK_FILENAME) if isinstance(files, dict) else None
    lock_sha256 = hashlib.sha256(lock_bytes).hexdigest()
    if not (isinstance(repo_id, str) and repo_id and isinstance(sha, str) and is_commit(sha)
            and isinstance(repo_type, str) and isinstance(entry, dict)
            and entry.get("sha256") == lock_sha256
            and _recorded(repo_id, repo_type, sha, lock_sha256)):
        return None, None
    return repo_id, sha


def parent_link(cube: Path, lock: Lock, lock_bytes: bytes) -> dict[str, Any]:
    """The ``lineage.parent`` of a cube derived from ``cube`` (whose parsed lock is ``lock``)."""
    repo_id, revision = pulled_from(cube, lock_bytes)
    return {"lock_digest": lock.digest, "content_digest": lock.content_digest,
            "cube_id": lock.cube_id or None, "repo_id": repo_id, "revision": revision}


def build(parent: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """The lineage section of a cube derived from ``parent`` (:func:`parent_link`): what the
    kinds' migrate phases recorded (``changes``: key -> value, each key declared by a lock
    section, ``format.sections.lineage.register_change``), every other declared key at its
    default (nothing of that kind changed).

    Raises:
        ValueError: a change no section declares.
    """
    return {"parent": parent, "changes": stated_changes(changes),
            "tool": TOOL, "cubepack_version": __version__}


def pin_label(pin: Pin | None) -> str:
    """``repo@revision`` of a pin, else the name it was given (a folder), else its model id."""
    if pin is None:
        return "unnamed"
    if pin.where is not None:
        return pin.where
    return str(pin.name or (pin.identity.model_id if pin.identity else None) or "unnamed")


def ancestors_document(cube: Path, lock: Lock) -> dict[str, Any] | None:
    """What a cube derived from ``cube`` holds at ``ANCESTORS_FILENAME``: the parent's own
    attestation envelope, then each of the parent's ancestors' envelopes, in order; None when
    the parent carries no attestation of its own. Read as strict JSON only (their signatures
    are checked by whoever verifies the chain).

    Raises:
        FormatError: an attestation or the ancestors file is not a JSON object of the shape
            above.
    """
    own = cube / constants.ATTESTATION_FILENAME
    if own.is_symlink() or not own.is_file():
        return None
    envelopes = [_json_object(own, constants.ATTESTATION_FILENAME)]
    if constants.ANCESTORS_FILENAME in lock.files:
        path = resolve_inside(cube, constants.ANCESTORS_FILENAME)
        document = _json_object(path, constants.ANCESTORS_FILENAME)
        listed = document.get("envelopes")
        if set(document) != {"envelopes"} or not isinstance(listed, list) or not all(
                isinstance(envelope, dict) for envelope in listed):
            raise FormatError(f"{constants.ANCESTORS_FILENAME} must be {{\"envelopes\": [JSON "
                              "objects]}}.")
        envelopes += listed
    return {"envelopes": envelopes}


def _json_object(path: Path, name: str) -> dict[str, Any]:
    try:
        value = canonical.loads_strict(path.read_bytes())
    except ValueError as exc:
        raise FormatError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise FormatError(f"{name} must hold a JSON object.")
    return value


def adapters_in(lock: Lock) -> dict[str, list[str]]:
    """Adapter name -> the cube files in its folder (``parametric/NAME/``: PEFT's two files and
    whatever PEFT saved beside them, its README), from the lock's ``adapters`` section; pack
    refuses PEFT files anywhere else, so every adapter has an entry."""
    return {str(name): sorted(path for path in lock.files if path.startswith(entry.path + "/"))
            for name, entry in sorted(lock.adapters.items())}


def describe(lock: Lock) -> dict[str, Any]:
    """One link of a chain, as ``cubepack lineage`` shows it: this cube's digests and what its
    lineage says (its parent and what changed), or ``root`` when it records none."""
    lineage = lock.lineage
    entry: dict[str, Any] = {"lock_digest": lock.digest, "content_digest": lock.content_digest,
                             "cube_id": lock.cube_id, "root": lineage is None}
    if lineage is not None:
        # What the lock says of its parent is its writer's claim until a parent lock with
        # those digests is fetched at the commit it names (``lineage --follow``).
        entry.update(parent=lineage.parent_fields(), changes=lineage.changes_fields(),
                     tool=lineage.tool, cubepack_version=lineage.cubepack_version,
                     parent_basis=CLAIMED)
    return entry
