"""Activation memories many to a file (issue #40; the format is
``format/sections/shards.py``'s): ``pack`` lays a cube's KV files out in shards, each with its
index (:func:`store`), and takes a sharded cube apart again before it packs it anew
(:func:`unshard`); a reader reads one memory's range and checks it before any tensor is built
(:func:`memory_bytes`).

When pack shards: asked (``shards=True``, ``--shards``, or a ``--shard-size``), or, unasked,
when the cube holds more than :data:`SHARD_ABOVE` activation memories or was sharded already.
Below that bound one file a memory stays within every Hub recommendation and keeps a cube
readable by cubepacks before lock version 6; above it, the Hub's per-file cost (100 files a
commit, 10k entries a folder) and a lock growing by each memory's entry are what sharding
removes.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from types import MappingProxyType
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

from ..._util import atomic, canonical, constants
from ..._util.paths import resolve_inside
from ...errors import CubepackError, FormatError, IntegrityError, PartialCube, UsageError
from ...format._fileset import is_activation_path
from ...format import _lock as lockfile
from ...format import _partial as partialformat
from ...format.sections import Activation, FileEntry, Lock
from ...format.sections import shards as shardformat
from ...kv._format import KVFileInfo, checksum_verdict, read_kv_header
from .._kind import PackJob
from . import _incremental
from ._pack import activation_filename

#: Unasked, pack shards a cube holding more activation memories than this (the Hub's
#: recommended most files a commit).
SHARD_ABOVE = 100
_CHUNK = 8 * 1024 * 1024


def resolved(lock: Lock, cube: Path) -> Lock:
    """``lock`` with the memories of its shards (their indexes read from ``cube``, each
    checked against the lock) among its activations."""
    return shardformat.resolved(lock, shardformat.local_fetch(cube))


def memory_bytes(cube: Path, entry: Activation) -> Any:
    """The bytes of the memory ``entry`` (a range of its shard), checked before anything
    reads them: their length and sha256 the index's, then the KV header's checksum record
    the index's. A copy-on-write view of the shard (tensors built on it never reach the
    file); None for a memory that is a whole file (read from its path as always).

    Raises:
        IntegrityError: the range's bytes, or its header's checksums, differ from the
            index's (a swapped or damaged memory).
    """
    if entry.checksums is None:
        return None
    return checked_range(entry, _mapped_range(cube, entry))


def _mapped_range(cube: Path, entry: Activation) -> Any:
    """The memory ``entry``'s range of its shard, unchecked: a copy-on-write view."""
    locator = entry.locator
    path = resolve_inside(cube, locator.path)
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if locator.end > size:
            raise IntegrityError(f"{locator.path} is {size} bytes; memory {entry.item_id!r} "
                                 f"lies at [{locator.offset}:{locator.end}]: the shard is "
                                 "truncated. Pull or restore the cube.")
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    return memoryview(mapped)[locator.offset:locator.end]


def checked_range(entry: Activation, data: Any) -> Any:
    """``data`` if it is the memory ``entry``'s bytes (length, sha256) and its KV header
    records the checksums the index states; else an IntegrityError naming the memory."""
    _check_range(entry, data)
    return data


def _check_range(entry: Activation, data: Any) -> KVFileInfo | None:
    """:func:`checked_range`'s checks; the KV header they parsed (None for a whole file),
    so a reader of the header parses it once (verify reads every memory's: 10,000 and more)."""
    _check_digest(entry, data)
    if entry.checksums is None:
        return None
    return _range_header(entry, data)


def _check_digest(entry: Activation, data: Any) -> None:
    """``data`` is the memory ``entry``'s bytes: its length and sha256 (IntegrityError)."""
    locator = entry.locator
    found = hashlib.sha256(data).hexdigest() if len(data) == locator.length else None
    if entry.checksums is None:  # a whole KV file: its lock's sha256, and its own checksums
        if found != locator.sha256:
            raise IntegrityError(f"memory {entry.item_id!r} ({locator.path}) hashes to "
                                 f"{found}, its lock says {locator.sha256}; nothing was "
                                 "loaded. Pull the cube again.")
        return
    if found != locator.sha256:
        raise IntegrityError(
            f"memory {entry.item_id!r} ({locator.path} [{locator.offset}:{locator.end}]) is "
            + (f"{len(data)} bytes, expected {locator.length}" if found is None else
               f"sha256 {found}, its index says {locator.sha256}")
            + ": its bytes are not the ones the cube's lock commits to; nothing was loaded. "
            "Pull the cube again.")


def _range_header(entry: Activation, data: Any) -> KVFileInfo:
    """The KV header of a shard memory's range whose digest was checked, its checksum record
    the index's (IntegrityError otherwise)."""
    locator = entry.locator
    info = read_kv_header(f"{locator.path}#{entry.item_id}", data=data)
    meta = canonical.loads_strict(info.header.metadata[constants.KV_METADATA_KEY])
    if meta.get("checksums") != dict(entry.checksums or {}):
        raise IntegrityError(f"memory {entry.item_id!r} in {locator.path}: its KV header's "
                             "checksums differ from its index's; nothing was loaded.")
    return info


def read_header(cube: Path, entry: Activation) -> KVFileInfo:
    """The KV header of the memory ``entry`` of the cube ``cube``: its file's, or its shard
    range's once that range is checked (:func:`memory_bytes`)."""
    if entry.checksums is None:  # a whole file (memory_bytes reads none)
        return read_kv_header(resolve_inside(cube, entry.file))
    # A shard's memory: its header was parsed to be checked (never None), and is not again.
    return cast(KVFileInfo, _check_range(entry, _mapped_range(cube, entry)))


@dataclass(frozen=True)
class ProvedShard:
    """What :func:`prove_shards` established of one shard: every byte, through its index (each
    memory's range hashed against its sha256, the padding zeros, the size the index's), or the
    error that refused it; and each memory's KV header as parsed from the range it proved
    (``headers``: id -> the header and its tensors' checksum verdict, or the error)."""

    error: CubepackError | None
    headers: Mapping[str, tuple[KVFileInfo, tuple[bool | None, str]] | CubepackError]


def prove_shards(cube: Path, indexes: list[Any],
                 workers: int | None = None) -> dict[str, ProvedShard]:
    """Prove every byte of the shards of ``indexes`` (each checked against the lock, without
    dead ranges: its memories tile the shard, :func:`~...shardformat.parse_index`) by hashing
    each memory's range once against its index's sha256, all shards' ranges in one pool of
    ``workers`` threads (the cores), largest first (``hashlib`` releases the GIL), and checking
    the alignment padding is zeros and the file's size the index's. Each range's KV header is
    parsed from the bytes just hashed, and its tensors checked against their XXH3 checksums, so
    ``verify`` reads no byte twice. Returns each shard's :class:`ProvedShard`."""
    results: dict[str, ProvedShard] = {}
    with contextlib.ExitStack() as stack:
        tasks = []
        for index in indexes:
            try:
                view = stack.enter_context(_mapped_shard(cube, index))
            except CubepackError as exc:
                results[index.shard] = ProvedShard(exc, {})
                continue
            tasks += [(index.shard, view, entry) for entry in index.memories.values()]
        tasks.sort(key=lambda task: task[2].locator.length, reverse=True)
        pool_size = max(1, min(workers or os.cpu_count() or 1, len(tasks)))
        with ThreadPoolExecutor(pool_size, thread_name_prefix="cubepack-prove") as pool:
            outcomes = list(pool.map(_prove_memory, tasks))
        failed: dict[str, CubepackError] = {}
        headers: dict[str, dict[str, Any]] = {}
        for (shard, _, entry), (digest_error, header) in zip(tasks, outcomes):
            if digest_error is not None:
                failed.setdefault(shard, digest_error)
            else:
                headers.setdefault(shard, {})[entry.item_id] = header
        del tasks, outcomes
        for index in indexes:
            if index.shard not in results:
                results[index.shard] = ProvedShard(
                    failed.get(index.shard), MappingProxyType(headers.get(index.shard, {})))
    return results


def _prove_memory(task: tuple[str, Any, Activation]) -> tuple[FormatError | None, Any]:
    """One memory of a shard being proved: (the error of its range's digest, which refuses the
    shard, or None; then its KV header and its tensors' verdict, parsed from those bytes, or
    the header's error, which the memory's KV header check reports)."""
    _, view, entry = task
    data = view[entry.locator.offset:entry.locator.end]
    try:
        try:
            entry.locator.check(data)  # verify's words for a range, as every range check's
        except FormatError as exc:
            return FormatError(f"memory {entry.item_id!r}: {exc} Its index and its bytes "
                               "disagree; pull or pack the cube again."), None
        try:
            info = _range_header(entry, data)
            verdict = checksum_verdict(info)
        except CubepackError as exc:
            return None, exc
        return None, (replace(info, data=None), verdict)  # the map is closed once all are done
    finally:
        data.release()


@contextlib.contextmanager
def _mapped_shard(cube: Path, index: Any) -> Iterator[memoryview]:
    """The shard of ``index`` mapped read-only, once its size is the index's and its padding
    (the bytes between its memories, which tile it) zeros: IntegrityError otherwise."""
    path = resolve_inside(cube, index.shard)
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size != index.shard_size:
            raise IntegrityError(f"{index.shard} is {size} bytes; its index (the lock's bytes) "
                                 f"lays its memories over {index.shard_size}: bytes were "
                                 + ("added past its end" if size > index.shard_size else
                                    "cut off") + ". Pull or restore the cube.")
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapped)
    try:
        end = 0  # the tiles (memories, dead ranges) as the index's layout check saw them
        tiles = [(e.locator.offset, e.locator.end, f"memory {e.item_id!r}")
                 for e in index.memories.values()]
        tiles += [(at, at + length, f"dead bytes [{at}:{at + length}]")
                  for at, length in index.dead]
        for at, stop, what in sorted(tiles):
            if any(view[end:at]):
                raise IntegrityError(f"{index.shard} holds data in the padding at bytes "
                                     f"[{end}:{at}] (before {what}), where its layout puts "
                                     "zeros: bytes that are no memory. Pull or restore the "
                                     "cube.")
            end = stop
        yield view
    finally:
        view.release()
        mapped.close()


def open_memory(cube: Path, item_id: str) -> tuple[str, Any]:
    """The memory ``item_id`` of the cube folder ``cube``, found through its lock (read and
    its digests checked) and, when sharded, its shard's index (checked against the lock):
    ``(name, bytes)``, the bytes checked against the lock's or the index's sha256 (and the
    index's checksums) before anything reads them.

    Raises:
        UsageError: the cube holds no memory of that id (its ids' range named), or
            ``item_id`` is no string.
        IntegrityError: the memory's bytes are not the ones its lock commits to.
        FormatError: the lock or the index is malformed, disagrees with the lock, or lists
            a memory the lock lists too.
    """
    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    partial = partialformat.read(cube)
    if partial is not None and item_id not in partial.memories:
        where = (" or ".join(partialformat.owners(lock, item_id))
                 if isinstance(item_id, str) else None)
        raise PartialCube(f"{cube} is a partial pull of {partial.repo_id}@"
                          f"{partial.commit_sha[:12]} ({len(partial.memories)} of "
                          f"{partial.total} memories); memory {item_id!r} is not here"
                          + (f" (the cube holds it, in {where})" if where else
                             " (nor does the cube hold it)")
                          + f". Pull it too: {partial.with_more([item_id])}, or the whole "
                          f"cube: {partial.whole_pull}.")
    # The shard's index read for this memory (what decides its load: MemoryReader); verify
    # reads every entry of it.
    entry = shardformat.find_memory(lock, item_id, lambda shard: shardformat.load_reader(
        shard, shardformat.local_fetch(cube), lock.models).memory(item_id))
    if entry is None:
        raise UsageError(f"{cube} holds no activation memory {item_id!r} ("
                         + (f"{len(lock.activations)} in its lock" if lock.activations else "")
                         + (", " if lock.activations and lock.shards else "")
                         + (f"{sum(s.memories for s in lock.shards.values())} in "
                            f"{len(lock.shards)} shard(s)" if lock.shards else "")
                         + "); list them with cubepack inspect or verify.")
    data = memory_bytes(cube, entry)
    name = f"{cube.name}/{entry.file}#{item_id}"
    if data is None:
        path = resolve_inside(cube, entry.file)
        with open(path, "rb") as handle:
            data = bytearray(handle.read())
        checked_range(entry, data)
    return name, data


@contextlib.contextmanager
def memory_file(cube: Path, item_id: str) -> Iterator[Path]:
    """The memory ``item_id`` of the cube folder ``cube`` as a KV file of its own, for a reader
    of KV files (the other runtimes' export): its bytes, checked against its lock (and its
    shard's index) by :func:`open_memory`, copied into a private temporary folder removed on
    exit, so the bytes read are the ones checked, from a shard's range or a whole file alike.

    Raises:
        UsageError, IntegrityError, FormatError: as :func:`open_memory`.
    """
    _, data = open_memory(Path(cube), item_id)
    with tempfile.TemporaryDirectory(prefix="cubepack-memory-") as folder:
        path = Path(folder) / Path(activation_filename(item_id)).name
        with open(path, "wb") as handle:
            handle.write(data)
        del data
        yield path


def refuse(options: Any) -> None:
    """Refuse layout options that contradict each other, before anything is read.

    Raises:
        UsageError: a ``shard_size`` with ``shards=False``, or one that is not a positive
            number of bytes.
    """
    if options.shards is False and options.shard_size is not None:
        raise UsageError("shard_size (--shard-size) bounds shards, and shards=False "
                         "(--no-shards) asks for none: give one of them.")
    size = options.shard_size
    if size is not None and (type(size) is not int or size < 1):
        raise UsageError(f"shard_size must be a positive number of bytes, not {size!r}.")


def wanted(job: PackJob, count: int) -> bool:
    """Does this pack shard the cube's ``count`` activation memories?

    Raises:
        UsageError: a ``shard_size`` with ``shards=False``.
    """
    asked = job.options.shards
    refuse(job.options)
    if asked is not None:
        return asked
    if job.options.shard_size is not None:
        return True
    earlier = job.earlier is not None and bool(job.earlier.shards)
    return earlier or count > SHARD_ABOVE


#: The key of a shard's bound among the pack settings ``cubepack.yaml`` records.
SHARD_SIZE_SETTING = "shard_size"


def shard_size(job: PackJob) -> int:
    """The bound this pack lays shards out to: ``--shard-size``, else the one the cube's last
    pack recorded (``cubepack.yaml``'s ``pack``), else the format's default, 2 GiB.

    Raises:
        UsageError: the option is not a positive number of bytes.
        FormatError: the recorded bound is not (the file was edited): naming the fix.
    """
    size = job.options.shard_size
    if size is not None:
        if type(size) is not int or size < 1:
            raise UsageError(f"shard_size must be a positive number of bytes, not {size!r}.")
        return size
    size = job.settings.get(SHARD_SIZE_SETTING)
    if size is None:
        return shardformat.DEFAULT_SHARD_SIZE
    if type(size) is not int or size < 1:
        raise FormatError(f"{job.cube / constants.CONFIG_FILENAME} records the shard bound "
                          f"{size!r} (pack: {SHARD_SIZE_SETTING}), not a positive number of "
                          "bytes; fix it, or pack with --shard-size SIZE, which replaces it.")
    return size


def settings(job: PackJob, sections: dict[str, Any]) -> dict[str, Any]:
    """The shard bound a later pack keeps, when this pack shards the cube and was given one
    (``--shard-size``, or its last pack's record): a cube packed at the default records none,
    so it follows the default. A pack that stores the memories one a file drops it."""
    if not sections.get("shards"):
        return {}
    if job.options.shard_size is None and SHARD_SIZE_SETTING not in job.settings:
        return {}
    return {SHARD_SIZE_SETTING: shard_size(job)}


def unshard(job: PackJob, staging: Path) -> None:
    """A sharded cube's memories back to one KV file each in ``staging`` (its shards and
    indexes removed there), each range checked against its index first; pack then seals
    them as any cube's, and :func:`store` shards them again when asked."""
    earlier = job.earlier
    listed = {name for shard in (earlier.shards.values() if earlier is not None else ())
              for name in (shard.path, shard.index)}
    stray = sorted(name for name in job.files if name.startswith(shardformat.SHARD_DIR + "/")
                   and name.endswith((shardformat.SHARD_SUFFIX, shardformat.INDEX_SUFFIX))
                   and name not in listed)
    if stray:
        raise UsageError(f"{job.cube / stray[0]} is a shard (or a shard's index) that no lock "
                         f"of this cube lists{f' ({len(stray) - 1} more)' if stray[1:] else ''}"
                         ": pack seals only the shards it wrote. Remove it, or pack the cube it "
                         "came from.")
    if earlier is None or not listed & set(job.files):
        return  # nothing sharded here (a migrate writes its memories one a file)
    lock = resolved(earlier, job.cube)
    removed = _removed(job, lock)
    for item_id, entry in lock.activations.items():
        if entry.checksums is None or item_id in removed:
            continue
        name = activation_filename(item_id)
        if name in job.files:
            raise UsageError(f"{job.cube / name} and {entry.file} both hold memory "
                             f"{item_id!r}: pack would have to drop one. Remove the file to "
                             "keep the shard's, or pack with --remove "
                             f"{item_id} to replace the shard's memory by the file.")
        data = memory_bytes(staging, entry)
        atomic.write_bytes(resolve_inside(staging, name), bytes(data))
        del data
    for shard in earlier.shards.values():
        for name in (shard.path, shard.index):
            resolve_inside(staging, name).unlink()
    folder = staging / shardformat.SHARD_DIR
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def _removed(job: PackJob, lock: Lock) -> set[str]:
    """The ids ``pack --remove`` drops from the cube's shards (each a memory a shard holds)."""
    removed = set(job.options.remove or ())
    for item_id in sorted(removed):
        entry = lock.activations.get(item_id)
        if entry is None or entry.checksums is None:
            raise UsageError(f"--remove {item_id}: no shard of {job.cube} holds a memory "
                             f"{item_id!r}" + (f" (it is the file {entry.file}: delete the "
                                               "file instead)" if entry is not None else "")
                             + "; nothing was packed.")
    return removed


def store(job: PackJob, staging: Path, section: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Lay the cube's KV files out in shards when this pack shards: ``{"activations": ...,
    "shards": ...}`` for the lock (the memories' entries move to the indexes), {} otherwise.
    Memories go in their ids' order, each shard filled to ``shard_size`` bytes or
    :data:`~cubepack.format.sections.shards.MAX_SHARD_MEMORIES` memories; a memory larger
    than the bound gets a shard of its own.

    Raises:
        FormatError: a KV file older than format 3 (no per-tensor checksums for its index):
            upgrade it first.
    """
    entries = shardformat.staged(section, lambda name: resolve_inside(staging, name).stat().st_size)
    whole = {item: entry for item, entry in entries.items() if is_activation_path(entry.file)}
    if not whole or not wanted(job, len(whole)):
        return {}
    bound = shard_size(job)
    kept = _incremental.keep(job, staging, whole, job.options.compact, bound)
    groups: list[list[str]] = [[]]
    filled = 0
    for item_id in sorted(item for item in whole if item not in kept.ids):
        at = shardformat.aligned(filled)
        if groups[-1] and (at + whole[item_id].locator.length > bound
                           or len(groups[-1]) == shardformat.MAX_SHARD_MEMORIES
                           or kept.fenced(groups[-1][-1], item_id)):
            groups.append([])
            at = 0
        groups[-1].append(item_id)
        filled = at + whole[item_id].locator.length
    shards = dict(kept.entries)
    for number, items in enumerate(group for group in groups if group):
        name = shardformat.shard_name(kept.next_number + number)
        _write_shard(staging, name, [whole[item] for item in items])
        shards[name] = shardformat.lock_entry(name, items)
    if _incremental.appended_layout(kept, shards):  # lock version 7: each entry's dead bytes
        shards = {name: {**entry, "dead": kept.dead.get(name, 0)}
                  for name, entry in shards.items()}
    for entry in whole.values():
        resolve_inside(staging, entry.file).unlink()
    folder = staging / constants.ACTIVATIONS_DIR
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
    return {"activations": {item: value for item, value in section.items() if item not in whole},
            "shards": shards}


def _write_shard(staging: Path, name: str, entries: list[Activation]) -> None:
    """Write the shard ``name`` holding ``entries`` (each a whole KV file in ``staging``),
    then its index."""
    memories: dict[str, Any] = {}
    digest = hashlib.sha256()
    target = resolve_inside(staging, name)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic.atomic_path(target) as temporary, open(temporary, "wb") as out:
        offset = 0
        for entry in entries:
            source = resolve_inside(staging, entry.file)
            info = read_kv_header(source)
            if info.checksums is None:
                raise FormatError(f"{entry.file} is KV format {info.version}, without the "
                                  "per-tensor checksums a shard's index records; upgrade it "
                                  "first: cubepack upgrade CUBE --model MODEL.")
            meta = canonical.loads_strict(info.header.metadata[constants.KV_METADATA_KEY])
            pad = b"\0" * (shardformat.aligned(offset) - offset)
            out.write(pad)
            digest.update(pad)
            offset += len(pad)
            memory = hashlib.sha256()
            with open(source, "rb") as handle:
                while chunk := handle.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    memory.update(chunk)
            if memory.hexdigest() != entry.sha256:
                raise IntegrityError(f"{entry.file} changed while it was sharded (sha256 "
                                     f"{memory.hexdigest()}, hashed {entry.sha256}); pack "
                                     "again.")
            memories[entry.item_id] = shardformat.memory_record(entry, offset,
                                                                meta["checksums"])
            offset += entry.locator.length
    atomic.write_text(resolve_inside(staging, shardformat.index_name(name)),
                      shardformat.index_document(
                          FileEntry(name, digest.hexdigest(), offset), memories))


def shard_files(content: list[str]) -> list[str]:
    """The shards among ``content`` (a cube's files)."""
    return [name for name in content if shardformat.is_shard_path(name)]


def carry_labels(job: PackJob) -> None:
    """``compact`` moves memories and changes none: each keeps the label its last lock gave
    the same bytes (carried as that lock's claim, never as proved), so a signature over the
    memories survives it."""
    if job.options.compact is None or job.earlier is None:
        return
    resolved = shardformat.resolved(job.earlier, shardformat.local_fetch(job.cube))
    job.carried.update({entry.sha256: entry.provenance.to_dict()
                        for entry in resolved.activations.values()
                        if entry.provenance is not None})
