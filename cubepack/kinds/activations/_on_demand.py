"""One memory read through a source of ranges (issue #40): a private cube's clear files
decrypted chunk by chunk (``ops/_private_range.py``), found and checked as a clear cube's
memory is (:func:`read_memory`): its shard found from the lock, the shard's index fetched
(checked against the lock's sha256 and size before it is parsed, against the lock's entry
after), then the memory's range, checked against the index's sha256 and checksums before any
tensor is built."""

from __future__ import annotations

from typing import Any

from ...errors import UsageError
from ...format.sections import Locator
from ...format.sections import shards as shardformat
from ._shards import checked_range

__all__ = ["read_memory"]


def read_memory(source: Any, item_id: str) -> tuple[str, Any]:
    """``(name, bytes)`` of the memory ``item_id`` through ``source``: an object with
    ``lock`` (the cube's clear lock), ``fetch(locator)`` (a clear file's range), ``where``
    (how errors name the cube) and ``indexes`` (shard path -> its index, filled here: each
    index is fetched once a source).

    Raises:
        UsageError: the cube holds no memory of that id (or ``item_id`` is no string).
        FormatError: an index that is not the lock's, or disagrees with it.
        IntegrityError: the memory's bytes are not the ones its index (or lock) records.
    """
    lock = source.lock

    def index_of(shard: shardformat.Shard) -> shardformat.ShardIndex:
        if shard.path not in source.indexes:
            # An index is parsed (text): its plaintext as bytes, not the source's buffer.
            source.indexes[shard.path] = shardformat.load_index(
                shard, lambda locator: bytes(source.fetch(locator)), lock.models)
        return source.indexes[shard.path]

    entry = shardformat.find_memory(lock, item_id, index_of)
    if entry is None:
        raise UsageError(f"{source.where} holds no activation memory {item_id!r} "
                         f"({shardformat.activation_count(lock)} memories).")
    locator = entry.locator
    if entry.checksums is None:  # a whole KV file: the lock's own entry
        locator = Locator.whole(entry.file, locator.length, locator.sha256)
    data = checked_range(entry, source.fetch(locator))
    return f"{source.where}/{entry.file}#{item_id}", data
