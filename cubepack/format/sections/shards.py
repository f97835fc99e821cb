"""The ``shards`` section (lock version 6, issue #40): activation memories stored many to a
file, each shard with an index of its own, fetched on its own.

A **shard** (``shards/activations-NNNNN.kvshard``) is KV files laid end to end, each starting
at a multiple of :data:`ALIGN` bytes (zero padding between them, none after the last): each
memory's bytes are one whole KV file, so its tensors are contiguous and its range alone builds
its cache. Its **index** (``shards/activations-NNNNN.index.json``, canonical JSON) names the
shard (path, sha256, size) and, for each memory, its range (offset, length), the range's
sha256, its lock facts (producer role, token count, KV dtype, layers, provenance) and the
KV header's checksum record (per-tensor XXH3-64), which the header's own must equal at load.

The lock's ``shards`` section maps each shard's path to its index's path, the first and last
item id it holds and its memory count; the lock's ``files`` hold both files' sha256 and size,
so the lock commits to every shard and every index by digest and grows with the shards, not the
memories. Shards hold item ids in order, and in lock version 6 their ``[first, last]`` ranges
are disjoint, so a reader finds an item's shard from the lock alone. From lock version 7 (an
incremental pack: ``kinds/activations/_incremental.py``) ranges may overlap and each entry
states its shard's dead bytes, which a version-2 index lists as ranges (bytes of memories
removed since the shard was written); a reader of one memory reads the index of each shard
whose range holds its id (:func:`shards_of`).

An index is refused (:class:`FormatError`) when it is not its lock entry's bytes (sha256,
size), names another shard or other digests, points outside its shard, overlaps two memories,
leaves anything but the alignment padding between them, lists a memory twice (or in two
shards, or beside the lock's own activations), holds an id outside its lock range, or a count
its lock entry does not state. A load of one memory reads its shard's index for that memory
(:class:`MemoryReader`: which of these checks decide its load, and why the others are left to
verify and pull).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from ..._util import canonical, constants
from ..._util.paths import check_relpath, resolve_inside
from ...errors import FormatError, UsageError
from .._provenance import KINDS
from .activations import PROVENANCE_KEYS, Activation, Provenance, activation_id_key, duplicate_id
from .activations import parse as parse_activations
from .files import FileEntry
from .locator import Index, Locator, register_index

#: The folder of the shards and their indexes, and their names' pattern.
SHARD_DIR = "shards"
SHARD_SUFFIX = ".kvshard"
INDEX_SUFFIX = ".index.json"
SHARD_NAME = re.compile(rf"{SHARD_DIR}/activations-(\d{{5,}})\{SHARD_SUFFIX}")
#: Each memory of a shard starts at a multiple of this (its tensors keep their alignment when
#: the shard is mapped whole); the gap before it is zeros.
ALIGN = 64
#: The index's format name and version (``version`` 1: this module).
INDEX_FORMAT = "cubepack.kvshard.index"
INDEX_VERSION = 1
#: Version 2 (an index rewritten by an incremental pack, :mod:`...kinds.activations._shards`)
#: adds ``dead``: the byte ranges of memories removed or replaced since the shard was written
#: (their bytes stay in the shard, so the shard's file is unchanged and is not uploaded again).
INDEX_DEAD_VERSION = 2
INDEX_VERSIONS = (INDEX_VERSION, INDEX_DEAD_VERSION)
INDEX_KEYS = frozenset({"format", "version", "shard", "memories"})
INDEX_DEAD_KEYS = INDEX_KEYS | {"dead"}
#: The index's record of its shard: the shard as the lock's files section records a file.
INDEX_SHARD_KEYS = frozenset(FileEntry.__dataclass_fields__)
MEMORY_KEYS = frozenset({"offset", "length", "sha256", "model_role", "token_count", "kv_dtype",
                         "num_layers", "provenance", "checksums"})
#: A lock ``shards`` entry's keys.
ENTRY_KEYS = frozenset({"index", "first", "last", "memories"})
#: From lock version 7 (:data:`APPENDED_LOCK_VERSION`) an entry also states its shard's dead
#: bytes (``dead``: what ``cubepack compact`` reclaims, decided from the lock alone), and the
#: entries' id ranges may overlap (memories appended by an incremental pack).
APPENDED_ENTRY_KEYS = ENTRY_KEYS | {"dead"}
#: The lock version of a cube whose shards were appended to (ranges that overlap, dead bytes).
APPENDED_LOCK_VERSION = constants.APPENDED_LOCK_VERSION
#: The default bound of a shard (``pack --shard-size``): 2 GiB, a tenth of the Hub's
#: recommended largest file (20 GB) and far under its hard limit (50 GB); a memory larger
#: than the bound gets a shard of its own.
DEFAULT_SHARD_SIZE = 2 * 1024 ** 3
#: The most memories a shard holds: its index (about 500 bytes a small memory) stays near
#: half a MiB, so loading one memory on demand never fetches a large index, and a cube of
#: 100k small memories has 100 shards (a lock of tens of KB).
MAX_SHARD_MEMORIES = 1000
#: The largest index read (a shard of at most MAX_SHARD_MEMORIES memories needs far less: its
#: checksums grow with the layers, ~40 bytes a tensor): as the lock's own parse limit.
MAX_INDEX_BYTES = 64 * 1024 * 1024
#: The most JSON values an index may hold, counted before it is parsed: a memory's record is
#: about 25 values and two a layer (its tensors' checksums), so 1,000 memories of a model of
#: 400 layers fit; a document of tiny values (``[{},{},...]``: Python holds ~26 bytes a byte
#: of it) is refused before it is built, so an index costs at most a few times its bytes.
MAX_INDEX_VALUES = 1_000_000
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX16 = re.compile(r"[0-9a-f]{16}")
_HEX16_RUN = re.compile(r"(?:[0-9a-f]{16})+")


def shard_name(number: int) -> str:
    return f"{SHARD_DIR}/activations-{number:05d}{SHARD_SUFFIX}"


def index_name(shard: str) -> str:
    """The index path of the shard ``shard`` (beside it, its suffix replaced)."""
    return shard[:-len(SHARD_SUFFIX)] + INDEX_SUFFIX


def is_shard_path(name: str) -> bool:
    return bool(SHARD_NAME.fullmatch(name))


def aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


@dataclass(frozen=True)
class Shard:
    """One lock ``shards`` entry: the shard and its index (each by the lock's locator of the
    whole file), the first and last item id it holds and how many."""

    path: str
    index: str
    first: str
    last: str
    memories: int
    locator: Locator
    index_locator: Locator
    #: the shard's dead bytes (lock version 7; 0 before)
    dead: int = 0

    def holds(self, item_id: str) -> bool:
        return self.first <= item_id <= self.last


@dataclass(frozen=True)
class ShardIndex:
    """A shard's index, parsed and checked on its own (its shard's facts as it states them,
    its memories as the lock's activation entries, each with its shard range)."""

    shard: str
    shard_sha256: str
    shard_size: int
    memories: Mapping[str, Activation]
    #: (offset, length) of each dead range (index version 2), in order
    dead: tuple[tuple[int, int], ...] = ()

    @property
    def dead_bytes(self) -> int:
        return sum(length for _, length in self.dead)


def _refuse(where: str, what: str) -> None:
    raise FormatError(f"{where} {what}.")


def staged(section: Mapping[str, Any], size_of: Callable[[str], int]) -> dict[str, Activation]:
    """A writer's ``activations`` section (as pack builds it, each memory a whole file) as
    frozen entries; ``size_of(path)``: a file's size."""
    files = {entry["file"]: FileEntry(entry["file"], entry["sha256"], size_of(entry["file"]))
             for entry in section.values()}
    return dict(parse_activations(dict(section), files))


def memory_record(entry: Activation, offset: int, checksums: Mapping[str, Any]) -> dict[str, Any]:
    """A memory's record in its shard's index: ``entry`` (a whole file's) laid at ``offset``,
    with its KV header's checksum record."""
    return {"offset": offset, "length": entry.locator.length, "sha256": entry.sha256,
            "model_role": entry.model_role, "token_count": entry.token_count,
            "kv_dtype": entry.kv_dtype, "num_layers": entry.num_layers,
            "provenance": entry.provenance.to_dict() if entry.provenance else None,
            "checksums": dict(checksums)}


def index_document(shard: FileEntry, memories: Mapping[str, Any],
                   dead: list[tuple[int, int]] | tuple[tuple[int, int], ...] = ()) -> str:
    """The bytes (canonical compact JSON) of the index of ``shard`` holding ``memories``
    (id -> :func:`memory_record`); with ``dead`` ranges, an index of version 2."""
    doc: dict[str, Any] = {"format": INDEX_FORMAT, "version": INDEX_VERSION,
                           "shard": dict(path=shard.path, **shard.to_dict()),
                           "memories": dict(memories)}
    if dead:
        doc.update(version=INDEX_DEAD_VERSION, dead=[[at, length] for at, length in dead])
    return canonical.dumps(doc, compact=True)


def lock_entry(shard: str, memories: list[str], dead: int | None = None) -> dict[str, Any]:
    """The lock's entry of the shard ``shard`` holding ``memories`` (ids, in order); ``dead``
    (its dead bytes) in a lock of version 7 only."""
    entry: dict[str, Any] = {"index": index_name(shard), "first": memories[0],
                             "last": memories[-1], "memories": len(memories)}
    if dead is not None:
        entry["dead"] = dead
    return entry


def lock_version(value: Any) -> int:
    """The lock version a ``shards`` value needs: 7 once its entries state dead bytes (an
    appended layout), else 6."""
    appended = isinstance(value, dict) and any(
        isinstance(entry, dict) and "dead" in entry for entry in value.values())
    return APPENDED_LOCK_VERSION if appended else APPENDED_LOCK_VERSION - 1


def check_section(value: Any, files: dict[str, Any], version: int = 6) -> None:
    """Validate a lock's ``shards`` value against its ``files`` (the JSON, before parsing).
    Before lock version 7 the entries' id ranges are disjoint; from 7 they may overlap (an
    incremental pack appends shards) and each states its dead bytes."""
    if not isinstance(value, dict) or not value:
        raise FormatError("cubepack.lock 'shards' must be a non-empty object.")
    appended = version >= APPENDED_LOCK_VERSION
    keys = APPENDED_ENTRY_KEYS if appended else ENTRY_KEYS
    previous: tuple[str, str] | None = None
    for path in sorted(value, key=lambda p: (value[p] or {}).get("first", "")
                       if isinstance(value[p], dict) else ""):
        entry = value[path]
        where = f"cubepack.lock shard {path!r}"
        check_relpath(path)
        if not is_shard_path(path):
            _refuse(where, f"is not named {SHARD_DIR}/activations-NNNNN{SHARD_SUFFIX}")
        if not isinstance(entry, dict) or set(entry) != keys:
            _refuse(where, f"must hold exactly the keys {sorted(keys)}")
        if appended and (type(entry["dead"]) is not int or entry["dead"] < 0):
            _refuse(where, "dead must be a number of bytes (an integer >= 0)")
        if entry["index"] != index_name(path):
            _refuse(where, f"must name its index {index_name(path)!r}, found {entry['index']!r}")
        for name in (path, entry["index"]):
            if name not in files:
                _refuse(where, f"names {name!r}, which the lock's file list does not hold")
        if not (isinstance(entry["first"], str) and isinstance(entry["last"], str)
                and entry["first"] and entry["first"] <= entry["last"]):
            _refuse(where, "first and last must be item ids, first <= last")
        if type(entry["memories"]) is not int or not 1 <= entry["memories"] \
                <= MAX_SHARD_MEMORIES:
            _refuse(where, f"memories must be an integer from 1 to {MAX_SHARD_MEMORIES}")
        if entry["first"] == entry["last"] and entry["memories"] != 1:
            _refuse(where, "holds one id (first == last) but counts more memories")
        if not appended and previous is not None and entry["first"] <= previous[1]:
            _refuse(where, f"holds ids from {entry['first']!r}, inside shard {previous[0]!r}'s "
                    f"range (to {previous[1]!r}): shards hold disjoint ranges of ids")
        previous = (path, entry["last"])


def check_listed(files: dict[str, Any], value: Any) -> None:
    """Every file named as a shard or a shard's index is one the ``shards`` section lists
    (a shard left out would hold memories no check reaches)."""
    listed = set()
    if isinstance(value, dict):
        listed = {name for path, entry in value.items()
                  for name in (path, (entry or {}).get("index") if isinstance(entry, dict)
                               else None)}
    for name in sorted(files):
        if name.startswith(SHARD_DIR + "/") and (name.endswith((SHARD_SUFFIX, INDEX_SUFFIX))) \
                and name not in listed:
            raise FormatError(f"cubepack.lock lists {name!r} as a file but not in its shards "
                              "section: a shard's memories are always checked; pack the cube "
                              "again.")


def parse(value: dict[str, Any], files: Mapping[str, FileEntry]) -> Mapping[str, Shard]:
    """The typed section of a validated ``shards`` value, in the order of their ids."""
    return MappingProxyType({
        path: Shard(path, entry["index"], entry["first"], entry["last"], entry["memories"],
                    files[path].locator, files[entry["index"]].locator, entry.get("dead", 0))
        for path, entry in sorted(value.items(), key=lambda item: item[1]["first"])})


def describe(path: str, entry: Any) -> str:
    return (f"shard {path}: {entry.get('memories')} memories, {entry.get('first')!r} to "
            f"{entry.get('last')!r}, index {entry.get('index')}")


def parse_index(data: bytes, locator: Locator) -> ShardIndex:
    """An index's bytes (already checked against ``locator``) as its frozen value; every
    check that needs only the index itself: its keys, its ranges inside its shard, in order,
    without overlap, separated only by the alignment padding, each id once."""
    where = f"shard index {locator.path}"
    values = canonical.count_values(data)
    if values > MAX_INDEX_VALUES:
        _refuse(where, f"holds {values} JSON values, above the {MAX_INDEX_VALUES} an index "
                f"of {MAX_SHARD_MEMORIES} memories may hold; it was not parsed")
    try:
        doc = canonical.loads_strict(data.decode("utf-8"),
                                     object_pairs_hook=canonical.unique_pairs)
    except canonical.DuplicateKey as exc:
        raise FormatError(f"{where} {exc}: an index lists each memory once.") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormatError(f"{where} is not valid JSON: {exc}") from exc
    shard, dead = _head(where, doc, locator)
    memories = doc["memories"]
    if not isinstance(memories, dict) or not memories:
        _refuse(where, "memories must be a non-empty object")
    entries = {item_id: _memory(f"{where} memory {item_id!r}", item_id, entry, shard)
               for item_id, entry in memories.items()}
    _check_layout(where, entries, shard["size"], dead)
    return ShardIndex(shard["path"], shard["sha256"], shard["size"],
                      MappingProxyType(dict(sorted(entries.items()))), dead)


def _head(where: str, doc: Any,
          locator: Locator) -> tuple[dict[str, Any], tuple[tuple[int, int], ...]]:
    """An index document's own record (all but its memories' records): its format, version
    and keys, its record of its shard (the one ``locator``'s index belongs to), its dead
    ranges."""
    if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT:
        _refuse(where, f"is not a {INDEX_FORMAT} document")
    if type(doc.get("version")) is not int or doc["version"] not in INDEX_VERSIONS:
        _refuse(where, f"is version {doc.get('version')!r}; this cubepack reads versions "
                f"{INDEX_VERSION} and {INDEX_DEAD_VERSION}. Upgrade cubepack")
    keys = INDEX_KEYS if doc["version"] == INDEX_VERSION else INDEX_DEAD_KEYS
    if set(doc) != keys:
        _refuse(where, f"must hold exactly the keys {sorted(keys)}")
    dead = _dead_ranges(where, doc.get("dead", []), doc["version"])
    shard = doc["shard"]
    if not (isinstance(shard, dict) and set(shard) == INDEX_SHARD_KEYS
            and isinstance(shard["path"], str) and isinstance(shard["sha256"], str)
            and _HEX64.fullmatch(shard["sha256"]) and type(shard["size"]) is int
            and shard["size"] >= 0):
        _refuse(where, "shard must be {path, sha256: 64 hex, size: int}")
    if shard["path"] != locator.path[:-len(INDEX_SUFFIX)] + SHARD_SUFFIX:
        _refuse(where, f"names the shard {shard['path']!r}; it is the index of "
                f"{locator.path[:-len(INDEX_SUFFIX)] + SHARD_SUFFIX!r}")
    return shard, dead


def _memory(what: str, item_id: str, entry: Any, shard: Mapping[str, Any]) -> Activation:
    """One memory's record of an index (``shard``: the index's record of its shard) checked on
    its own, as its entry: its keys and their types, its checksum record, its range inside the
    shard (a range past the shard's end, or empty, is refused)."""
    if not isinstance(entry, dict) or set(entry) != MEMORY_KEYS:
        _refuse(what, f"must hold exactly the keys {sorted(MEMORY_KEYS)}")
    if not (all(type(entry[key]) is int and entry[key] >= 0
                for key in ("offset", "length", "token_count", "num_layers"))
            and isinstance(entry["sha256"], str) and _HEX64.fullmatch(entry["sha256"])
            and isinstance(entry["model_role"], str) and isinstance(entry["kv_dtype"], str)
            and isinstance(entry["provenance"], dict)
            and entry["provenance"].get("kind") in KINDS
            and isinstance(entry["provenance"].get("detail", ""), str)
            and set(entry["provenance"]) <= PROVENANCE_KEYS):
        _refuse(what, "is malformed (offset, length: int; sha256: 64 hex; model_role, "
                "kv_dtype: str; token_count, num_layers: int; provenance: a label's record)")
    _check_checksums(what, entry["checksums"])
    if entry["length"] == 0 or entry["offset"] + entry["length"] > shard["size"]:
        _refuse(what, f"points outside its shard: bytes [{entry['offset']}:"
                f"{entry['offset'] + entry['length']}] of a {shard['size']}-byte shard")
    return Activation(
        item_id=item_id, file=shard["path"], model_role=entry["model_role"],
        token_count=entry["token_count"], kv_dtype=entry["kv_dtype"],
        num_layers=entry["num_layers"], sha256=entry["sha256"],
        provenance=Provenance.of(entry["provenance"]),
        locator=Locator(shard["path"], entry["offset"], entry["length"], entry["sha256"]),
        checksums=MappingProxyType(entry["checksums"]))


def _dead_ranges(where: str, value: Any, version: int) -> tuple[tuple[int, int], ...]:
    """An index's ``dead`` ranges: ``[[offset, length], ...]``, each at least a byte, in
    order (their place in the shard is checked with the memories', :func:`_check_layout`);
    version 2 states at least one (an index without any is written as version 1)."""
    if version == INDEX_VERSION:
        return ()
    if not (isinstance(value, list) and value and all(
            isinstance(pair, list) and len(pair) == 2
            and all(type(n) is int and n >= 0 for n in pair) and pair[1] > 0 for pair in value)):
        _refuse(where, "dead must be a non-empty list of [offset, length] (integers, length "
                "at least 1)")
    return tuple((at, length) for at, length in value)


def _check_checksums(what: str, record: Any) -> None:
    if not (isinstance(record, dict) and set(record) == {"algorithm", "header", "tensors"}
            and record["algorithm"] == "xxh3-64" and isinstance(record["header"], str)
            and _HEX16.fullmatch(record["header"]) and isinstance(record["tensors"], dict)
            and record["tensors"] and _all_hex16(record["tensors"].values())):
        _refuse(what, "checksums must be the KV header's record {algorithm: xxh3-64, header, "
                "tensors}")


def _all_hex16(values: Any) -> bool:
    """Every value a string of 16 lowercase hex digits: one regex over them joined (a call a
    value was most of an index's parse: ~1,000 memories of 4 tensors each)."""
    try:
        joined = "".join(values)
    except TypeError:  # a value that is no string
        return False
    return set(map(len, values)) == {16} and _HEX16_RUN.fullmatch(joined) is not None


def _check_layout(where: str, entries: dict[str, Activation], size: int,
                  dead: tuple[tuple[int, int], ...] = ()) -> None:
    """The memories and the dead ranges tile the shard in order: each at the aligned end of
    the one before (the first at 0), the last ending at the shard's end; no overlap, no hidden
    bytes. The live memories lie in their ids' order."""
    end, before = 0, None
    tiles = [(item_id, entry.locator.offset, entry.locator.end)
             for item_id, entry in entries.items()]
    tiles += [(f"dead bytes [{at}:{at + length}]", at, at + length) for at, length in dead]
    for item_id, at, stop in sorted(tiles, key=lambda tile: (tile[1], tile[2])):
        if before is not None and at < end:
            _refuse(where, f"lets memory {item_id!r} (from byte {at}) overlap memory "
                    f"{before!r} (to byte {end})")
        if at != aligned(end):
            _refuse(where, f"places memory {item_id!r} at byte {at}; the layout puts it at "
                    f"{aligned(end)} (each memory at the {ALIGN}-byte boundary after the one "
                    "before, the first at 0)")
        end, before = stop, item_id
    if end != size:
        _refuse(where, f"ends its last memory at byte {end}, but the shard is {size} bytes")
    order = sorted(entries)
    by_offset = [item for item, _ in sorted(entries.items(), key=lambda i: i[1].locator.offset)]
    if order != by_offset:
        _refuse(where, "lays its memories out of their ids' order")


INDEX = register_index(Index("shards", parse_index))


def check_index(index: ShardIndex, shard: Shard, lock_models: Mapping[str, Any], *,
                ids: list[str] | None = None) -> None:
    """An index (parsed) against its lock entry: the same shard, the shard's sha256 and size
    the lock's, its ids inside the entry's range and as many, each role a strict pin (``ids``:
    every id it lists, in order, where ``index`` holds only the memories checked: a
    :class:`MemoryReader`'s)."""
    where = f"shard index {shard.index}"
    if index.shard != shard.path:
        _refuse(where, f"names the shard {index.shard!r}, the lock {shard.path!r}")
    if (index.shard_sha256, index.shard_size) != (shard.locator.sha256, shard.locator.length):
        _refuse(where, f"disagrees with the lock on its shard: it says sha256 "
                f"{index.shard_sha256}, {index.shard_size} bytes; the lock "
                f"{shard.locator.sha256}, {shard.locator.length} bytes")
    if index.dead_bytes != shard.dead:
        _refuse(where, f"states {index.dead_bytes} dead bytes in its shard; the lock "
                f"{shard.dead}")
    ids = list(index.memories) if ids is None else ids
    if len(ids) != shard.memories:
        _refuse(where, f"lists {len(ids)} memories; the lock counts {shard.memories}")
    if ids[0] != shard.first or ids[-1] != shard.last:
        _refuse(where, f"holds ids {ids[0]!r} to {ids[-1]!r}; the lock says {shard.first!r} "
                f"to {shard.last!r}")
    for item_id, entry in index.memories.items():
        _check_role(where, item_id, entry, lock_models)


def _check_role(where: str, item_id: str, entry: Activation,
                lock_models: Mapping[str, Any]) -> None:
    pin = lock_models.get(entry.model_role)
    if pin is None or not pin.strict or pin.identity is None:
        _refuse(where, f"memory {item_id!r} names model role {entry.model_role!r}, which "
                "is not a strict pin with an identity")


def activation_count(lock: Any) -> int:
    """How many activation memories ``lock`` holds: its own activation entries and those its
    shards' entries count (the lock's word: no index is read)."""
    return len(lock.activations) + sum(shard.memories for shard in lock.shards.values())


def shards_of(shards: Mapping[str, Shard], item_id: str) -> list[Shard]:
    """The shards whose range holds ``item_id``: at most one before lock version 7 (disjoint
    ranges); after incremental packs, each shard appended with ids across that range too
    (``cubepack compact`` makes them disjoint again)."""
    return [shard for shard in shards.values() if shard.holds(item_id)]


def find_memory(lock: Any, item_id: Any,
                index_of: Callable[[Shard], ShardIndex]) -> Activation | None:
    """The entry of the memory ``item_id`` of ``lock`` (None: the cube holds none), for a
    reader of one memory: the lock's own, or its shard's index's (``index_of(shard)``, read
    only when a shard's range holds the id). When a shard's range holds it, that index is read
    even if the lock lists it too, and refused if it lists the memory again (in the lock's own
    activations, or an id equal once normalised): a memory listed twice is refused by one
    memory's load as by verify, whichever of its two entries the load would have picked.

    Raises:
        UsageError: ``item_id`` is not a string (no memory's id).
        FormatError: the memory is listed twice.
    """
    if not isinstance(item_id, str):
        raise UsageError(f"an activation memory's id is a string, not {item_id!r} "
                         f"({type(item_id).__name__}).")
    entry = lock.activations.get(item_id)
    found: dict[str, Activation] = {}
    for shard in shards_of(lock.shards, item_id):
        index = index_of(shard)
        add_memories({}, index, lock)  # the index against the lock's own, as before
        if item_id in index.memories:  # and the memory against the other shards' ranges
            add_memories(found, replace(index, memories={item_id: index.memories[item_id]}),
                         lock)
    return entry or found.get(item_id)


def load_index(shard: Shard, fetch: Callable[[Locator], bytes],
               lock_models: Mapping[str, Any]) -> ShardIndex:
    """Fetch ``shard``'s index, check its bytes against the lock's locator, parse it, check it
    against the lock entry. An index larger than :data:`MAX_INDEX_BYTES` (by the lock's own
    record of its size) is refused before any byte of it is fetched."""
    _check_index_size(shard)
    index = INDEX.load(shard.index_locator, fetch)
    check_index(index, shard, lock_models)
    return index


class MemoryReader:
    """A shard's index read for one memory at a time (issue #40: a load on demand), where
    :func:`load_index` checks every memory of it (what verify, pull and every reader of a whole
    cube do). Its bytes are the lock's (sha256 and size, checked before they are parsed), so it
    is exactly the index the lock commits to; what decides THIS memory's load is checked here:

    - the document's own record (format, version, keys, its shard's path, sha256 and size,
      its dead bytes) and its agreement with the lock's entry (the shard, its digest and size,
      its count, its first and last ids, its dead bytes), for the index as a whole;
    - the memory listed once: the index's ``memories`` object repeats no key (any id), no other
      id of the index is the same once normalised (:func:`activation_id_key`), and, by
      :func:`find_memory`, no other shard whose range holds it and none of the lock's own
      activations lists it: whichever entry a load would pick, it refuses;
    - its own record, as :func:`parse_index` checks each (keys, types, checksum record, its
      range non-empty and inside the shard), no key of it repeated, no integer outside the
      strict parse's bounds, and its role a strict pin with an identity.

    Left to a whole read (``verify``, ``pull``), as they cannot change what this load builds:
    the other memories' records, and the layout (overlaps between memories, the padding
    between them, their order). The memory's bytes are its range alone, checked against its
    own sha256 and checksums before any tensor is built, so another memory's bytes overlapping
    them, or bytes hidden in the padding, change nothing this load reads. A document the
    strict parse would refuse elsewhere (a number out of bounds, a repeated key in another
    memory's record, nesting deeper than its bound in another record) is refused by verify.
    """

    def __init__(self, data: bytes, shard: Shard, lock_models: Mapping[str, Any]) -> None:
        where = self.where = f"shard index {shard.index}"
        self.data, self.models, self.of = data, lock_models, shard
        # The raw count of ``,``, ``[`` and ``{`` is at least the values (those in strings
        # too): the exact count (strings skipped) only when it passes the bound.
        raw = data.count(b",") + data.count(b"[") + data.count(b"{") + 1
        if raw > MAX_INDEX_VALUES and canonical.count_values(data) > MAX_INDEX_VALUES:
            _refuse(where, f"holds more than the {MAX_INDEX_VALUES} JSON values an index of "
                    f"{MAX_SHARD_MEMORIES} memories may hold; it was not parsed")
        try:
            doc = canonical.loads_pairs(data)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise FormatError(f"{where} is not valid JSON: {exc}") from exc
        if not isinstance(doc, tuple):
            _refuse(where, f"is not a {INDEX_FORMAT} document")
        top = dict(doc)
        memories = top.pop("memories", None)
        top = {key: _plain(where, value) for key, value in top.items()}
        if memories is not None:
            top["memories"] = {}
        if len(top) != len(doc):
            _refuse(where, "repeats a key: an index lists each memory once")
        self.shard, self.dead = _head(where, top, shard.index_locator)
        if not isinstance(memories, tuple) or not memories:
            _refuse(where, "memories must be a non-empty object")
        self.records = dict(memories)
        if len(self.records) != len(memories):
            _refuse(where, "lists a memory twice: an index lists each memory once")
        check_index(ShardIndex(self.shard["path"], self.shard["sha256"], self.shard["size"],
                               MappingProxyType({}), self.dead), shard, lock_models,
                    ids=sorted(self.records))
        self._keys: dict[str, int] | None = None

    def whole(self) -> ShardIndex:
        """The index with every check :func:`load_index` makes, from the bytes read (no
        fetch): for a reader that then needs every memory of the shard."""
        index = parse_index(self.data, self.of.index_locator)
        check_index(index, self.of, self.models)
        return index

    def memory(self, item_id: str) -> ShardIndex:
        """The index holding only the memory ``item_id`` (none, if it does not list it)."""
        record = self.records.get(item_id)
        if record is None:
            return ShardIndex(self.shard["path"], self.shard["sha256"], self.shard["size"],
                              MappingProxyType({}))
        if self._keys is None:  # each normalised id's count, once a reader
            self._keys = {}
            # NFKC leaves ASCII as it is: ids all ASCII and each listed once are distinct keys
            if not "".join(self.records).isascii():
                for name in self.records:
                    key = activation_id_key(name)
                    self._keys[key] = self._keys.get(key, 0) + 1
        if self._keys.get(activation_id_key(item_id), 1) > 1:
            other = next(name for name in self.records if name != item_id
                         and activation_id_key(name) == activation_id_key(item_id))
            _refuse(self.where, f"memories {duplicate_id(item_id, other)}; each memory has an "
                    "id of its own: pack the cube again with one of them renamed")
        what = f"{self.where} memory {item_id!r}"
        entry = _memory(what, item_id, _plain(what, record), self.shard)
        _check_role(self.where, item_id, entry, self.models)
        self._check_alone(item_id, entry.locator)
        return ShardIndex(self.shard["path"], self.shard["sha256"], self.shard["size"],
                          MappingProxyType({item_id: entry}))

    def _check_alone(self, item_id: str, mine: Locator) -> None:
        """No other memory's range and no dead range shares a byte with this memory's (its
        bytes are one memory's, as verify's layout check proves of every memory; the others'
        records are read for their ranges only)."""
        first, end = mine.offset, mine.end
        for name, record in self.records.items():
            if type(record) is not tuple or name == item_id:
                continue  # a malformed record: verify's to refuse, it overlaps nothing here
            fields = dict(record)
            at, length = fields.get("offset"), fields.get("length")
            if type(at) is int and type(length) is int and at < end and first < at + length:
                _refuse(self.where, f"lets memory {item_id!r} (bytes [{mine.offset}:"
                        f"{mine.end}]) overlap memory {name!r} (bytes [{at}:{at + length}])")
        for at, length in self.dead:
            if at < mine.end and mine.offset < at + length:
                _refuse(self.where, f"lets memory {item_id!r} (bytes [{mine.offset}:"
                        f"{mine.end}]) overlap its dead bytes [{at}:{at + length}]")


def _plain(where: str, value: Any, depth: int = 1) -> Any:
    """A value of :func:`canonical.loads_pairs` as ``json.loads`` would build it (each object
    a dict), refused where the strict parse refuses it: nesting deeper than
    ``canonical.MAX_DEPTH``, a repeated key, an integer outside +-MAX_INT, a float that is not
    finite (``1e999``)."""
    if isinstance(value, (tuple, list)) and depth > canonical.MAX_DEPTH:
        _refuse(where, f"nests values deeper than {canonical.MAX_DEPTH} levels")
    if isinstance(value, tuple):
        result = {key: _plain(where, item, depth + 1) for key, item in value}
        if len(result) != len(value):
            _refuse(where, "repeats a key")
        return result
    if isinstance(value, list):
        return [_plain(where, item, depth + 1) for item in value]
    if type(value) is int and not -canonical.MAX_INT < value < canonical.MAX_INT:
        _refuse(where, f"holds the integer {value}, outside +-{canonical.MAX_INT}")
    if type(value) is float and not math.isfinite(value):
        _refuse(where, f"holds the number {value}, which is not finite")
    return value


def load_reader(shard: Shard, fetch: Callable[[Locator], bytes],
                lock_models: Mapping[str, Any]) -> MemoryReader:
    """Fetch ``shard``'s index for loads of one memory at a time (:class:`MemoryReader`): its
    bytes checked against the lock's locator before they are parsed, the index against the
    lock's entry after; an index above :data:`MAX_INDEX_BYTES` is refused unfetched."""
    _check_index_size(shard)
    return MemoryReader(shard.index_locator.check(fetch(shard.index_locator)), shard,
                        lock_models)


def _check_index_size(shard: Shard) -> None:
    if shard.index_locator.length > MAX_INDEX_BYTES:
        raise FormatError(f"shard index {shard.index} is {shard.index_locator.length} bytes by "
                          f"the lock, above the {MAX_INDEX_BYTES}-byte limit of an index "
                          f"({MAX_SHARD_MEMORIES} memories a shard); nothing was fetched.")


def local_fetch(cube: Any) -> Callable[[Locator], bytes]:
    """A fetch of a locator's bytes from the cube folder ``cube`` (regular files inside it
    only: the path rule's)."""
    def fetch(locator: Locator) -> bytes:
        with open(resolve_inside(cube, locator.path), "rb") as handle:
            handle.seek(locator.offset)
            return handle.read(locator.length)
    return fetch


def check_memories(index: ShardIndex, fetch: Callable[[Locator], bytes]) -> None:
    """Each memory's byte range hashes to the sha256 its index records (FormatError naming
    the memory otherwise)."""
    for item_id, entry in index.memories.items():
        try:
            entry.locator.check(fetch(entry.locator))
        except FormatError as exc:
            raise FormatError(f"memory {item_id!r}: {exc} Its index and its bytes disagree; "
                              "pull or pack the cube again.") from exc


def resolved(lock: Any, fetch: Callable[[Locator], bytes]) -> Any:
    """``lock`` with its sharded memories among its ``activations`` (each index fetched,
    checked and parsed): what every reader of a whole cube reads. A memory listed twice (in
    two indexes, or in an index and the lock) is refused. A lock without shards is returned
    as it is."""
    if not lock.shards:
        return lock
    held: dict[str, Activation] = {}
    for shard in lock.shards.values():
        add_memories(held, load_index(shard, fetch, lock.models), lock)
    return with_memories(lock, held)


def add_memories(held: dict[str, Activation], index: ShardIndex, lock: Any) -> None:
    """Add ``index``'s memories to ``held`` (the memories of the lock's other shards read so
    far); a memory listed twice (there, or in the lock's own activations) is refused."""
    names = {activation_id_key(item): item for item in (*held, *lock.activations)}
    for item_id in index.memories:
        other = held.get(item_id) or lock.activations.get(item_id)
        if other is not None:
            raise FormatError(f"shard index {index_name(index.shard)} lists memory "
                              f"{item_id!r}, which {other.file} holds too: a memory is "
                              "listed once.")
        first = names.setdefault(activation_id_key(item_id), item_id)
        if first != item_id:
            raise FormatError(f"shard index {index_name(index.shard)}: memories "
                              f"{duplicate_id(first, item_id)}; each memory has an id of its "
                              "own: pack the cube again with one of them renamed.")
    held.update(index.memories)


def with_memories(lock: Any, memories: Mapping[str, Activation]) -> Any:
    """``lock`` whose activations are its own and ``memories`` (its shards' memories)."""
    merged = {**lock.activations, **memories}
    return replace(lock, activations=MappingProxyType(dict(sorted(merged.items()))))
