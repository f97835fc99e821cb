"""``cubepack pull REPO --include PATTERN``: a partial cube (the marker's format and the sparse
shard: :mod:`cubepack.format._partial`).

Into ``pull``'s staging folder, at the one commit it resolved: the lock (already there,
parsed, every listed path checked), then every file of the commit that holds no activation
memory (the config, MemOS's ``config.json`` and its other memories, the signature and
attestation: what a MemOS load of the memories needs), whole; then the memories the patterns
select. A pattern is matched (fnmatch, as ``hf download --include``) against each memory's id
and against its file's path. A memory of its own file is downloaded whole; a sharded memory is
fetched by HTTP Range through :class:`~cubepack.hub._open.RemoteCube` (the one owner of ranged
fetches: 206 and ``Content-Range`` checked), its shard's index first (checked against the lock
before it is parsed), adjacent memories of one shard in one request, and written at its
offset into a sparse file of the shard's size; a shard whose every memory is selected is
downloaded whole. An id without wildcards reads only its shard's index; a pattern with
wildcards reads every index (each at most 1,000 memories). The marker is written last; pull
then verifies the folder (``N of M memories checked``) and swaps it into place whole, so an
interrupted partial pull leaves nothing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .._util.hashing import sha256_file
from .._util.paths import resolve_inside
from ..errors import UnsupportedError, UsageError
from ..format import _partial as partialformat
from ..format.sections import Locator, Lock, ShardIndex
from ..format.sections import shards as shardformat
from ..kinds.activations._shards import checked_range
from . import _localdir
from ._client import HubClient
from ._open import RemoteCube

#: Parallel requests of a partial pull (as pull's).
_WORKERS = 4
#: Adjacent selected memories of a shard are fetched in one request up to this many bytes.
_MAX_RUN = 64 * 1024 * 1024
_WILDCARDS = set("*?[")


def place(client: HubClient, repo_id: str, repo_type: str, sha: str, lock: Lock,
          paths: list[str], include: Iterable[str], staging: Path,
          hashed: dict[str, str]) -> list[str]:
    """Place the partial cube of ``lock`` (already in ``staging``, its digest in ``hashed``)
    that ``include`` selects; ``paths``: the commit's files, checked. Returns the paths
    placed (``hashed`` gets each one's sha256, of the bytes written).

    Raises:
        UsageError: a pattern that selects no memory (a few ids named), no pattern.
        UnsupportedError: a private cube (its memories' ranges are in its encrypted manifest).
        FormatError: an index that is not the lock's, or lists a memory twice.
        HubError: a range the endpoint did not answer as asked.
    """
    patterns = list(dict.fromkeys(include))
    if not patterns or any(not isinstance(p, str) or not p.strip() for p in patterns):
        raise UsageError("--include takes a memory id, a cube path or an fnmatch pattern of "
                         "either (repeatable).")
    if lock.private:
        raise UnsupportedError(f"{repo_id}@{sha[:12]} is a private cube: its memories' byte "
                               "ranges are in its encrypted manifest, so it is pulled whole. "
                               f"Drop --include: cubepack pull {repo_id}@{sha}.")
    remote = RemoteCube(repo_id, repo_type, sha, lock, client)
    raw: dict[str, bytes] = {}
    indexes = _indexes(remote, lock, patterns, raw)
    selected = _select(lock, indexes, patterns, repo_id, sha)
    memory_files = partialformat.memory_files(lock)
    by_shard: dict[str, list[Any]] = {}
    whole: list[str] = [path for path in paths if path not in memory_files
                        and path not in hashed]
    for item_id, entry in selected.items():
        if lock.activations.get(item_id) is entry:
            whole.append(entry.file)
        else:
            by_shard.setdefault(entry.file, []).append(entry)
    shards = {shard.path: shard for shard in lock.shards.values()}
    for path, entries in by_shard.items():
        shard = shards[path]
        if len(entries) == shard.memories:  # every memory of it: the file, whole
            whole.append(path)
        _write_index(staging, shard, raw[shard.index], hashed)

    def download(path: str) -> tuple[str, str]:
        local = client.download(repo_id, path, repo_type=repo_type, revision=sha,
                                local_dir=staging)
        _localdir.require_commit(staging, path, sha, local)
        return path, sha256_file(resolve_inside(staging, path))

    def sparse(path: str) -> tuple[str, str]:
        _write_sparse(remote, staging, shards[path], by_shard[path])
        return path, sha256_file(resolve_inside(staging, path))

    with ThreadPoolExecutor(_WORKERS, thread_name_prefix="cubepack-partial") as pool:
        jobs = [pool.submit(client.bind(download), path) for path in sorted(set(whole))]
        jobs += [pool.submit(client.bind(sparse), path) for path in sorted(by_shard)
                 if path not in whole]
        try:
            for job in jobs:
                name, digest = job.result()
                hashed[name] = digest
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    marker = partialformat.Partial(
        repo_id, repo_type, sha, partialformat.lock_digest(staging), tuple(patterns),
        {item_id: entry.file for item_id, entry in selected.items()},
        partialformat.total(lock))
    partialformat.write(staging, marker)  # last: the folder is whole but for the memories
    return sorted(hashed) + [partialformat.MARKER]


def _indexes(remote: RemoteCube, lock: Lock, patterns: list[str],
             raw: dict[str, bytes]) -> dict[str, ShardIndex]:
    """The shard indexes the patterns need (each checked against the lock): every one when a
    pattern has wildcards, else those of the shards whose range holds an id asked for or whose
    path (or index's) is asked for. A memory listed twice across them is refused."""
    wild = any(_WILDCARDS & set(pattern) for pattern in patterns)
    needed = [shard for shard in lock.shards.values()
              if wild or shard.path in patterns or shard.index in patterns
              or any(shard.holds(pattern) for pattern in patterns)]
    found: dict[str, ShardIndex] = {}
    seen: dict[str, Any] = {}
    def fetch(locator: Locator) -> bytes:  # called by load_index once the lock's size passed
        raw[locator.path] = remote.fetch(locator)
        return raw[locator.path]

    for shard in needed:
        index = shardformat.load_index(shard, fetch, lock.models)
        shardformat.add_memories(seen, index, lock)
        found[shard.path] = index
    return found


def _select(lock: Lock, indexes: dict[str, ShardIndex], patterns: list[str], repo_id: str,
            sha: str) -> dict[str, Any]:
    """Every memory a pattern selects (by id, or by its file's path); a pattern that selects
    none is refused, naming a few ids the cube holds."""
    candidates = dict(lock.activations)
    for index in indexes.values():
        candidates.update(index.memories)
    selected: dict[str, Any] = {}
    for pattern in patterns:
        hits = {item: entry for item, entry in candidates.items()
                if partialformat.matches([pattern], item, entry.file)}
        if not hits:
            known = sorted(candidates)[:5] or [
                f"{shard.first} .. {shard.last}" for shard in list(lock.shards.values())[:3]]
            raise UsageError(
                f"--include {pattern!r} matches no memory of {repo_id}@{sha[:12]} (ids and "
                f"paths, fnmatch; it holds {partialformat.total(lock)} memories"
                + (f", e.g. {', '.join(known)}" if known else "") + "). Nothing was placed.")
        selected.update(hits)
    return dict(sorted(selected.items()))


def _write_index(staging: Path, shard: Any, data: bytes, hashed: dict[str, str]) -> None:
    path = resolve_inside(staging, shard.index)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    hashed[shard.index] = hashlib.sha256(data).hexdigest()


def _write_sparse(remote: RemoteCube, staging: Path, shard: Any, entries: list[Any]) -> None:
    """The selected memories of ``shard`` at their offsets in a file of the shard's size
    (holes elsewhere); adjacent ones fetched in one range. Each memory's bytes are checked
    against its index (sha256, KV checksums) before the file is written."""
    path = resolve_inside(staging, shard.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    runs: list[list[Any]] = []
    for entry in sorted(entries, key=lambda e: e.locator.offset):
        last = runs[-1][-1].locator if runs else None
        if last is not None and shardformat.aligned(last.end) == entry.locator.offset \
                and entry.locator.end - runs[-1][0].locator.offset <= _MAX_RUN:
            runs[-1].append(entry)
        else:
            runs.append([entry])
    with open(path, "wb") as handle:
        handle.truncate(shard.locator.length)
        for run in runs:
            start, end = run[0].locator.offset, run[-1].locator.end
            data = remote.fetch(Locator(shard.path, start, end - start, ""))
            for entry in run:
                at = entry.locator.offset - start
                view = memoryview(data)[at:at + entry.locator.length]
                checked_range(entry, bytearray(view))
            os.pwrite(handle.fileno(), data, start)
        handle.flush()
        os.fsync(handle.fileno())
