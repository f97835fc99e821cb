"""Installing activations into a MemOS activation memory, without MemOS's ``pickle.load``.

- A packed cube: each KV file is checked against the model the memory runs (its producer's
  strict fields) and loaded zero-copy; a mismatch is handled by the policy (error, drop,
  rebuild).
- An unpacked folder: its activation pickle is read through cubepack's allowlist reader; each
  cache's shapes are checked against the live model; one warning says the cube is unverified.

MemOS is imported only inside these functions (it has import-time side effects).
"""

from __future__ import annotations

import copy
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util import canonical, constants
from .._util.paths import regular_file, resolve_inside
from ..errors import (
    CubepackError,
    FormatError,
    IdentityMismatch,
    Mismatch,
    RecomputationFailed,
    UnsafeInputError,
    UnsupportedError,
)
from ..format._lock import KV_HEADER, activation_id_key, check_provenance, duplicate_id
from ..format._provenance import ASSERTED, RECOMPUTED, RECORDED
from ..format.sections import Lock
from ..identity._fingerprint import fingerprint
from ..identity._identity import ModelIdentity, dtype_name
from ..kv._format import (
    KVFileInfo,
    check_kv_file,
    read_kv_header,
    structure_problems,
    unchecked_note,
)
from ..kv._recompute import describe, recompute_layers
from ..kv._torch import cache_from_layers, live_layers, mapped_layers
from ..kinds.activations._reprefill import provenance as reprefill_provenance
from ..kinds.activations._reprefill import reprefill
from ..format.sections import shards as shardformat
from ..kinds.activations._shards import memory_bytes
from ..kinds.activations._verify import NO_TOKEN_IDS
from ..memos_format import _layout as memos_layout
from ..memos_format._pickle import read_memos_pickle
from ..memos_format._records import record_conflicts
from ..trust._evidence import Signed, provenance_evidence, satisfies
from ..trust._policy import TrustPolicy
from ._use import (
    UNKNOWN,
    UNKNOWN_FINDING,
    USE_ADVICE,
    USE_FINDING,
    add_seals,
    produced,
    register,
    use_problems,
)

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


def require_provenance(lock: Lock, report: HookReport, required: str | None) -> None:
    """Record what backs each activation's producer label (a recomputation by the loaded model
    is proved; the lock's label is claimed, or signed under a trusted key) and refuse those that
    do not meet ``required`` (the one rule of :func:`cubepack.trust._evidence.satisfies`)."""
    for item_id, entry in sorted(lock.activations.items()):
        backing = provenance_evidence(entry.provenance,
                                      recomputed=report.recomputed.get(item_id),
                                      signed=report.signed, item=item_id)
        report.provenance[item_id] = backing
        if required and not satisfies(backing, required):
            raise RecomputationFailed(
                f"Activation {item_id!r} is {backing['kind']} ({backing['basis']}: "
                f"{backing['detail']}), but {required} is required, proved or signed; pass "
                "recompute=True to prove it with the loaded model (every position), or load a "
                "cube whose trusted signer established it (trusted_keys=...).")


def llm_in_dtype(act_mem: Any, dtype: str | None) -> Any:
    """The memory's LLM, running in ``dtype``, without changing a model anyone else holds.

    MemOS's ``LLMFactory`` shares one LLM instance per config between cubes and memories, so
    the memory gets a private copy of the LLM and its model in the pinned dtype; the shared
    one is never cast in place.
    """
    llm = act_mem.llm
    if dtype is None or dtype_name(llm.model.dtype) == dtype:
        return llm
    import torch

    private = copy.copy(llm)
    private.model = copy.deepcopy(llm.model).to(getattr(torch, dtype))
    act_mem.llm = private
    return private


class _Staged:
    """The items a load will install: MemOS's memory is replaced only once every item passed
    (a refusal leaves the memory as it was)."""

    def __init__(self, act_mem: Any, cube_dir: Path, report: HookReport, policy: TrustPolicy,
                 seals: frozenset[Any] = frozenset()):
        self.act_mem, self.cube_dir, self.report, self.policy = act_mem, cube_dir, report, policy
        #: the private cube's seal: each cache carries it (privacy travels as the producer)
        self.seals = seals
        self.items: list[Any] = []
        self.ids: dict[str, str] = {}  # activation_id_key -> the id that has it

    def claim(self, item_id: str, where: str) -> None:
        key = activation_id_key(item_id)
        if key in self.ids:
            raise FormatError(f"Two activations of {self.cube_dir} "
                              f"{duplicate_id(self.ids[key], item_id)} ({where}); MemOS would "
                              "keep only one, or two alike.")
        self.ids[key] = item_id

    def add(self, item_id: str, layers: list[tuple], header: dict[str, Any],
            producer: ModelIdentity, provenance: dict[str, Any], token_ids: Any = None) -> None:
        """Check ``layers`` for use by the live model (and recompute them when asked), then
        stage them as a registered KVCacheItem."""
        from memos.memories.activation.item import KVCacheItem, KVCacheRecords

        model = self.act_mem.llm.model
        problems = use_problems(layers, model)
        if problems:
            raise IdentityMismatch(f"Activation {item_id!r} of {self.cube_dir}", problems,
                                   USE_ADVICE + "; or do not load this cube.",
                                   finding=USE_FINDING)
        if self.policy.recomputation().asked:  # then MemOS gets the prefill the model ran
            provenance, layers = self._prove(item_id, layers, token_ids, header)
        cache = cache_from_layers(layers, model.config, device=model.device, source=item_id)
        metadata = memos_layout.item_metadata(header)
        register(cache, item_id, producer, metadata, token_ids, provenance, self.seals)
        records = header.get("records") if isinstance(header.get("records"), dict) else None
        fields = {"records": KVCacheRecords.model_validate(records)} if records else {}
        self.items.append(KVCacheItem(id=item_id, memory=cache, metadata=metadata, **fields))
        self.report.loaded.append(item_id)

    def _prove(self, item_id: str, layers: list[tuple], token_ids: Any,
               header: dict[str, Any]) -> tuple[dict[str, Any], list[tuple]]:
        """(provenance, the layers to use): the loading model's own prefill, once it
        reproduces the stored ones (a bound on tensors does not bind an answer; a prefill
        this process ran does: docs/explanation/proof-bound.md)."""
        ids = list(token_ids) if token_ids else self._source_ids(header, layers)
        if not ids:
            raise RecomputationFailed(f"Activation {item_id!r} of {self.cube_dir} "
                                      f"{NO_TOKEN_IDS}.")
        model = self.act_mem.llm.model
        kv_dtype = dtype_name(layers[0][2].dtype) if layers else dtype_name(model.dtype)
        plan = self.policy.recomputation()
        result = recompute_layers(model, layers, kv_dtype, ids, item_id,
                                  sample=plan.sample, seed=plan.seed)
        if not result.ok:
            raise RecomputationFailed(f"Activation {item_id!r} of {self.cube_dir} is not what "
                                      f"the loaded model computes: it {describe(result)}. Do "
                                      "not load it.")
        # exact: MemOS is handed result.layers, the prefill itself, whatever the stored bytes.
        self.report.recomputed[item_id] = {"full": result.full, "positions": result.positions,
                                           "total": result.total, "seed": result.seed,
                                           "exact": result.full}
        label = RECOMPUTED if result.full else RECORDED
        return ({"kind": label, "detail": f"recomputed by the loading model: {describe(result)}"},
                result.layers)

    def _source_ids(self, header: dict[str, Any], layers: list[tuple]) -> list[int] | None:
        """MemOS's prompt for the item's source_text, when its length is the cache's."""
        source = memos_layout.item_metadata(header).get("source_text")
        tokenizer = getattr(self.act_mem.llm, "tokenizer", None)
        if source is None or tokenizer is None or not layers:
            return None
        try:
            ids = memos_layout.memos_prompt_ids(tokenizer, source)
        except CubepackError:
            return None
        return ids if len(ids) == int(layers[0][1]) else None

    def mismatch(self, item_id: str, mismatch: IdentityMismatch, header: dict[str, Any], *,
                 token_ids: list[int] | None = None,
                 producer: ModelIdentity | None = None, unknown: bool = False) -> None:
        apply_policy(self, item_id, mismatch, memos_layout.item_metadata(header),
                     token_ids=token_ids, producer=producer, unknown=unknown)

    def install(self) -> None:
        for item in self.items:  # a rebuilt item was made from the cube's source text
            add_seals(item.memory, self.seals)
        self.act_mem.kv_cache_memories = {}  # MemOS's load replaces what the memory held
        if self.items:
            self.act_mem.add(self.items)


def load_activations(act_mem: Any, cube_dir: Path, lock: Lock, report: HookReport,
                     policy: TrustPolicy, seals: frozenset[Any] = frozenset()) -> None:
    """Install a verified cube's activation memory into ``act_mem``: KV caches into a memory
    whose LLM runs here, a vLLM cube's prompts into one whose LLM is a server; either into the
    other kind is refused (it would leave the memory silently empty)."""
    local = hasattr(act_mem.llm, "model")
    prompts = constants.PROMPTS_FILE in lock.files
    if local and prompts and not lock.activations:
        raise UnsupportedError(f"{cube_dir} holds vLLM prompts ({constants.PROMPTS_FILE}), but "
                               f"{type(act_mem).__name__}'s LLM runs here and takes KV caches; "
                               "load it into a VLLMKVCacheMemory (act_mem backend "
                               "vllm_kv_cache).")
    if not local and lock.activations:
        raise UnsupportedError(f"{cube_dir} holds KV caches, but {type(act_mem).__name__} "
                               "holds prompt strings for a vLLM server; load it into a "
                               "KVCacheMemory.")
    if local:
        load_packed(act_mem, cube_dir, lock, report, policy, seals)
    else:
        load_prompts(act_mem, cube_dir, lock, report)


def load_packed(act_mem: Any, cube_dir: Path, lock: Lock, report: HookReport,
                policy: TrustPolicy, seals: frozenset[Any] = frozenset()) -> None:
    """Install a verified cube's activations, each checked against the live model (and, with
    ``recompute``, reproduced by it: see :mod:`cubepack.kv._recompute`)."""
    pin = lock.models.get(memos_layout.ACT_ROLE)
    pinned = pin.identity if pin is not None else None
    if not lock.activations:
        return
    llm = llm_in_dtype(act_mem, pinned.dtype if pinned else None)
    live = fingerprint(llm.model)
    staged = _Staged(act_mem, cube_dir, report, policy, seals)
    for item_id, entry in sorted(lock.activations.items()):
        # A shard's range: checked against its index (sha256, checksums) before it is read.
        data = memory_bytes(cube_dir, entry)
        path = resolve_inside(cube_dir, entry.file) if data is None else \
            f"{entry.file}#{item_id}"
        stage_packed(staged, item_id, entry, path, data, live)
    # Here, not only in init_from_dir: MemOS's own load (KVCacheMemory.load, which
    # GeneralMemCube.load, MOSCore.load and the scheduler call) reaches this alone; and before
    # install, so a refusal leaves the memory as it was.
    require_provenance(lock, report, policy.required_provenance())
    staged.install()


def stage_packed(staged: _Staged, item_id: str, entry: Any, path: Any, data: Any,
                 live: ModelIdentity) -> None:
    """Stage one packed memory whose bytes are checked (``data``, or the file ``path``): its
    producer against ``live`` (a mismatch handled by the policy), then :meth:`_Staged.add`.
    Shared by a whole load and a load on first use (:mod:`._ondemand`)."""
    try:
        info = check_kv_file(path, live, data=data)
    except IdentityMismatch as mismatch:
        stored = read_kv_header(path, data=data)
        staged.mismatch(item_id, mismatch, stored.metadata, token_ids=stored.token_ids,
                        producer=stored.producer)
        return
    if staged.policy.recomputation().asked and not info.token_ids:
        raise RecomputationFailed(f"Activation {item_id!r} {NO_TOKEN_IDS}.")
    _note_unchecked(staged.report, item_id, info)
    staged.add(item_id, mapped_layers(info), info.metadata, info.producer,
               entry.provenance.to_dict() if entry.provenance is not None else None,
               info.token_ids)


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
            _load_prompt_file(act_mem, cube_dir, prompts, None, report)
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
    staged = _Staged(act_mem, cube_dir, report, policy)
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
    staged.install()


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
    staged = _Staged(act_mem, cube_dir, report, policy)
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
        _note_unchecked(report, item_id, info)
        staged.add(item_id, mapped_layers(info), info.metadata, info.producer, label,
                   info.token_ids)
    staged.install()


def _note_unchecked(report: HookReport, item_id: str, info: KVFileInfo) -> None:
    """Record (and warn once per item) that a format-2 KV file's bytes go unchecked here;
    a format-3 file's are checked by :func:`~cubepack.kv._torch.mapped_layers`."""
    note = unchecked_note(info)
    if note:
        report.unchecksummed.append(item_id)
        logger.warning("cubepack: activation %r: %s", item_id, note)


def apply_policy(staged: _Staged, item_id: str, mismatch: IdentityMismatch,
                 metadata: dict[str, Any], *, token_ids: list[int] | None = None,
                 producer: ModelIdentity | None = None, unknown: bool = False) -> None:
    """``unknown``: nothing records the item's producer (a pickle another process wrote
    without cubepack): it is never taken as the loading model's, whatever its shape."""
    on_mismatch = staged.policy.mismatch_action()
    if on_mismatch == "error":
        raise IdentityMismatch(
            f"Activation {item_id!r} of {staged.cube_dir}", mismatch.mismatches,
            ("Nothing records which model produced it (a MemOS pickle written without "
             "cubepack), so it is not taken as the loading model's. Pack the folder with the "
             "model that made it (cubepack pack --legacy-pickle, your assertion), or pass "
             "on_mismatch='rebuild' (re-extract it from its source text) or 'drop'"
             if unknown else
             "The model MemOS loaded is not the one that produced it; load the cube with its "
             "pinned model, or pass on_mismatch='drop' or 'rebuild'" if mismatch.of_producer
             else "Its layers are not a cache as a model makes one (they disagree with each "
             "other or with their lengths); re-extract it from its source text, or pass "
             "on_mismatch='rebuild' or 'drop'") +
            " (to cubepack.memos.init_from_remote_repo / init_from_dir / install, or set "
            "CUBEPACK_MEMOS_ON_MISMATCH).",
            **({"finding": UNKNOWN_FINDING} if unknown else {})) from None
    if on_mismatch == "drop":
        logger.warning("cubepack: dropped activation %s of %s: %s (%s)", item_id,
                       staged.cube_dir, "its producer is unknown" if unknown
                       else "produced by another model" if mismatch.of_producer
                       else "not a cache as a model makes one", ", ".join(mismatch.fields))
        staged.report.dropped[item_id] = mismatch.fields
        return
    item = rebuild(staged.act_mem, item_id, metadata, token_ids=token_ids, producer=producer)
    staged.items.append(item)
    staged.report.rebuilt[item_id] = mismatch.fields
    # What MemOS now holds is the loading model's own prefill, run by this process: proved,
    # every position, bit for bit, whatever the replaced item's lock label said (judging it
    # by that label refused every rebuilt item, with a fix the call had already taken).
    record = produced(item.memory)
    tokens = len(record.token_ids) if record is not None and record.token_ids else None
    staged.report.recomputed[item_id] = {"full": True, "positions": tokens, "total": tokens,
                                         "seed": None, "exact": True, "rebuilt": True}


def rebuild(act_mem: Any, item_id: str, metadata: dict[str, Any], *,
            token_ids: list[int] | None = None, producer: ModelIdentity | None = None) -> Any:
    """Rebuild an item with the live model by the re-prefill ``cubepack migrate`` uses
    (:func:`cubepack.kinds.activations._reprefill.reprefill`): its stored token ids when the
    live tokenizer is its producer's, else its ``source_text`` (a string, a list of strings or
    chat messages) through the chat template, as MemOS's ``extract`` builds it.

    Raises:
        RecomputationFailed: neither usable ids nor a source_text to re-tokenise.
    """
    from memos.memories.activation.item import KVCacheItem

    llm = act_mem.llm
    live = fingerprint(llm.model)
    done = reprefill(llm.model, item_id, token_ids=token_ids, metadata=metadata,
                     producer=producer, identity=live, tokenizer=lambda: llm.tokenizer)
    label = reprefill_provenance(done, live, "the MemOS hook's rebuild policy")
    kept = {**metadata, "rebuilt_by_cubepack": True}
    register(done.cache, item_id, live, kept, done.token_ids, label)
    logger.warning("cubepack: rebuilt activation %s with the loaded model%s", item_id,
                   f" (re-tokenised from its source_text: {done.retokenized})"
                   if done.retokenized else "")
    return KVCacheItem(id=item_id, memory=done.cache, metadata=kept)


def _served_model(act_mem: Any) -> Any:
    return getattr(getattr(act_mem.llm, "config", None), "model_name_or_path", None)


def _add_prompts(act_mem: Any, cube_dir: Path, dump: Any, report: HookReport) -> None:
    """vLLM items hold prompt strings, which are safe to hand back as they are, once the
    model a pickle's producer records name is the one MemOS's vLLM server serves."""
    served = _served_model(act_mem)
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


def load_prompts(act_mem: Any, cube_dir: Path, lock: Lock, report: HookReport) -> None:
    """Install a verified vLLM cube's prompts into a ``VLLMKVCacheMemory``, once the vLLM model
    MemOS will send them to is the pinned one (by Hub id or name: the weights sit on the vLLM
    server, where cubepack cannot fingerprint them)."""
    if constants.PROMPTS_FILE not in lock.files:
        return
    pin = lock.models.get(memos_layout.ACT_ROLE)
    pinned = set() if pin is None else {
        name for name in (pin.repo_id, pin.name, pin.identity.model_id if pin.identity else None)
        if name}
    _load_prompt_file(act_mem, cube_dir, resolve_inside(cube_dir, constants.PROMPTS_FILE),
                      pinned, report)


def _load_prompt_file(act_mem: Any, cube_dir: Path, path: Path, pinned: set[str] | None,
                      report: HookReport) -> None:
    """A prompts file's items, once the served model is the pinned one (a packed cube) or the
    one the file names (a folder without a lock: the file's word is all there is)."""
    served = _served_model(act_mem)
    document = canonical.loads_strict(path.read_bytes())
    if not isinstance(document, dict) or document.get("format") != constants.PROMPTS_FORMAT \
            or not isinstance(document.get("items"), list):
        raise FormatError(f"{path} is not a cubepack prompts file.")
    expected = pinned if pinned is not None else (
        {document["model"]} if isinstance(document.get("model"), str) else None)
    if expected is not None and served not in expected:
        raise IdentityMismatch(
            f"The vLLM prompts of {cube_dir}",
            [Mismatch("model", sorted(expected), served, of_producer=True)],
            "The vLLM server MemOS is configured for serves another model than the one these "
            "prompts were made for; configure that model.")
    items, seen = [], set()
    for entry in document["items"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("prompt"), str) \
                or not isinstance(entry.get("id"), str) or entry["id"] in seen:
            raise FormatError(f"{path}: a prompt entry is malformed or repeats an id.")
        seen.add(entry["id"])
        items.append(_prompt_item(entry["id"], entry["prompt"], entry.get("metadata") or {},
                                  entry.get("records")))
    _install_prompts(act_mem, items, report)
