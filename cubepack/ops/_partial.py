"""What ``verify`` checks of a partial cube (``cubepack pull --include``; the marker's format
is :mod:`cubepack.format._partial`). A partial cube is never reported as complete: the
``partial`` check says "N of M memories checked", and the CLI exits 4 (``PartialCube``).

Every byte present is checked: the marker must name this very lock (its sha256) and its count
of memories; each memory it lists must be one of the lock's (its own entries, or a shard's
index, which is present whole and checked against the lock), in the file it says, and its bytes
are checked as a whole cube's (a KV file's sha256; a shard's range against its index); a sparse
shard must hold nothing but the ranges of the memories listed (else a memory is present but not
listed: refused); a memory file the marker names no memory of must be absent.

A folder whose memories are **fetched later** (the MemOS hook's load on first use: every file of
the cube but its activation memories, each memory fetched and checked when first used) is
planned by the same rule, as a partial cube that holds none of its memories (:func:`later`):
its memory files absent by design, any of them present refused, and the ``partial`` check says
"0 of M memories here, fetched and checked on first use", never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .._util.checks import Catalogue
from .._util.paths import resolve_inside
from ..errors import CubepackError
from ..format import _partial as partialformat
from ..format.sections import Lock, shards
from .._util import constants
from ..trust._report import VerifyReport
from ..trust._signing import verify_lock_signature as _verify_lock_signature


@dataclass
class Plan:
    """A partial cube's files, as its marker and lock say: ``absent``, the lock's files it may
    lack; ``sparse``, the shards only some of whose memories are present; ``later``, the
    memories are fetched and checked on first use by whoever placed the folder (no marker:
    ``marker`` is what that caller opened)."""

    marker: partialformat.Partial
    absent: set[str] = field(default_factory=set)
    sparse: set[str] = field(default_factory=set)
    failed: bool = False
    later: bool = False


def later(report: VerifyReport, lock: Lock, origin: tuple[str, str, str]) -> Plan:
    """The plan of a folder holding every file of ``lock`` but its activation memories, which
    the caller fetches from ``origin`` (repo id, repo type, commit) and checks on first use:
    the partial cube's rule with no memory present (every memory file absent by design)."""
    repo_id, repo_type, commit = origin
    marker = partialformat.Partial(repo_id, repo_type, commit, report.lock_sha256 or "", (),
                                   {}, partialformat.total(lock))
    return Plan(marker, partialformat.absent_files(lock, marker), set(), later=True)


def plan(report: VerifyReport, lock: Lock) -> Plan | None:
    """The partial cube's plan, or None for a whole cube. A marker that cannot be read, or
    that names another lock or count, fails the ``partial`` check (every memory file is then
    expected, so nothing absent passes)."""
    try:
        marker = partialformat.read(report.cube_dir)
    except CubepackError as exc:
        report.add(Catalogue.PARTIAL, partialformat.MARKER, False, str(exc))
        return None
    if marker is None:
        return None
    result = Plan(marker)
    total = partialformat.total(lock)
    where = partialformat.MARKER
    if lock.private:
        return _fail(report, result, where, "a private cube is never pulled in part; this "
                     "marker was not written by cubepack")
    if marker.lock_sha256 != report.lock_sha256:
        return _fail(report, result, where, "names another lock than this folder's: it does "
                     "not describe these files", marker.lock_sha256, report.lock_sha256)
    if marker.total != total:
        return _fail(report, result, where, "counts another number of memories than the lock",
                     total, marker.total)
    for item_id, path in sorted(marker.memories.items()):
        owners = partialformat.owners(lock, item_id)
        if path not in owners:
            return _fail(report, result, f"{where} ({item_id})",
                         "lists a memory the lock does not hold in that file",
                         " or ".join(owners) or None, path)
    result.absent = partialformat.absent_files(lock, marker)
    result.sparse = partialformat.sparse(lock, marker)
    return result


def _fail(report: VerifyReport, result: Plan, subject: str, detail: str, expected: Any = None,
          found: Any = None) -> Plan:
    report.add(Catalogue.PARTIAL, subject, False, detail, expected, found)
    result.failed = True
    result.absent, result.sparse = set(), set()
    return result


def check_present(report: VerifyReport, partial: Plan, on_disk: set[str]) -> None:
    """A memory file the marker names no memory of is refused when it is here: a memory
    present but not listed."""
    for name in sorted(partial.absent & on_disk):
        report.add(Catalogue.PARTIAL, name, False, "is here, but the partial pull's marker lists "
                   "no memory it holds: a partial cube holds the memories its marker lists, "
                   "and no other", "absent", "present")
        partial.failed = True


def check_sparse(report: VerifyReport, lock: Lock, partial: Plan,
                 shard: shards.Shard, index: Any) -> dict[str, Any]:
    """A sparse shard (its index checked against the lock): each memory the marker lists in it
    is in its index and its range hashes to the index's sha256; nothing else is in the file.
    Returns the memories present (empty when a check failed)."""
    fetch = shards.local_fetch(report.cube_dir)
    listed = sorted(item for item, path in partial.marker.memories.items() if path == shard.path)
    subject = f"{shard.path} (partial)"
    unknown = [item for item in listed if item not in index.memories]
    if unknown:
        report.add(Catalogue.PARTIAL, subject, False, f"the marker lists {unknown[0]!r}, which "
                   f"the shard's index does not hold")
        partial.failed = True
        return {}
    present = {item: index.memories[item] for item in listed}
    try:
        shards.check_memories(replace(index, memories=MappingProxyType(present)), fetch)
    except CubepackError as exc:
        report.add(Catalogue.PARTIAL, subject, False, str(exc))
        partial.failed = True
        return {}
    stray = partialformat.stray_bytes(
        resolve_inside(report.cube_dir, shard.path),
        [(entry.locator.offset, entry.locator.end) for entry in present.values()])
    if stray is not None:
        holder = next((item for item, entry in index.memories.items()
                       if entry.locator.offset <= stray[0] < entry.locator.end), None)
        report.add(Catalogue.PARTIAL, subject, False, f"holds bytes at offset {stray[0]} "
                   + (f"(memory {holder!r}) " if holder else "(between memories) ")
                   + "outside the memories its marker lists: a memory present but not listed, "
                   "or bytes that are no memory", "zeros", "data")
        partial.failed = True
        return {}
    report.add(Catalogue.PARTIAL, subject, True, f"{len(present)} of {shard.memories} memories "
               "here, each range hashing to its index's sha256; nothing else in the file")
    return present


def summary(report: VerifyReport, lock: Lock, partial: Plan, asked: list[Any]) -> None:
    """The ``partial`` check that says how much was checked: never a pass, always a skip."""
    marker = partial.marker
    total = partialformat.total(lock)
    checked = len(marker.memories)
    applied = [str(check) for check in asked]  # what the policy asked: run on those here
    report.partial = {"checked": checked, "memories": total, "repo_id": marker.repo_id,
                      "commit_sha": marker.commit_sha, "include": list(marker.include),
                      "present": sorted(marker.memories)}
    if partial.later:
        report.partial["later"] = True
        report.add(Catalogue.PARTIAL, "*", None,
                   f"0 of {total} memories here: every activation memory of "
                   f"{marker.repo_id}@{marker.commit_sha[:12]} is fetched and checked when "
                   "first used (its bytes against the lock, its producer against the model), "
                   "not by this verification")
        return
    report.add(Catalogue.PARTIAL, "*", None,
               f"{checked} of {total} memories checked: a partial pull of {marker.repo_id}@"
               f"{marker.commit_sha[:12]} (--include {' '.join(marker.include)}); the other "
               f"{total - checked} are not here, so this is not the whole cube"
               + (f"; {', '.join(applied)} applied to the {checked} memories present"
                  if applied else "")
               + f". Pull it whole to check them: {marker.whole_pull}")


def present(report: VerifyReport) -> frozenset[str] | None:
    """The memories a partial cube holds (its marker's), or None for a whole cube."""
    return None if report.partial is None else frozenset(report.partial["present"])


def verify_lock_signature(cube: Path, trusted_keys: list[str]) -> str:
    """The signature of a partial cube, checked over its lock (and attestation): the key that
    verified (SignatureError otherwise)."""
    def read(name: str) -> bytes | None:
        path = cube / name
        return path.read_bytes() if path.is_file() and not path.is_symlink() else None

    return _verify_lock_signature(read(constants.LOCK_FILENAME) or b"",
                                  read(constants.SIGNATURE_FILENAME),
                                  read(constants.ATTESTATION_FILENAME), trusted_keys)
