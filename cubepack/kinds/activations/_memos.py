"""The activations kind's load into a live MemOS activation memory: every check of a KV cache
for the model the memory runs, and what the policy does with one that fails it.

Each cache is checked against the live model (its producer's strict fields; its shape as MemOS
uses a cache), proved by that model's own prefill when the policy asks (``recompute``), and a
mismatch is handled by the policy (error, drop, rebuild with the live model); then every
activation's label is held to ``require_provenance``. What passes comes back as
:class:`LoadedCache` values, each carrying its producer, its provenance label and the private
cubes it came from: the hook only places them (its registry of producers, MemOS's items).
Nothing is returned, so nothing placed, when any check refuses.

No MemOS import: the memory's ``llm`` (``model``, ``tokenizer``) is all this uses.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._util import canonical, constants
from ..._util.paths import resolve_inside
from ...errors import (
    CubepackError,
    FormatError,
    IdentityMismatch,
    Mismatch,
    RecomputationFailed,
    UnsupportedError,
)
from ...format._lock import activation_id_key, duplicate_id
from ...format._provenance import RECOMPUTED, RECORDED
from ...format.sections import Lock
from ...identity._config_fields import declared_context
from ...identity._fingerprint import fingerprint
from ...identity._identity import ModelIdentity, dtype_name
from ...kv._format import KVFileInfo, check_kv_file, read_kv_header, unchecked_note
from ...kv._recompute import describe, recompute_layers
from ...kv._torch import cache_from_layers, mapped_layers
from ...memos_format import _layout as memos_layout
from ...trust._evidence import Signed, provenance_evidence, satisfies
from ...trust._policy import TrustPolicy
from ._reprefill import provenance as reprefill_provenance
from ._reprefill import reprefill
from ._shards import memory_bytes
from ._verify import NO_TOKEN_IDS

logger = logging.getLogger("cubepack.memos")

#: How a refusal by :func:`use_problems` reads (what, then these): the producer may match.
USE_FINDING = "cannot be used by this model as MemOS uses a cache"
USE_ADVICE = ("MemOS generates from one sequence, within the positions the model's config "
              "declares (max_position_embeddings, or its RoPE scaling's factor x its original "
              "length); use a model whose context holds it, or a shorter memory")
#: What stands for the producer of a cache nothing records.
UNKNOWN = Mismatch("producer", "a model cubepack saw build, load or register the cache",
                   "unknown")
UNKNOWN_FINDING = "is of unknown origin, so it is not used"


@dataclass(frozen=True)
class LoadedCache:
    """One activation checked for the live model, ready to be placed: its cache (built for
    that model, on its device), MemOS's metadata and records for it, and what travels with it
    to every place that uses or writes it: its producer, its provenance label, its seals."""

    item_id: str
    cache: Any
    metadata: dict[str, Any]
    records: dict[str, Any] | None
    producer: ModelIdentity
    provenance: dict[str, Any] | None
    token_ids: Any
    seals: frozenset[Any]


@dataclass(frozen=True)
class LoadedPrompt:
    """One vLLM prompt checked for the model MemOS's vLLM server serves, ready to be placed:
    its id, the prompt string, MemOS's metadata and records for it."""

    item_id: str
    prompt: str
    metadata: dict[str, Any]
    records: dict[str, Any] | None


def served_model(act_mem: Any) -> Any:
    """The model a vLLM-backed activation memory's server serves (by the name MemOS sends)."""
    return getattr(getattr(act_mem.llm, "config", None), "model_name_or_path", None)


def prompt_file_items(act_mem: Any, cube_dir: Path, path: Path,
                      pinned: set[str] | None) -> list[LoadedPrompt]:
    """A prompts file's items, once the served model is the pinned one (a packed cube: its
    names in ``pinned``) or the one the file names (a folder without a lock, ``pinned``
    None: the file's word is all there is).

    Raises:
        FormatError: not a cubepack prompts file, an entry malformed or repeating an id.
        IdentityMismatch: the vLLM server serves another model.
    """
    served = served_model(act_mem)
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
        records = entry.get("records")
        items.append(LoadedPrompt(entry["id"], entry["prompt"], entry.get("metadata") or {},
                                  records if isinstance(records, dict) else None))
    return items


def packed_prompts(act_mem: Any, cube_dir: Path, lock: Lock) -> tuple[LoadedPrompt, ...]:
    """A verified vLLM cube's prompts for a ``VLLMKVCacheMemory``, once the vLLM model MemOS
    will send them to is the pinned one (by Hub id or name: the weights sit on the vLLM
    server, where cubepack cannot fingerprint them)."""
    if constants.PROMPTS_FILE not in lock.files:
        return ()
    pin = lock.models.get(memos_layout.ACT_ROLE)
    pinned = set() if pin is None else {
        name for name in (pin.repo_id, pin.name, pin.identity.model_id if pin.identity else None)
        if name}
    return tuple(prompt_file_items(act_mem, cube_dir,
                                   resolve_inside(cube_dir, constants.PROMPTS_FILE), pinned))


def use_problems(layers: list[tuple], model: Any) -> list[Mismatch]:
    """What no stored cache may be for a model that generates from it: a batch other than
    one sequence (MemOS's prompt is one), or more positions than the model's config declares
    it attends over (its RoPE scaling included: :func:`declared_context`). Neither is a
    producer field: the model that made it may be this one."""
    found = []
    batch = {int(keys.shape[0]) for _, _, keys, _ in layers if keys.dim() == 4}
    if batch and batch != {1}:
        found.append(Mismatch("batch", 1, max(batch)))
    limit, how = declared_context(getattr(model, "config", None))
    longest = max((int(cumulative) for _, cumulative, _, _ in layers), default=0)
    if limit is not None and longest > limit:
        found.append(Mismatch("seq_length", f"<= {limit} ({how})", longest))
    return found


def require_provenance(lock: Lock, report: Any, required: str | None) -> None:
    """Record what backs each activation's producer label (a recomputation by the loaded model
    is proved; the lock's label is claimed, or signed under a trusted key) and refuse those that
    do not meet ``required`` (the one rule of :func:`cubepack.trust._evidence.satisfies`)."""
    signed: Signed | None = report.signed
    for item_id, entry in sorted(lock.activations.items()):
        backing = provenance_evidence(entry.provenance,
                                      recomputed=report.recomputed.get(item_id),
                                      signed=signed, item=item_id)
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


class Checking:
    """The activations of one load, each checked for the live model (``llm``: the memory's)
    before it is kept; :attr:`items` holds what passed, for the hook to place once every item
    passed (a refusal leaves the memory as it was)."""

    def __init__(self, llm: Any, cube_dir: Path, report: Any, policy: TrustPolicy,
                 seals: frozenset[Any] = frozenset()):
        self.llm, self.cube_dir, self.report, self.policy = llm, cube_dir, report, policy
        #: the private cube's seal: each cache carries it (privacy travels as the producer)
        self.seals = seals
        self.items: list[LoadedCache] = []
        self.ids: dict[str, str] = {}  # activation_id_key -> the id that has it

    def claim(self, item_id: str, where: str) -> None:
        key = activation_id_key(item_id)
        if key in self.ids:
            raise FormatError(f"Two activations of {self.cube_dir} "
                              f"{duplicate_id(self.ids[key], item_id)} ({where}); MemOS would "
                              "keep only one, or two alike.")
        self.ids[key] = item_id

    def add(self, item_id: str, layers: list[tuple], header: dict[str, Any],
            producer: ModelIdentity, provenance: dict[str, Any] | None,
            token_ids: Any = None) -> None:
        """Check ``layers`` for use by the live model (and recompute them when asked), then
        keep them as a cache for it."""
        model = self.llm.model
        problems = use_problems(layers, model)
        if problems:
            raise IdentityMismatch(f"Activation {item_id!r} of {self.cube_dir}", problems,
                                   USE_ADVICE + "; or do not load this cube.",
                                   finding=USE_FINDING)
        if self.policy.recomputation().asked:  # then MemOS gets the prefill the model ran
            provenance, layers = self._prove(item_id, layers, token_ids, header)
        cache = cache_from_layers(layers, model.config, device=model.device, source=item_id)
        records = header.get("records") if isinstance(header.get("records"), dict) else None
        self.items.append(LoadedCache(item_id, cache, memos_layout.item_metadata(header),
                                      records, producer, provenance, token_ids, self.seals))
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
        model = self.llm.model
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
        tokenizer = getattr(self.llm, "tokenizer", None)
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
        """Apply the policy to an item that failed its check: ``error`` raises, ``drop``
        leaves it out (one log line), ``rebuild`` keeps the live model's own prefill of it.
        ``unknown``: nothing records the item's producer (a pickle another process wrote
        without cubepack): it is never taken as the loading model's, whatever its shape."""
        metadata = memos_layout.item_metadata(header)
        on_mismatch = self.policy.mismatch_action()
        if on_mismatch == "error":
            raise IdentityMismatch(
                f"Activation {item_id!r} of {self.cube_dir}", mismatch.mismatches,
                ("Nothing records which model produced it (a MemOS pickle written without "
                 "cubepack), so it is not taken as the loading model's. Pack the folder with "
                 "the model that made it (cubepack pack --legacy-pickle, your assertion), or "
                 "pass on_mismatch='rebuild' (re-extract it from its source text) or 'drop'"
                 if unknown else
                 "The model MemOS loaded is not the one that produced it; load the cube with "
                 "its pinned model, or pass on_mismatch='drop' or 'rebuild'"
                 if mismatch.of_producer
                 else "Its layers are not a cache as a model makes one (they disagree with each "
                 "other or with their lengths); re-extract it from its source text, or pass "
                 "on_mismatch='rebuild' or 'drop'") +
                " (to cubepack.memos.init_from_remote_repo / init_from_dir / install, or set "
                "CUBEPACK_MEMOS_ON_MISMATCH).",
                **({"finding": UNKNOWN_FINDING} if unknown else {})) from None
        if on_mismatch == "drop":
            logger.warning("cubepack: dropped activation %s of %s: %s (%s)", item_id,
                           self.cube_dir, "its producer is unknown" if unknown
                           else "produced by another model" if mismatch.of_producer
                           else "not a cache as a model makes one", ", ".join(mismatch.fields))
            self.report.dropped[item_id] = mismatch.fields
            return
        item = rebuild(self.llm, item_id, metadata, token_ids=token_ids, producer=producer,
                       seals=self.seals)
        self.items.append(item)
        self.report.rebuilt[item_id] = mismatch.fields
        # What MemOS now holds is the loading model's own prefill, run by this process:
        # proved, every position, bit for bit, whatever the replaced item's lock label said
        # (judging it by that label refused every rebuilt item, with a fix the call had
        # already taken).
        tokens = len(item.token_ids) if item.token_ids else None
        self.report.recomputed[item_id] = {"full": True, "positions": tokens, "total": tokens,
                                           "seed": None, "exact": True, "rebuilt": True}


def rebuild(llm: Any, item_id: str, metadata: dict[str, Any], *,
            token_ids: list[int] | None = None, producer: ModelIdentity | None = None,
            seals: frozenset[Any] = frozenset()) -> LoadedCache:
    """Rebuild an item with the live model (``llm``: MemOS's, its ``model`` and
    ``tokenizer``) by the re-prefill ``cubepack migrate`` uses
    (:func:`cubepack.kinds.activations._reprefill.reprefill`): its stored token ids when the
    live tokenizer is its producer's, else its ``source_text`` (a string, a list of strings or
    chat messages) through the chat template, as MemOS's ``extract`` builds it.

    Raises:
        RecomputationFailed: neither usable ids nor a source_text to re-tokenise.
    """
    live = fingerprint(llm.model)
    done = reprefill(llm.model, item_id, token_ids=token_ids, metadata=metadata,
                     producer=producer, identity=live, tokenizer=lambda: llm.tokenizer)
    label = reprefill_provenance(done, live, "the MemOS hook's rebuild policy")
    logger.warning("cubepack: rebuilt activation %s with the loaded model%s", item_id,
                   f" (re-tokenised from its source_text: {done.retokenized})"
                   if done.retokenized else "")
    return LoadedCache(item_id, done.cache, {**metadata, "rebuilt_by_cubepack": True}, None,
                       live, label, done.token_ids, seals)


def note_unchecked(report: Any, item_id: str, info: KVFileInfo) -> None:
    """Record (and warn once per item) that a format-2 KV file's bytes go unchecked here;
    a format-3 file's are checked by :func:`~cubepack.kv._torch.mapped_layers`."""
    note = unchecked_note(info)
    if note:
        report.unchecksummed.append(item_id)
        logger.warning("cubepack: activation %r: %s", item_id, note)


def load_packed(act_mem: Any, cube_dir: Path, lock: Lock, report: Any, policy: TrustPolicy,
                seals: frozenset[Any] = frozenset(), *,
                fetch: Callable[[Any], Any] | None = None) -> tuple[LoadedCache, ...]:
    """A verified cube's KV caches for the memory ``act_mem`` (whose LLM runs here), each
    checked against the live model (and, with ``recompute``, reproduced by it: see
    :mod:`cubepack.kv._recompute`); every label then held to the required provenance.
    ``fetch``: each memory's checked bytes, for memories that are not in ``cube_dir`` (a
    remote cube's, on first use)."""
    if not lock.activations:
        return ()
    pin = lock.models.get(memos_layout.ACT_ROLE)
    pinned = pin.identity if pin is not None else None
    llm = llm_in_dtype(act_mem, pinned.dtype if pinned else None)
    live = fingerprint(llm.model)
    checking = Checking(llm, cube_dir, report, policy, seals)
    for item_id, entry in sorted(lock.activations.items()):
        # A shard's range: checked against its index (sha256, checksums) before it is read.
        data = fetch(entry) if fetch is not None else memory_bytes(cube_dir, entry)
        path = resolve_inside(cube_dir, entry.file) if data is None else \
            f"{entry.file}#{item_id}"
        try:
            info = check_kv_file(path, live, data=data)
        except IdentityMismatch as mismatch:
            stored = read_kv_header(path, data=data)
            checking.mismatch(item_id, mismatch, stored.metadata, token_ids=stored.token_ids,
                              producer=stored.producer)
            continue
        if policy.recomputation().asked and not info.token_ids:
            raise RecomputationFailed(f"Activation {item_id!r} {NO_TOKEN_IDS}.")
        note_unchecked(report, item_id, info)
        checking.add(item_id, mapped_layers(info), info.metadata, info.producer,
                     entry.provenance.to_dict() if entry.provenance is not None else None,
                     info.token_ids)
    # Here, not only in init_from_dir: MemOS's own load (KVCacheMemory.load, which
    # GeneralMemCube.load, MOSCore.load and the scheduler call) reaches this alone; and before
    # anything is placed, so a refusal leaves the memory as it was.
    require_provenance(lock, report, policy.required_provenance())
    return tuple(checking.items)


def load_memos(act_mem: Any, cube_dir: Path, lock: Lock, report: Any, policy: TrustPolicy,
               seals: frozenset[Any] = frozenset(), *,
               fetch: Callable[[Any], Any] | None = None) -> tuple[LoadedCache, ...]:
    """A verified cube's activation memory for ``act_mem``: KV caches for a memory whose LLM
    runs here (:func:`load_packed`); a vLLM cube's prompts to one whose LLM is a server,
    once their served model is the pinned one (:func:`packed_prompts`). Either into the
    other kind of memory is refused: it would leave the memory silently empty."""
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
    if not local:
        return packed_prompts(act_mem, cube_dir, lock)
    return load_packed(act_mem, cube_dir, lock, report, policy, seals, fetch=fetch)
