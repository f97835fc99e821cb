"""A partial cube (``cubepack pull --include``, issue #40): the lock, its signature, every file
that is no activation memory, and only the memories asked for. Its marker,
``.cache/cubepack/partial.json`` (bookkeeping: never locked, signed or pushed), names the lock
it belongs to (its sha256), the commit it came from, the patterns asked for, and every memory
present with the file that holds it; every reader of a cube folder reads it.

A memory of a sharded cube is placed **in a sparse shard**: the shard's file at its lock path,
of the lock's size, holding the memory's byte range at its offset and zeros (holes) elsewhere.
So a memory's locator reads it as in a whole cube (no second layout, no second reader), a file
system with holes (ext4, xfs, btrfs, APFS, NTFS) stores only the ranges, and a cubepack that
ignores the marker refuses the shard (its sha256 is not the lock's) instead of loading it.

The rules here are the format's: what the marker holds (:func:`read`), which of the lock's
files a partial cube may lack (:func:`absent_files`), that a sparse shard holds nothing but
its listed ranges (:func:`stray_bytes`), and the refusal of a verb that needs the cube whole
(:func:`refuse`).
"""

from __future__ import annotations

import fnmatch
import shlex
import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .._util import atomic, canonical, constants
from .._util.paths import check_relpath
from ..errors import FormatError, PartialCube
from ._fileset import CUBEPACK_LOCAL_DIR
from .sections.shards import activation_count, shards_of

#: The marker's path in a cube folder.
MARKER = f"{CUBEPACK_LOCAL_DIR}/partial.json"
FORMAT = "cubepack.partial"
VERSION = 1
_KEYS = {"format", "version", "repo_id", "repo_type", "commit_sha", "lock_sha256", "include",
         "memories", "total"}
#: The largest marker read (a million memories' names, about 100 bytes each).
MAX_MARKER_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class Partial:
    """What a partial pull placed: ``memories`` maps each memory present to the file holding
    it (its KV file, or its shard); ``total`` is how many memories the whole cube holds."""

    repo_id: str
    repo_type: str
    commit_sha: str
    lock_sha256: str
    include: tuple[str, ...]
    memories: Mapping[str, str]
    total: int

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "repo_id": self.repo_id,
                "repo_type": self.repo_type, "commit_sha": self.commit_sha,
                "lock_sha256": self.lock_sha256, "include": list(self.include),
                "memories": dict(sorted(self.memories.items())), "total": self.total}

    def with_more(self, more: list[str]) -> str:
        """The command that pulls this folder again with ``more`` memories besides its own."""
        asked = " ".join(f"--include {shlex.quote(p)}" for p in (*self.include, *more))
        return (f"cubepack pull {self.repo_id}@{self.commit_sha}"
                + (f" --repo-type {self.repo_type}" if self.repo_type != "dataset" else "")
                + f" {asked} --local-dir <this folder>")

    @property
    def whole_pull(self) -> str:
        """The command that makes this folder a whole cube."""
        return (f"cubepack pull {self.repo_id}@{self.commit_sha}"
                + (f" --repo-type {self.repo_type}" if self.repo_type != "dataset" else "")
                + " --local-dir <this folder>")


def read(cube: str | os.PathLike[str]) -> Partial | None:
    """The marker of the cube folder ``cube`` (None: no marker, a whole cube).

    Raises:
        FormatError: a marker that is not one (malformed, another version, a link): a folder
            whose marker cannot be read is no cube a reader can trust as whole or partial.
    """
    path = Path(cube) / MARKER
    if not os.path.lexists(path):
        return None
    if path.is_symlink() or not path.is_file():
        raise FormatError(f"{path} is not a regular file: a partial pull's marker is one.")
    if path.stat().st_size > MAX_MARKER_BYTES:
        raise FormatError(f"{path} is above the {MAX_MARKER_BYTES}-byte limit of a marker.")
    try:
        doc = canonical.loads_strict(path.read_bytes(), object_pairs_hook=canonical.unique_pairs)
    except (canonical.DuplicateKey, UnicodeDecodeError, ValueError) as exc:
        raise FormatError(f"{path} is not a partial pull's marker: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise FormatError(f"{path} is not a {FORMAT} document.")
    if doc.get("version") != VERSION or type(doc.get("version")) is not int:
        raise FormatError(f"{path} is version {doc.get('version')!r}; this cubepack reads "
                          f"version {VERSION}. Upgrade cubepack, or pull the cube again.")
    memories = doc.get("memories")
    if set(doc) != _KEYS or not all(isinstance(doc[key], str) for key in (
            "repo_id", "repo_type", "commit_sha", "lock_sha256")) \
            or not isinstance(doc["include"], list) \
            or not all(isinstance(item, str) for item in doc["include"]) \
            or not isinstance(memories, dict) or not memories \
            or not all(isinstance(name, str) for name in memories.values()) \
            or type(doc["total"]) is not int or not len(memories) <= doc["total"]:
        raise FormatError(f"{path} is malformed: it holds exactly {sorted(_KEYS)}, memories a "
                          "non-empty object of id -> file, total an integer at least as large.")
    for name in memories.values():
        check_relpath(name)
    return Partial(doc["repo_id"], doc["repo_type"], doc["commit_sha"], doc["lock_sha256"],
                   tuple(doc["include"]), dict(memories), doc["total"])


def write(staging: Path, partial: Partial) -> None:
    """Write the marker into ``staging`` (atomically: temp file, then rename)."""
    atomic.write_text(staging / MARKER, canonical.dumps(partial.to_dict()))


def lock_digest(cube: Path) -> str:
    """sha256 of the lock's bytes in ``cube``: what the marker names."""
    return hashlib.sha256((cube / constants.LOCK_FILENAME).read_bytes()).hexdigest()


def matches(patterns: Iterable[str], item_id: str, path: str) -> list[str]:
    """The patterns (fnmatch, as ``hf download --include``) that select the memory ``item_id``
    held in ``path``: matched against its id and against its file's path in the cube. A
    pattern equal to the id (or the path) selects it whatever fnmatch makes of it: an id
    holding ``[3]`` is named as it is (as a load of the absent memory prints it), not as a
    character class."""
    return [pattern for pattern in patterns
            if pattern in (item_id, path) or fnmatch.fnmatchcase(item_id, pattern)
            or fnmatch.fnmatchcase(path, pattern)]


def memory_files(lock: Any) -> set[str]:
    """The lock's files that hold activation memories: their KV files and their shards (with
    the shards' indexes): the files a partial cube may lack."""
    files = {entry.file for entry in lock.activations.values()}
    for shard in lock.shards.values():
        files |= {shard.path, shard.index}
    return files


def total(lock: Any) -> int:
    """How many memories the whole cube holds (the lock's count: no index read)."""
    return activation_count(lock)


def owners(lock: Any, item_id: str) -> list[str]:
    """The files of the lock that may hold the memory ``item_id``: its KV file, or the shards
    whose id range holds it (one before lock version 7; after incremental packs, ranges may
    overlap and the shard's index says which holds it), or none."""
    entry = lock.activations.get(item_id)
    if entry is not None:
        return [entry.file]
    return [shard.path for shard in shards_of(lock.shards, item_id)]


def sparse(lock: Any, partial: Partial) -> set[str]:
    """The shards of ``lock`` only some of whose memories are present: placed sparse."""
    found: dict[str, int] = {}
    for path in partial.memories.values():
        found[path] = found.get(path, 0) + 1
    return {shard.path for shard in lock.shards.values()
            if 0 < found.get(shard.path, 0) < shard.memories}


def present(lock: Any, partial: Partial) -> Any:
    """``lock`` whose own memory entries are those ``partial`` lists (a shard's are added by
    whoever reads its index): what the checks of a partial cube's memories read."""
    kept = {item: entry for item, entry in lock.activations.items() if item in partial.memories}
    return replace(lock, activations=MappingProxyType(kept))


def absent_files(lock: Any, partial: Partial) -> set[str]:
    """The lock's files a partial cube lacks by design: every memory file but those holding a
    memory present (and the indexes of the shards that do)."""
    holding = set(partial.memories.values())
    keep = holding | {shard.index for shard in lock.shards.values() if shard.path in holding}
    return memory_files(lock) - keep


def stray_bytes(path: Path, ranges: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The first ``(offset, length)`` of non-zero bytes in the sparse shard ``path`` outside
    ``ranges`` (``(offset, end)`` of the memories present), or None: the shard holds nothing
    but them. Only the file's data extents are read (``SEEK_DATA``/``SEEK_HOLE`` where the
    file system has them), so a 2 GiB shard holding one memory reads little more than it."""
    ranges = sorted(ranges)
    with open(path, "rb") as handle:
        fd = handle.fileno()
        size = os.fstat(fd).st_size
        for start, end in _extents(fd, size):
            at = start
            while at < end:
                inside = next(((a, b) for a, b in ranges if a <= at < b), None)
                if inside is not None:
                    at = inside[1]
                    continue
                stop = min([end, *(a for a, _ in ranges if a > at)])
                while at < stop:
                    chunk = os.pread(fd, min(1 << 20, stop - at), at)
                    if not chunk:
                        return None
                    if chunk.count(0) != len(chunk):
                        first = next(i for i, byte in enumerate(chunk) if byte)
                        return at + first, stop - at - first
                    at += len(chunk)
    return None


def _extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The data extents of the open file ``fd`` (the whole file where holes cannot be told)."""
    if not (hasattr(os, "SEEK_DATA") and hasattr(os, "SEEK_HOLE")):
        return [(0, size)]
    extents, at = [], 0
    try:
        while at < size:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after ``at``
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            extents.append((start, end))
            at = end
    except OSError:
        return [(0, size)]
    return extents


def refuse(cube: str | os.PathLike[str], verb: str, why: str) -> None:
    """Refuse ``verb`` on a partial cube (``why``: what it would do with the memories it
    lacks), naming the pull that makes it whole. A cube without a marker passes."""
    try:
        partial = read(cube)
    except FormatError as exc:
        raise PartialCube(f"{cube} holds a partial pull's marker that cannot be read ({exc}); "
                          f"{verb} needs the cube whole: pull it whole again.") from exc
    if partial is None:
        return
    raise PartialCube(f"{cube} is a partial pull of {partial.repo_id}@{partial.commit_sha[:12]} "
                      f"({len(partial.memories)} of {partial.total} memories): {verb} {why}, "
                      f"so it needs the cube whole. Pull it whole: {partial.whole_pull}.")
