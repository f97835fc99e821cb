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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util import canonical, constants
from .._util.paths import resolve_inside
from ..cube import _memos_layout as memos_layout
from ..cube._memos_pickle import read_memos_pickle
from ..cube._policy import TrustPolicy
from ..cube._provenance import evidence, record_conflicts, satisfies
from ..cube._verify import NO_TOKEN_IDS
from ..errors import (
    CubepackError,
    FormatError,
    IdentityMismatch,
    Mismatch,
    RecomputationFailed,
    UnsupportedError,
)
from ..identity._fingerprint import fingerprint
from ..identity._identity import ModelIdentity, dtype_name
from ..kv._format import check_kv_file, read_kv_header, structure_problems
from ..kv._recompute import describe
from ..kv._recompute import recompute as recompute_cache
from ..kv._torch import build_dynamic_cache, cache_from_layers, live_layers
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
    #: item -> what the loaded model's recomputation covered (full, positions, total, seed)
    recomputed: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: item -> what backs its producer label (kind, basis: proved / signed / claimed)
    provenance: dict[str, dict[str, Any]] = field(default_factory=dict)
    signed_by: str | None = None  # the trusted key whose signature covers the cube
    embedder_verified: bool = False  # the loaded embedder reproduced the text memory's vectors


def require_provenance(lock: dict[str, Any], report: HookReport, required: str | None) -> None:
    """Record what backs each activation's producer label (a recomputation by the loaded model
    is proved; the lock's label is claimed, or signed under a trusted key) and refuse those that
    do not meet ``required`` (the one rule of :func:`cubepack.cube._provenance.satisfies`)."""
    for item_id, entry in sorted(lock["activations"].items()):
        backing = evidence(entry["provenance"], recomputed=report.recomputed.get(item_id),
                           signed_by=report.signed_by)
        report.provenance[item_id] = backing
        if required and not satisfies(backing, required):
            raise RecomputationFailed(
                f"Activation {item_id!r} is {backing['kind']} ({backing['basis']}: "
                f"{backing['detail']}), but {required} is required, proved or signed; pass "
                "recompute=True to prove it with the loaded model (every position), or load a "
                "cube signed by a trusted key (trusted_keys=...).")


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


def load_packed(act_mem: Any, cube_dir: Path, lock: dict[str, Any], report: HookReport,
                policy: TrustPolicy) -> None:
    """Install a verified cube's activations, each checked against the live model (and, with
    ``recompute``, reproduced by it: see :mod:`cubepack.kv._recompute`)."""
    pinned = (lock["models"].get(memos_layout.ACT_ROLE) or {}).get("identity")
    if not lock["activations"]:
        return
    act_mem.kv_cache_memories = {}  # MemOS's load replaces what the memory held
    llm = llm_in_dtype(act_mem, pinned["dtype"] if pinned else None)
    live = fingerprint(llm.model)
    for item_id, entry in sorted(lock["activations"].items()):
        path = resolve_inside(cube_dir, entry["file"])
        try:
            info = check_kv_file(path, live)
        except IdentityMismatch as mismatch:
            apply_policy(act_mem, item_id, mismatch, read_kv_header(path).metadata, report,
                         policy.on_mismatch)
            continue
        if policy.recompute:
            if not info.token_ids:
                raise RecomputationFailed(f"Activation {item_id!r} {NO_TOKEN_IDS}.")
            result = recompute_cache(llm.model, info, item_id, sample=policy.recompute_tokens,
                                     seed=policy.seed)
            if not result.ok:
                raise RecomputationFailed(f"Activation {item_id!r} is not what the loaded model "
                                          f"computes: it {describe(result)}. Do not load it.")
            report.recomputed[item_id] = {"full": result.full, "positions": result.positions,
                                          "total": result.total, "seed": result.seed}
        cache = build_dynamic_cache(info, llm.model.config, device=llm.model.device)
        _add(act_mem, item_id, cache, dict(info.metadata), info.producer, info.token_ids)
        report.loaded.append(item_id)


def load_unpacked(act_mem: Any, cube_dir: Path, report: HookReport, on_mismatch: str) -> None:
    """Load a folder without a lock, as MemOS would but safely: its activation pickle through
    the allowlist reader (MemOS's current, list and bare-list layouts), or the KV files a hooked
    dump wrote. Each cache is checked against the live model: its shape, the producer record a
    pickle carries (MemOS #2302's ``model_identity``, #2305's per-item ``metadata.producer``),
    or a KV file's full producer identity; a mismatch goes to the policy. Unverified (nothing
    proves the folder's bytes): one warning says so and how to pack it."""
    path = cube_dir / act_mem.config.memory_filename
    kv_files = sorted((cube_dir / constants.ACTIVATIONS_DIR).glob("*" + constants.KV_SUFFIX)) \
        if (cube_dir / constants.ACTIVATIONS_DIR).is_dir() else []
    if not path.is_file() and not kv_files:
        return  # as MemOS: no file, the memory keeps what it holds
    logger.warning("cubepack: %s holds no cubepack.lock: its activations were read safely (no "
                   "code runs) but are unverified; pack it: cubepack pack %s%s", cube_dir,
                   cube_dir, " --legacy-pickle" if path.is_file() else "")
    act_mem.kv_cache_memories = {}  # MemOS's load replaces what the memory held
    if not path.is_file():
        _load_kv_files(act_mem, kv_files, report, on_mismatch)
        return
    dump = read_memos_pickle(path.read_bytes(), name=str(path))
    if any(item.prompt is not None for item in dump.items):
        _add_prompts(act_mem, dump.items, report)
        return
    if not hasattr(act_mem.llm, "model"):
        raise UnsupportedError(f"{path} holds KV caches, but {type(act_mem).__name__} holds "
                               "prompt strings for a vLLM server; load it into a KVCacheMemory.")
    model = act_mem.llm.model
    live = fingerprint(model)
    name = getattr(model, "name_or_path", None)
    for item in dump.items:
        records = [(record, source) for record, source in (
            (item.producer_record, "MemOS #2305 metadata.producer"),
            (dump.model_identity, "MemOS #2302 model_identity")) if record]
        problems = [conflict for record, _ in records
                    for conflict in record_conflicts(record, live, name)]
        problems = problems or structure_problems(live_layers(item.layers), live)
        if problems:
            where = f" (its producer record, {records[0][1]}, names another model)" \
                if records and not structure_problems(live_layers(item.layers), live) else ""
            mismatch = IdentityMismatch(f"Activation {item.id!r} of {cube_dir}{where}", problems)
            apply_policy(act_mem, item.id, mismatch, item.metadata, report, on_mismatch)
            continue
        cache = cache_from_layers(item.layers, model.config, device=model.device,
                                  source=path.name)
        _add(act_mem, item.id, cache, item.metadata, live)
        report.loaded.append(item.id)


def _load_kv_files(act_mem: Any, paths: list[Path], report: HookReport, on_mismatch: str) -> None:
    """KV files in a folder without a lock (a hooked dump): each checked against the live model
    by the full producer identity its header carries."""
    model = act_mem.llm.model
    live = fingerprint(model)
    for path in paths:
        header = read_kv_header(path)
        item_id = str(header.metadata.get("id") or path.name[: -len(constants.KV_SUFFIX)])
        try:
            info = check_kv_file(path, live)
        except IdentityMismatch as mismatch:
            apply_policy(act_mem, item_id, mismatch, header.metadata, report, on_mismatch)
            continue
        cache = build_dynamic_cache(info, model.config, device=model.device)
        _add(act_mem, item_id, cache, dict(info.metadata), info.producer, info.token_ids)
        report.loaded.append(item_id)


def apply_policy(act_mem: Any, item_id: str, mismatch: IdentityMismatch,
                 metadata: dict[str, Any], report: HookReport, on_mismatch: str) -> None:
    if on_mismatch == "error":
        raise IdentityMismatch(
            f"Activation {item_id!r}", mismatch.mismatches,
            "The model MemOS loaded is not the one that produced it; load the cube with its "
            "pinned model, or pass on_mismatch='drop' or 'rebuild' (to "
            "cubepack.memos.init_from_remote_repo / init_from_dir / install, or set "
            "CUBEPACK_MEMOS_ON_MISMATCH).") from None
    if on_mismatch == "drop":
        logger.warning("cubepack: dropped activation %s: produced by another model (%s)",
                       item_id, ", ".join(mismatch.fields))
        report.dropped[item_id] = mismatch.fields
        return
    act_mem.add([rebuild(act_mem, item_id, metadata)])
    report.rebuilt[item_id] = mismatch.fields


def rebuild(act_mem: Any, item_id: str, metadata: dict[str, Any]) -> Any:
    """Re-extract an item from its stored source with the live model, as MemOS built it:
    ``source_text`` may be a string, a list of strings or a list of chat messages."""
    source = metadata.get("source_text")
    if not _extractable(source):
        raise CubepackError(f"Activation {item_id!r} cannot be rebuilt: it records no "
                            "source_text (a string or a list of chat messages) to extract from.")
    item = act_mem.extract(source)
    item.id = item_id
    item.metadata = {**metadata, **(item.metadata or {}), "rebuilt_by_cubepack": True}
    logger.warning("cubepack: rebuilt activation %s with the loaded model", item_id)
    return item


def _extractable(source: Any) -> bool:
    if isinstance(source, str):
        return bool(source)
    return isinstance(source, list) and bool(source) and all(
        isinstance(entry, str) or (isinstance(entry, dict) and "content" in entry)
        for entry in source)


def _add(act_mem: Any, item_id: str, cache: Any, metadata: dict[str, Any],
         producer: ModelIdentity, token_ids: Any = None) -> None:
    """Install one cache, registered with its producer for the use-time check."""
    from memos.memories.activation.item import KVCacheItem

    register(cache, item_id, producer, metadata, token_ids)
    act_mem.add([KVCacheItem(id=item_id, memory=cache, metadata=metadata)])


def _add_prompts(act_mem: Any, items: list[Any], report: HookReport) -> None:
    """vLLM items hold prompt strings, which are safe to hand back as they are."""
    from memos.memories.activation.item import VLLMKVCacheItem

    for item in items:
        if item.prompt is None:
            raise CubepackError(f"{item.id!r} mixes KV caches and vLLM prompts in one dump.")
        act_mem.add([VLLMKVCacheItem(id=item.id, memory=item.prompt, metadata=item.metadata)])
        report.loaded.append(item.id)


def load_prompts(act_mem: Any, cube_dir: Path, lock: dict[str, Any], report: HookReport) -> None:
    """Install a verified vLLM cube's prompts into a ``VLLMKVCacheMemory``, once the vLLM model
    MemOS will send them to is the pinned one (by Hub id or name: the weights sit on the vLLM
    server, where cubepack cannot fingerprint them)."""
    from memos.memories.activation.item import VLLMKVCacheItem

    path = resolve_inside(cube_dir, constants.PROMPTS_FILE)
    if constants.PROMPTS_FILE not in lock["files"]:
        return
    pin = lock["models"].get(memos_layout.ACT_ROLE) or {}
    served = getattr(getattr(act_mem.llm, "config", None), "model_name_or_path", None)
    pinned = {name for name in (pin.get("repo_id"), pin.get("name"),
                                (pin.get("identity") or {}).get("model_id")) if name}
    if served not in pinned:
        raise IdentityMismatch(
            f"The vLLM prompts of {cube_dir}", [Mismatch("model", sorted(pinned), served)],
            "The vLLM server MemOS is configured for serves another model than the one these "
            "prompts were made for; configure the pinned model.")
    document = canonical.loads_strict(path.read_bytes())
    if not isinstance(document, dict) or document.get("format") != constants.PROMPTS_FORMAT \
            or not isinstance(document.get("items"), list):
        raise FormatError(f"{path} is not a cubepack prompts file.")
    act_mem.kv_cache_memories = {}  # MemOS's load replaces what the memory held
    for entry in document["items"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("prompt"), str):
            raise FormatError(f"{path}: a prompt entry is malformed.")
        act_mem.add([VLLMKVCacheItem(id=str(entry.get("id")), memory=entry["prompt"],
                                     metadata=entry.get("metadata") or {})])
        report.loaded.append(str(entry.get("id")))
