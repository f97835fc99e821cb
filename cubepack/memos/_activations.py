"""Installing activations into a MemOS activation memory, without MemOS's ``pickle.load``.

- A packed cube: each KV file is checked against the model the memory runs (its producer's
  strict fields) and loaded zero-copy; a mismatch is handled by the policy (error, drop,
  rebuild).
- An unpacked folder: its activation pickle is read through cubepack's allowlist reader; each
  cache's shapes are checked against the live model; one warning says the cube is unverified.

MemOS is imported only inside these functions (it has import-time side effects).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util import constants
from .._util.paths import regular_file
from ..errors import CubepackError, FormatError, IdentityMismatch, Mismatch, UnsafeInputError
from ..errors import UnsupportedError
from ..format._lock import KV_HEADER, check_provenance
from ..format._provenance import ASSERTED, RECORDED
from ..format.sections import Lock
from ..format.sections import shards as shardformat
from ..identity._fingerprint import fingerprint
from ..kinds import LoadJob
from ..kinds._seam import (
    UNKNOWN,
    Checking,
    LoadedCache,
    LoadedPrompt,
    note_unchecked,
    prompt_file_items,
    served_model,
)
from ..kv._format import check_kv_file, read_kv_header, structure_problems
from ..kv._torch import live_layers, mapped_layers
from ..memos_format import _layout as memos_layout
from ..memos_format._pickle import read_memos_pickle
from ..memos_format._records import record_conflicts
from ..ops._seam import load_verified
from ..trust._evidence import Signed
from ..trust._policy import TrustPolicy
from ._use import register

logger = logging.getLogger("cubepack.memos")


@dataclass
class HookReport:
    """What the hook did for one cube; attached to the cube (or memory) as ``.cubepack``."""

    cube_dir: Path
    commit_sha: str | None = None
    verified: bool = False
    loaded: list[str] = field(default_factory=list)
    dropped: dict[str, list[str]] = field(default_factory=dict)
    rebuilt: dict[str, list[str]] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)  # role -> folder MemOS loaded
    #: a private cube's recipients (from its decrypted manifest): a dump of it is encrypted to
    #: them again
    private_recipients: list[str] | None = None
    #: whether that private cube hid its ciphertext names (item ids): its dump hides them too
    private_hidden_names: bool = False
    #: item -> what the loaded model's recomputation covered (full, positions, total, seed,
    #: exact); a rebuilt item's is its own prefill (``rebuilt``: every position, bit for bit)
    recomputed: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: item -> what backs its producer label (kind, basis: proved / signed / claimed)
    provenance: dict[str, dict[str, Any]] = field(default_factory=dict)
    signed_by: str | None = None  # the trusted key whose signature covers the cube's files
    #: what a trusted signer's attestation states it proved (the only signed evidence)
    signed: Signed | None = None
    embedder_verified: bool = False  # the loaded embedder reproduced the text memory's vectors
    #: adapter -> what the hook checked it against (or why it could not)
    adapters: dict[str, str] = field(default_factory=dict)
    #: items whose KV file is format 2: no per-tensor checksums, so their bytes were not
    #: checked at this load (a cube's were by its lock's sha256; a lockless folder's were not)
    unchecksummed: list[str] = field(default_factory=list)


def install(act_mem: Any, items: list[LoadedCache]) -> None:
    """Place checked caches (the activations kind's, :mod:`cubepack.kinds.activations._memos`)
    into MemOS's memory, replacing what it held (as MemOS's load does): each cache's producer,
    label and seals go in the hook's registry, so they travel with it to every use and dump."""
    placed = [item(loaded) for loaded in items]
    act_mem.kv_cache_memories = {}  # MemOS's load replaces what the memory held
    if placed:
        act_mem.add(placed)


def item(loaded: LoadedCache) -> Any:
    """MemOS's ``KVCacheItem`` of a checked cache, its producer, label and seals registered."""
    from memos.memories.activation.item import KVCacheItem, KVCacheRecords

    register(loaded.cache, loaded.item_id, loaded.producer, loaded.metadata,
             loaded.token_ids, loaded.provenance, loaded.seals)
    fields = {"records": KVCacheRecords.model_validate(loaded.records)} \
        if loaded.records else {}
    return KVCacheItem(id=loaded.item_id, memory=loaded.cache, metadata=loaded.metadata,
                       **fields)


def load_activations(act_mem: Any, cube_dir: Path, lock: Lock, report: HookReport,
                     policy: TrustPolicy, seals: frozenset[Any] = frozenset()) -> None:
    """Install a verified cube's activation memory into ``act_mem`` (a hooked
    ``KVCacheMemory.load``): the kinds check it (``cubepack.ops._seam.load_verified``), the
    hook places what they hand back."""
    install_loaded(act_mem, load_verified(LoadJob(cube_dir, lock, policy, {"act_mem": act_mem},
                                                  report, seals=seals)), cube_dir, lock, report)


def install_loaded(act_mem: Any, loaded: tuple[Any, ...], cube_dir: Path, lock: Lock,
                   report: HookReport) -> None:
    """Place what the kinds handed back for ``act_mem``: its caches or, into a memory whose
    LLM is a vLLM server, the cube's prompts."""
    if hasattr(act_mem.llm, "model"):
        install(act_mem, [item for item in loaded if isinstance(item, LoadedCache)])
    else:
        _install_prompts(act_mem, [_prompt_item(item.item_id, item.prompt, item.metadata,
                                                item.records)
                                   for item in loaded if isinstance(item, LoadedPrompt)], report)



def load_unpacked(act_mem: Any, cube_dir: Path, report: HookReport, policy: TrustPolicy) -> None:
    """Load a folder without a lock, as MemOS would but safely: its activation pickle through
    the allowlist reader (MemOS's current, list and bare-list layouts), or the files a hooked
    dump wrote (KV files, or a vLLM memory's prompts). Each cache is checked against the live
    model: its shape, the producer record a pickle carries (MemOS #2302's ``model_identity``,
    #2305's per-item ``metadata.producer``), or a KV file's full producer identity; a mismatch
    goes to the policy, and ``recompute`` proves each cache with the live model. Only regular
    files inside the folder are read. Unverified (nothing proves the folder's bytes): one
    warning says so and how to pack it."""
    folder = cube_dir / shardformat.SHARD_DIR
    shards = sorted(p.name for p in folder.iterdir()
                    if p.name.endswith(shardformat.SHARD_SUFFIX)) if folder.is_dir() else []
    if shards:  # never an empty memory for a cube whose memories cannot be read
        raise FormatError(f"{cube_dir} holds shards ({shardformat.SHARD_DIR}/{shards[0]}"
                          + (f" and {len(shards) - 1} more" if shards[1:] else "")
                          + f") but no {constants.LOCK_FILENAME}: a shard's memories are read "
                          "only through its lock and index. Pull the cube again, or restore "
                          "its lock.")
    path = _lockless_file(cube_dir, act_mem.config.memory_filename)
    kv_files, prompts = _hooked_dump_files(cube_dir)
    if path is None and not kv_files and prompts is None:
        return  # as MemOS: no file, the memory keeps what it holds
    if path is not None and (kv_files or prompts is not None):
        # A hooked dump removes the pickle it replaces; both here means two dumps of
        # different times, and loading either one could hand back memories deleted since.
        raise FormatError(f"{cube_dir} holds both MemOS's pickle ({path.name}) and a hooked "
                          f"dump ({constants.ACTIVATIONS_DIR}/): which one is the memory "
                          "cannot be told. Remove the older one (or dump the memory again "
                          "with the hook installed, which replaces both) and load again.")
    vllm = not hasattr(act_mem.llm, "model")
    if kv_files and vllm:
        raise UnsupportedError(f"{cube_dir} holds KV caches, but {type(act_mem).__name__} holds "
                               "prompt strings for a vLLM server; load it into a KVCacheMemory.")
    logger.warning("cubepack: %s holds no cubepack.lock: its activations were read safely (no "
                   "code runs) but are unverified; pack it: cubepack pack %s%s", cube_dir,
                   cube_dir, " --legacy-pickle" if path is not None else "")
    if path is None:
        if prompts is not None:
            items = prompt_file_items(act_mem, cube_dir, prompts, None)
            _install_prompts(act_mem, [_prompt_item(item.item_id, item.prompt, item.metadata,
                                                    item.records) for item in items], report)
        else:
            _load_kv_files(act_mem, cube_dir, kv_files, report, policy)
        return
    with open(path, "rb") as handle:
        dump = read_memos_pickle(handle, name=str(path))
    if any(item.prompt is not None for item in dump.items):
        _add_prompts(act_mem, cube_dir, dump, report)
        return
    if vllm:
        raise UnsupportedError(f"{path} holds KV caches, but {type(act_mem).__name__} holds "
                               "prompt strings for a vLLM server; load it into a KVCacheMemory.")
    model = act_mem.llm.model
    live = fingerprint(model)
    name = getattr(model, "name_or_path", None)
    staged = Checking(act_mem.llm, cube_dir, report, policy)
    for item in dump.items:
        staged.claim(item.id, path.name)
        records = [(record, source) for record, source in (
            (item.producer_record, "MemOS #2305 metadata.producer"),
            (dump.model_identity, "MemOS #2302 model_identity")) if record]
        problems = [conflict for record, _ in records
                    for conflict in record_conflicts(record, live, name)]
        shape = structure_problems(live_layers(item.layers), live)
        if problems or shape:
            where = f" (its producer record, {records[0][1]}, names another model)" \
                if records and not shape else ""
            mismatch = IdentityMismatch(f"Activation {item.id!r} of {cube_dir}{where}",
                                        problems or shape)
            staged.mismatch(item.id, mismatch, item.metadata)
            continue
        if not records:  # unknown origin: never the loading model's because its shape fits
            staged.mismatch(item.id, IdentityMismatch(
                f"Activation {item.id!r} of {cube_dir}", [UNKNOWN]), item.metadata,
                unknown=True)
            continue
        label = {"kind": RECORDED, "detail": f"{records[0][1]} agrees with the loading model"}
        header = memos_layout.header_metadata(item.metadata, records=item.records)
        staged.add(item.id, item.layers, header, live, label)
        item.release()
    install(act_mem, staged.items)


def _lockless_file(cube_dir: Path, name: Any) -> Path | None:
    """The activation file config.json names, when it exists: only a regular file inside the
    folder (never through a symlink, never a FIFO that would hang the read)."""
    if not isinstance(name, str) or memos_layout.opened_path(name) is None:
        raise UnsafeInputError(f"{cube_dir}: config.json names the activation file {name!r}, "
                               "which is not a path inside the cube; refusing to read it.")
    try:
        return regular_file(cube_dir, memos_layout.opened_path(name))
    except FileNotFoundError:
        return None


def _hooked_dump_files(cube_dir: Path) -> tuple[list[Path], Path | None]:
    """(KV files, prompts file) a hooked dump wrote into ``activations/``: a real folder of
    regular files, or absent."""
    folder = cube_dir / constants.ACTIVATIONS_DIR
    try:
        mode = os.lstat(folder).st_mode
    except FileNotFoundError:
        return [], None
    if not stat.S_ISDIR(mode):
        raise UnsafeInputError(f"{folder} is a symlink or not a folder; refusing to read it.")
    kv_files, prompts = [], None
    for name in sorted(os.listdir(folder)):
        if name.endswith(constants.KV_SUFFIX):
            kv_files.append(regular_file(cube_dir, f"{constants.ACTIVATIONS_DIR}/{name}"))
        elif f"{constants.ACTIVATIONS_DIR}/{name}" == constants.PROMPTS_FILE:
            prompts = regular_file(cube_dir, constants.PROMPTS_FILE)
    return kv_files, prompts


def _load_kv_files(act_mem: Any, cube_dir: Path, paths: list[Path], report: HookReport,
                   policy: TrustPolicy) -> None:
    """KV files in a folder without a lock (a hooked dump): each checked against the live model
    by the full producer identity its header carries (a claim: only ``recompute`` proves it)."""
    live = fingerprint(act_mem.llm.model)
    staged = Checking(act_mem.llm, cube_dir, report, policy)
    for path in paths:
        header = read_kv_header(path)
        item_id = str(header.metadata.get("id") or path.name[: -len(constants.KV_SUFFIX)])
        staged.claim(item_id, path.name)
        try:
            info = check_kv_file(path, live)
        except IdentityMismatch as mismatch:
            staged.mismatch(item_id, mismatch, header.metadata, token_ids=header.token_ids,
                            producer=header.producer)
            continue
        claimed = info.metadata.get("provenance")
        label = claimed if check_provenance(claimed) and claimed["kind"] == ASSERTED else KV_HEADER
        note_unchecked(report, item_id, info)
        staged.add(item_id, mapped_layers(info), info.metadata, info.producer, label,
                   info.token_ids)
    install(act_mem, staged.items)


def _add_prompts(act_mem: Any, cube_dir: Path, dump: Any, report: HookReport) -> None:
    """vLLM items hold prompt strings, which are safe to hand back as they are, once the
    model a pickle's producer records name is the one MemOS's vLLM server serves."""
    served = served_model(act_mem)
    for item in dump.items:
        if item.prompt is None:
            raise CubepackError(f"{item.id!r} mixes KV caches and vLLM prompts in one dump.")
        for record in (item.producer_record, dump.model_identity):
            named = (record or {}).get("model_name_or_path")
            if isinstance(named, str) and named and named != served:
                raise IdentityMismatch(
                    f"The vLLM prompt {item.id!r} of {cube_dir}",
                    [Mismatch("record.model_name_or_path", served, named, of_producer=True)],
                    "Its producer record names another model than the one MemOS's vLLM server "
                    "serves; configure that model, or re-make the prompts for this one.")
    items = [_prompt_item(item.id, item.prompt, item.metadata, item.records)
             for item in dump.items]
    _install_prompts(act_mem, items, report)


def _prompt_item(item_id: Any, prompt: str, metadata: Any, records: Any) -> Any:
    from memos.memories.activation.item import KVCacheRecords, VLLMKVCacheItem

    fields = {"records": KVCacheRecords.model_validate(records)} \
        if isinstance(records, dict) else {}
    return VLLMKVCacheItem(id=str(item_id), memory=prompt,
                           metadata=metadata if isinstance(metadata, dict) else {}, **fields)


def _install_prompts(act_mem: Any, items: list[Any], report: HookReport) -> None:
    act_mem.kv_cache_memories = {}  # MemOS's load replaces what the memory held
    if items:
        act_mem.add(items)
    report.loaded.extend(item.id for item in items)
