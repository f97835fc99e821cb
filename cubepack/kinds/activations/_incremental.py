"""Incremental packs of a sharded cube (issue #40, item 3): a re-pack keeps every shard whose
memories are unchanged byte for byte, so the next push uploads only what changed.

- A memory still in the cube with the same bytes and lock facts (sha256, producer role, token
  count, KV dtype, layers) stays where it is: its shard's file is the same file. Its
  provenance label is this pack's (a re-pack establishes its labels anew): when it differs from
  the index's, the index is rewritten, never the shard.
- A memory removed (``pack --remove ID``) or replaced (``--remove ID`` with a new
  ``activations/ID.kv.safetensors``) leaves its shard's index: the index is rewritten (version
  2) and states the memory's old range as **dead** bytes; the shard's bytes stay, unread by
  anything (no index points at them), so its file is unchanged and not uploaded again.
- New memories (added or replacing) go to new shards numbered after the cube's last, each with
  its own index. Their ids may fall inside older shards' ranges: the lock (version 7) then holds
  overlapping ranges, and a reader of one memory reads the index of each shard whose range holds
  its id (``format/sections/shards.py``, :func:`~cubepack.format.sections.shards.shards_of`).
- ``compact`` (``ops/_compact.py``) rewrites the shards whose dead share passes its bound, and
  those of several memories larger than the shard bound (a smaller ``--shard-size``): their
  live memories go to new shards, the old files leave the cube.

A shard kept is hashed again first: a file that is not the one the last lock committed to is
refused, never carried into the new lock under new digests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._util import atomic
from ..._util.hashing import sha256_file
from ..._util.paths import resolve_inside
from ...errors import IntegrityError
from ...format.sections import Activation, FileEntry
from ...format.sections import shards as shardformat
from .._kind import PackJob


@dataclass
class Kept:
    """What an incremental pack keeps of the last lock's shards."""

    #: shard path -> its lock entry (without ``dead``: added once the layout is known)
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: shard path -> its dead bytes
    dead: dict[str, int] = field(default_factory=dict)
    #: the ids kept in a shard (the others are laid out in new shards)
    ids: set[str] = field(default_factory=set)
    #: the first number a new shard takes (after every shard of the last lock)
    next_number: int = 0
    #: the last lock was an appended layout (version 7)
    appended: bool = False
    #: compacting: the ranges of the shards kept, which a new shard's range must not cross
    fences: list[tuple[str, str]] = field(default_factory=list)

    def fenced(self, before: str, item_id: str) -> bool:
        """Compacting: does a kept shard's range start after ``before`` and at or before
        ``item_id`` (so a new shard holding both would overlap it)?"""
        return any(before < first <= item_id for first, _ in self.fences)


def same_memory(new: Activation, old: Activation) -> bool:
    """Is ``new`` (a whole file this pack staged) the memory ``old`` (a shard's record): the
    same bytes and facts (its label may differ: it is this pack's)?"""
    return (new.sha256, new.model_role, new.token_count, new.kv_dtype, new.num_layers) == (
        old.sha256, old.model_role, old.token_count, old.kv_dtype, old.num_layers)


def dead_share(size: int, dead: int) -> float:
    """The share of a shard's bytes no index points at (0 for an empty file)."""
    return dead / size if size else 0.0


def keep(job: PackJob, staging: Path, whole: dict[str, Activation],
         compact_above: float | None, bound: int) -> Kept:
    """Keep the last lock's shards for the memories of ``whole`` (this pack's memories, each
    staged as a whole file) they still hold unchanged; link each kept shard into ``staging``
    and rewrite its index when memories left it. ``compact_above``: a shard whose dead share
    would pass it is not kept (its live memories are laid out anew), nor one of several
    memories passing ``bound`` (this pack's shard bound: ``compact --shard-size``)."""
    earlier = job.earlier
    kept = Kept()
    if earlier is None or not earlier.shards:
        return kept
    kept.appended = earlier.version >= shardformat.APPENDED_LOCK_VERSION
    fetch = shardformat.local_fetch(job.cube)
    numbers = [int(m.group(1)) for m in map(shardformat.SHARD_NAME.fullmatch, earlier.shards)
               if m is not None]
    kept.next_number = max(numbers) + 1 if numbers else 0
    present = set(job.files)
    rewritten = overlapping(earlier.shards) if compact_above is not None else set()
    for path, shard in earlier.shards.items():
        if path in rewritten or not {path, shard.index} <= present:
            continue  # laid out anew (compacting), or not in this folder (a migrate's)
        index = shardformat.load_index(shard, fetch, earlier.models)
        live = [item for item, old in index.memories.items()
                if item in whole and same_memory(whole[item], old)]
        gone = [old.locator for item, old in index.memories.items() if item not in live]
        relabelled = any(whole[item].provenance != index.memories[item].provenance
                         for item in live)
        dead = _merged([*index.dead, *((loc.offset, loc.length) for loc in gone)])
        share = dead_share(index.shard_size, sum(length for _, length in dead))
        # Past the bound: a shard holding more than a lone memory larger than the bound.
        largest = max((index.memories[item].locator.length for item in live), default=0)
        if not live or (compact_above is not None and (
                share > compact_above or index.shard_size > max(bound, largest))):
            continue
        _link_checked(job.cube, staging, shard.locator)
        name = shardformat.index_name(path)
        if not gone and not relabelled:  # the same index, byte for byte
            atomic.link_or_copy(resolve_inside(job.cube, name), resolve_inside(staging, name))
        else:
            records = {item: shardformat.memory_record(whole[item],
                                                       index.memories[item].locator.offset,
                                                       index.memories[item].checksums or {})
                       for item in live}
            atomic.write_text(resolve_inside(staging, name), shardformat.index_document(
                FileEntry(path, index.shard_sha256, index.shard_size), records, dead))
        kept.entries[path] = shardformat.lock_entry(path, live)
        kept.dead[path] = sum(length for _, length in dead)
        kept.ids.update(live)
    if compact_above is not None:
        kept.fences = sorted((earlier.shards[path].first, earlier.shards[path].last)
                             for path in kept.entries)
    return kept


def overlapping(shards: Any) -> set[str]:
    """The shards a compaction lays out anew so that every range is disjoint again: each shard
    whose id range meets the span from the first to the last id of the shards whose ranges
    overlap (their memories, laid out in order, fill that span and nothing outside it)."""
    ranges = sorted((shard.first, shard.last, path) for path, shard in shards.items())
    # Two ranges overlap only if some range overlaps the next one by first id.
    crossing = {path for before, after in zip(ranges, ranges[1:]) if after[0] <= before[1]
                for path in (before[2], after[2])}
    if not crossing:
        return set()
    low = min(shards[path].first for path in crossing)
    high = max(shards[path].last for path in crossing)
    return {path for path, shard in shards.items() if shard.first <= high and low <= shard.last}


def appended_layout(kept: Kept, entries: dict[str, dict[str, Any]]) -> bool:
    """Does the new ``shards`` section (``entries``) need lock version 7: dead bytes, or
    ranges that overlap? A layout that needs neither (a compacted cube) goes back to 6."""
    if any(kept.dead.values()):
        return True
    ranges = sorted((entry["first"], entry["last"]) for entry in entries.values())
    return any(after[0] <= before[1] for before, after in zip(ranges, ranges[1:]))


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Dead ranges in order, each joined with the next when only alignment padding lies
    between them (one range for a run of removed memories)."""
    out: list[tuple[int, int]] = []
    for at, length in sorted(ranges):
        if out and at == shardformat.aligned(out[-1][0] + out[-1][1]):
            out[-1] = (out[-1][0], at + length - out[-1][0])
        else:
            out.append((at, length))
    return out


def _link_checked(cube: Path, staging: Path, locator: Any) -> None:
    """Link the shard ``locator`` names from ``cube`` into ``staging``, once its bytes are the
    ones the last lock committed to (dead bytes included: they are in the shard's sha256)."""
    source = resolve_inside(cube, locator.path)
    found = sha256_file(source)
    if found != locator.sha256:
        raise IntegrityError(f"{locator.path} hashes to {found}; the cube's lock says "
                             f"{locator.sha256}: the shard changed since it was packed, so "
                             "pack will not carry it. Restore it (pull the cube again).")
    target = resolve_inside(staging, locator.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic.link_or_copy(source, target)

