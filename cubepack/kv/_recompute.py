"""Proof by recomputation: the live model must reproduce a cache, in its tensors and in what it
does.

Causal attention makes the check exact position by position: the keys and values at position
``p`` depend on tokens ``0..p`` only, so a prefill of the stored ``token_ids`` must give the
stored tensors, up to floating-point noise. The bound is the noise the cache's dtype makes *at
that position of that layer*, measured, not one tolerance per layer (docs/explanation/proof-bound.md):

- **Tensors.** The verifier prefills the ids twice: in the cache's dtype (``fresh``) and, for a
  half-precision cache, in float32 (``reference``). The dtype's noise at layer ``l``, position
  ``p`` is ``noise = fresh - reference``: how far the dtype's own rounding, amplified by what
  the model computes there, moves the values. A stored cache passes when, at every layer and
  position, its largest difference ``max |stored - fresh|`` and the difference's norm
  ``||stored - fresh||`` stay within :func:`position_bound` (``NOISE_FACTOR`` times the noise's
  largest element, ``NORM_FACTOR`` times its norm, each at least the layer's median relative
  noise, plus floors in units of the dtype's roundoff). Another kernel or runtime rounds
  differently but through the same computation, so its difference follows the same
  per-position noise: on the tiny test models (large weights: a worst case), eager against
  SDPA attention, up to 512 tokens, honest caches reach at most 0.89 of the bound in float16
  and bfloat16. A float32 cache has no cheaper reference (its
  noise against itself is 0), so it is bound by the floors alone (about 6e-5 of the position's
  scale).
- **Behaviour.** A per-position bound still lets an attacker move every value by up to it in
  the worst direction, so the verifier also continues both caches and compares the next-token
  logits: with :data:`PROBES` tokens it draws at random, and with the fresh cache's own greedy
  continuation (:data:`GREEDY` tokens: the answer a user would get). At each step
  ``max |Δ logit|`` must stay within the smaller of :data:`LOGIT_BOUND` (relative to the largest
  logit) and the same noise rule on the logits (``NOISE_FACTOR * max |fresh - reference| + FLOOR
  * eps * max |fresh|``), and the top-1 token must agree unless the fresh logits tie the two
  tokens within that bound.

What it binds is measured by ``bench/proof_attack.py`` (an optimising attacker on the cache
tensors, every position and each single position) and stated in
docs/explanation/proof-bound.md. A bound on tensor differences does NOT bind an answer: inside
it, a perturbation aligned with one answer's gradient moves that answer ~sqrt(n) times more
than noise of the same size (n: the values moved), so the attacker still finds passing flips.
What binds the answer is the prefill itself: a load that recomputes hands its caller
``Recomputation.layers`` (this runtime's prefill), never the stored tensors.

A full check of a cache that is the prefill bit for bit (:func:`identical`) stops there: no
bound or probe can tell identical tensors apart, and the float32 reference (for half precision
the larger part of the cost) is never made (:meth:`Prefill.of` with ``lazy``).

A partial check (``sample=k``) compares ``k`` positions drawn at random by the verifier (seeded;
the seed is reported so a run can be repeated) across the whole length, always including the
last position and positions inside every sliding layer's kept window. It costs a full prefill
(position ``p`` needs every token before it) and saves only comparisons; only a full check
(every position) proves a cache ``recomputed``. A runtime that cannot recompute in float32
(llama.cpp) is held to the layer-wide :data:`TOLERANCE` by its own module.
"""

from __future__ import annotations

import math
import random
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util.models import load_causal_lm
from ..errors import CubepackError, RecomputationFailed
from ..identity._fingerprint import resolve_model_folder
from ._format import SLIDING, KVFileInfo, producer_runtime
from ._runtime import Incremental, ProvingRuntime, Runtime
from ._torch import cache_from_layers, cache_layers, forward, mapped_layers, output_cache

#: The layer-wide tensor tolerance (``max |Δ| / max |recomputed|`` per layer) a runtime that
#: cannot recompute in float32 is held to (llama.cpp); see the module docstring.
TOLERANCE = {"float32": 1e-4, "float64": 1e-8, "float16": 3e-2, "bfloat16": 2.5e-1}
#: Largest ``max |Δ logit| / max |logit|`` at a probe step, whatever the measured noise
#: (float32: 4e-5, as MLX's honest difference from transformers reaches ~1.1e-5 on some
#: probe draws; it was 1e-5).
LOGIT_BOUND = {"float32": 4e-5, "float64": 1e-10, "float16": 3e-2, "bfloat16": 2.5e-1}
#: The dtype's unit roundoff: the relative spacing of its numbers (2^-mantissa bits).
EPSILON = {"float32": 2.0 ** -24, "float64": 2.0 ** -53, "float16": 2.0 ** -11,
           "bfloat16": 2.0 ** -8}
#: How many times the dtype's measured noise at a position an honest cache may differ by.
NOISE_FACTOR = 16.0
#: The floor, in units of ``eps * rms`` of the position's recomputed values (or ``eps * max``
#: of a step's logits): what any dtype's rounding leaves where the measured noise is 0.
FLOOR = {"float32": 1000.0, "float64": 1000.0, "float16": 16.0, "bfloat16": 16.0}
#: How many times the norm of the dtype's measured noise at a position the norm of an honest
#: cache's difference there may reach: an attacker who moves every value of a position to the
#: element bound in the gradient's direction reaches ``sqrt(channels)`` times more.
NORM_FACTOR = 8.0
#: The norm's floor, in units of ``eps * ||fresh||`` at the position.
NORM_FLOOR = {"float32": 1000.0, "float64": 1000.0, "float16": 2.0, "bfloat16": 2.0}
#: Probe tokens (one random continuation) fed to both caches by the behavioural check.
PROBES = 8
#: Steps of the fresh cache's own greedy continuation fed to both caches.
GREEDY = 4


def position_bound(fresh: Any, reference: Any | None, kv_dtype: str) -> tuple[Any, Any]:
    """How far a stored position may differ from the fresh one, for one part of one layer:
    ``[..., positions, channels]`` tensors in; out, two ``[positions]`` float32 bounds: on the
    largest element ``max |stored - fresh|`` and on the norm ``||stored - fresh||`` of the
    position's values. ``reference``: the float32 recomputation (None: the floors alone, as
    for a float32 cache). The one rule every runtime's check uses (module docstring)."""
    import torch

    fresh = fresh.float()
    dims = tuple(d for d in range(fresh.dim()) if d != fresh.dim() - 2)
    eps = EPSILON.get(kv_dtype, 2.0 ** -8)
    norm = fresh.pow(2).sum(dim=dims).sqrt()
    count = fresh.numel() // fresh.shape[-2]
    largest = FLOOR.get(kv_dtype, 16.0) * eps * norm / math.sqrt(count)  # x rms
    total = NORM_FLOOR.get(kv_dtype, 2.0) * eps * norm
    if reference is not None:
        noise = fresh - reference.to(fresh.device).float()
        noise_largest = noise.abs().amax(dim=dims)
        noise_norm = noise.pow(2).sum(dim=dims).sqrt()
        if noise_norm.numel() > 1:
            # A position's noise is one draw of this runtime's rounding: where it happens to
            # be small, another kernel's (the producer's) is not, and two kernels differ by
            # the sum of their noises. The layer's typical relative noise (median over its
            # positions; the verifier's own prefills, which no cache moves) is a floor.
            scale = norm.clamp(min=1e-30)
            noise_largest = torch.maximum(noise_largest,
                                          (noise_largest / scale).median() * norm)
            noise_norm = torch.maximum(noise_norm, (noise_norm / scale).median() * norm)
        largest = largest + NOISE_FACTOR * noise_largest
        total = total + NORM_FACTOR * noise_norm
    return largest, total


def step_bound(fresh: Any, reference: Any | None, kv_dtype: str) -> Any:
    """The largest ``max |Δ logit|`` at each probe step (``[steps, vocab]`` logits in,
    ``[steps]`` out): the noise rule of :func:`position_bound` on logits, capped by
    :data:`LOGIT_BOUND` relative to the largest fresh logit."""
    scale = fresh.abs().amax(-1)
    derived = FLOOR.get(kv_dtype, 16.0) * EPSILON.get(kv_dtype, 2.0 ** -8) * scale
    if reference is not None:
        derived = derived + NOISE_FACTOR * (fresh - reference).abs().amax(-1)
    cap = LOGIT_BOUND.get(kv_dtype, 2.5e-1) * max(float(fresh.abs().max()), 1e-12)
    return derived.clamp(max=cap)


@dataclass
class Recomputation:
    """The outcome for one activation: what was checked and how close it came."""

    item_id: str
    positions: int  # positions compared
    total: int  # positions the cache covers (its token count)
    max_abs_error: float
    max_rel_error: float
    #: the worst ``max |stored - fresh| / bound`` over layers and positions (<= 1 passes)
    max_noise_ratio: float
    seconds: float
    seed: int | None = None  # for a sampled (partial) check
    #: the worst ``max |Δ logit| / bound`` over probe steps (<= 1 passes)
    max_logit_ratio: float = 0.0
    max_logit_error: float = 0.0  # relative to the largest logit, for the report
    probes: list[int] = field(default_factory=list)
    greedy: list[int] = field(default_factory=list)
    referenced: bool = False  # the noise was measured against a float32 recomputation
    #: why it was not (half precision, no room for the float32 copy): the layer-wide rule ran
    reference_skipped: str | None = None
    first_difference: dict[str, Any] | None = None  # layer, position, part (keys|values|logits)
    detail: str = ""
    #: The recomputing runtime's own prefill of the ids, (type, cumulative_length, keys,
    #: values) per layer: what a load that recomputed hands its caller instead of the stored
    #: tensors (a prefill this process ran is a proof; stored tensors within a bound are still
    #: a claim, and a bound on tensors cannot bind an answer: docs/explanation/proof-bound.md).
    layers: list[tuple] | None = field(default=None, repr=False, compare=False)
    #: positions the stored layers hold (None: every one of ``total``); fewer when every layer
    #: slides: a position no layer keeps is not in the cache, so there is nothing to compare
    held: int | None = None
    #: the stored tensors are the recomputed prefill bit for bit (no bound, no probe ran)
    identical: bool = False

    @property
    def ok(self) -> bool:
        return self.first_difference is None and self.positions > 0

    @property
    def full(self) -> bool:
        """Every position the cache holds was compared: only this proves it ``recomputed``.
        (A model whose every layer slides keeps only its last window: counting the positions
        it dropped called an all-positions check of it partial, so it could never be proved.)"""
        return self.positions == (self.total if self.held is None else self.held)

    def to_dict(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "positions": self.positions, "total": self.total,
                "full": self.full, "held": self.held, "seed": self.seed, "max_abs_error": self.max_abs_error,
                "max_rel_error": self.max_rel_error, "max_noise_ratio": self.max_noise_ratio,
                "noise_factor": NOISE_FACTOR, "referenced": self.referenced,
                "reference_skipped": self.reference_skipped,
                "max_logit_error": self.max_logit_error,
                "max_logit_ratio": self.max_logit_ratio, "probes": self.probes,
                "greedy": self.greedy, "seconds": round(self.seconds, 4), "ok": self.ok,
                "first_difference": self.first_difference, "detail": self.detail,
                "identical": self.identical}


@dataclass
class _Comparison:
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ratio: float = 0.0
    positions: set = field(default_factory=set)
    first: dict[str, Any] | None = None


def recompute(model: Any, info: KVFileInfo, item_id: str, *, sample: int | None = None,
              seed: int | None = None, token_ids: list[int] | None = None) -> Recomputation:
    """Prefill ``model`` on the cache's token ids and compare every layer's keys and values
    with the stored ones (all positions, or ``sample`` positions drawn at random), then compare
    the two caches' next-token logits for random probe tokens and the greedy continuation.

    ``token_ids`` overrides the header's (used when converting a pickle that recorded none).

    Raises:
        CubepackError: the cache records no token ids to recompute from.
    """
    ids = token_ids if token_ids is not None else info.token_ids
    return recompute_layers(model, mapped_layers(info), info.kv_dtype, ids, item_id,
                            sample=sample, seed=seed)


_REFERENCES: Any = None  # model -> (its weights' state, its float32 copy); weak keys


def weights_state(model: Any) -> tuple:
    """What changes when a model's weights change through torch: each parameter's storage,
    version counter (bumped by every in-place write: an optimiser step, ``load_state_dict``),
    dtype and device (``model.to``). A float32 copy made under another state is another
    model's: the noise measured against it would be the two models' difference. Writes
    through ``parameter.data`` bump no counter: a stated limit (proof-bound.md)."""
    return tuple((parameter.data_ptr(), parameter._version, parameter.dtype, parameter.device,
                  tuple(parameter.shape)) for parameter in model.parameters())


def _free_bytes(device: Any) -> int | None:
    """Memory free for a new copy on ``device`` (None: unknown, e.g. a device without a query)."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as meminfo:
                for line in meminfo:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


#: The share of the free memory a float32 reference may take (the prefills need the rest).
REFERENCE_SHARE = 0.8


def _no_room_for_reference(model: Any) -> str | None:
    """Why a float32 copy of ``model`` would not fit where it lives (twice a half-precision
    model: a 7B bf16 model's copy is 28 GB), or None when it fits (or nothing says it would
    not). A proof that cannot make its reference falls back to the layer-wide rule and says
    so, rather than exhausting the device."""
    device = next(model.parameters()).device
    needed = 4 * (sum(p.numel() for p in model.parameters())
                  + sum(b.numel() for b in model.buffers()))
    free = _free_bytes(device)
    if free is None or needed <= REFERENCE_SHARE * free:
        return None
    return (f"a float32 copy of the model needs {needed / 1e9:.2f} GB, {free / 1e9:.2f} GB is "
            f"free on {device}")


class TorchRuntime:
    """How the checks run a transformers model: its prefill as (type, cumulative_length, keys,
    values) layers with the last position's logits, the same in float32 (the reference the
    dtype's noise is measured against), and the next-token logits of probe tokens fed to a
    cache built from such layers. Another runtime (``cubepack.mlx``) supplies the same things
    for its models, so one set of comparisons and bounds serves every runtime: what is proved
    is what the *loading* runtime computes."""

    name = "transformers"

    def __init__(self, model: Any):
        self.model = model
        #: Why :meth:`reference` made no float32 copy of a half-precision model (None: it did)
        self.reference_skipped: str | None = None

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.get_text_config().vocab_size)

    def _run(self, model: Any, ids: list[int]) -> tuple[list[tuple], Any]:
        import torch

        device = next(model.parameters()).device
        with torch.no_grad():  # logits of the last position only: the greedy answer's
            output = forward(model, torch.tensor([ids], device=device), logits_to_keep=1)
        return cache_layers(output_cache(output)), output.logits[:, -1].float()

    def prefill(self, ids: list[int]) -> tuple[list[tuple], Any]:
        """(layers, ``[batch, vocab]`` float32 logits of the last position)."""
        return self._run(self.model, ids)

    def prefill_layers(self, ids: list[int]) -> list[tuple]:
        return self.prefill(ids)[0]

    def reference(self) -> "TorchRuntime | None":
        """This model in float32 (None when it already computes in float32 or wider): a
        copy made once per model and kept while the model lives, made again once the
        model's weights changed (:func:`weights_state`)."""
        import copy
        import weakref

        import torch

        global _REFERENCES
        if next(self.model.parameters()).dtype in (torch.float32, torch.float64):
            return None
        if _REFERENCES is None:
            _REFERENCES = weakref.WeakKeyDictionary()
        state = weights_state(self.model)
        kept = _REFERENCES.get(self.model)
        if kept is None or kept[0] != state:
            _REFERENCES.pop(self.model, None)  # a stale copy goes before a new one is made
            self.reference_skipped = _no_room_for_reference(self.model)
            if self.reference_skipped:
                return None
            kept = _REFERENCES[self.model] = (state, copy.deepcopy(self.model).float())
        return TorchRuntime(kept[1])

    def greedy(self, layers: list[tuple], first: int, steps: int, batch: int) -> list[int]:
        """The greedy continuation after ``layers`` (of the first sequence): ``first``, then
        ``steps - 1`` more, one token a forward on one cache extended as it goes (the cache's
        update makes new tensors: ``layers`` are left as they are)."""
        import torch

        device = next(self.model.parameters()).device
        dtype = next(self.model.parameters()).dtype
        tokens = [first]
        with torch.no_grad():
            cache = cache_from_layers([(kind, total, keys.to(dtype), values.to(dtype))
                                       for kind, total, keys, values in layers],
                                      self.model.config, device=device)
            while len(tokens) < steps:
                step = torch.tensor([[tokens[-1]]] * batch, device=device)
                tokens.append(int(forward(self.model, step, cache).logits[0, -1].argmax()))
        return tokens

    def probe_logits(self, layers: list[tuple], probes: list[int], batch: int) -> Any:
        """float32 logits, ``[batch * len(probes), vocab]``, of ``probes`` fed after ``layers``."""
        import torch

        device = next(self.model.parameters()).device
        dtype = next(self.model.parameters()).dtype
        tokens = torch.tensor([probes] * batch, device=device)
        layers = [(kind, total, keys.to(dtype), values.to(dtype))
                  for kind, total, keys, values in layers]  # a reference's float32 run
        with torch.no_grad():
            cache = cache_from_layers(layers, self.model.config, device=device)
            return forward(self.model, tokens, cache).logits.float().flatten(0, 1)


def recompute_layers(model: Any, stored: list[tuple], kv_dtype: str, ids: list[int] | None,
                     item_id: str, *, sample: int | None = None, seed: int | None = None,
                     runtime: ProvingRuntime | None = None) -> Recomputation:
    """:func:`recompute` for layers already in memory ((type, cumulative_length, keys,
    values) as torch tensors, e.g. read from a MemOS pickle): the same prefills and the same
    comparisons. ``runtime``: the runtime that recomputes (default :class:`TorchRuntime` of
    ``model``)."""
    runtime = runtime or TorchRuntime(model)
    if not ids:
        raise CubepackError(f"Activation {item_id!r} records no token_ids, so it cannot be "
                            "recomputed; pack it from a source that records them.")
    started = time.perf_counter()
    fresh = Prefill.of(runtime, list(ids), lazy=True)
    result = check_layers(runtime, fresh, stored, kv_dtype, item_id, sample=sample, seed=seed)
    result.seconds = time.perf_counter() - started
    result.layers = fresh.layers
    return result


@dataclass
class Prefill:
    """What the verifier computes once for a token sequence: the runtime's prefill in the
    cache's dtype, its last logits, and (half precision) the float32 reference prefill."""

    ids: list[int]
    layers: list[tuple]
    last_logits: Any
    reference: Any = None  # the float32 runtime (None: none, the floor alone)
    reference_layers: list[tuple] | None = None
    reference_logits: Any = None  # its last logits
    #: why a half-precision cache has no float32 reference (the layer-wide rule then applies)
    reference_skipped: str | None = None

    #: the runtime whose float32 reference is still to be made (:meth:`of` with ``lazy``)
    pending: Any = field(default=None, repr=False)

    @classmethod
    def of(cls, runtime: ProvingRuntime, ids: list[int], *, lazy: bool = False) -> "Prefill":
        """``lazy``: the float32 reference prefill is made only when a check needs it
        (:meth:`ensure_reference`): a stored cache that is this prefill bit for bit needs
        none, and for half precision it is the larger part of the cost."""
        layers, last = runtime.prefill(ids)
        fresh = cls(ids, layers, last, pending=runtime)
        if not lazy:
            fresh.ensure_reference()
        return fresh

    def ensure_reference(self) -> None:
        runtime, self.pending = self.pending, None
        if not isinstance(runtime, ProvingRuntime):
            return
        self.reference = runtime.reference()
        self.reference_skipped = getattr(runtime, "reference_skipped", None)
        if self.reference is not None:
            self.reference_layers, self.reference_logits = self.reference.prefill(self.ids)


def check_layers(runtime: ProvingRuntime, fresh: Prefill, stored: list[tuple], kv_dtype: str,
                 item_id: str, *, sample: int | None = None,
                 seed: int | None = None) -> Recomputation:
    """Compare ``stored`` with a :class:`Prefill` of its ids (tensors position by position,
    then behaviour): the proof's one rule, for every runtime and caller."""
    seed = secrets.randbits(32) if seed is None else seed
    rng = random.Random(seed)
    ids = fresh.ids
    # What the model keeps (its own prefill's layers), never what the stored cache says it
    # keeps: a stored cache holding fewer positions must not make a tail check "full".
    held = len(set().union(*(range(total - keys.shape[-2], total)
                             for _, total, keys, _ in fresh.layers)))
    if (sample is None or sample >= len(ids)) and identical(fresh.layers, stored):
        # The stored tensors ARE this prefill: every continuation of them is this model's,
        # step for step, so neither a bound nor a probe can add anything (and the float32
        # reference, the larger part of the cost, is never made).
        result = Recomputation(item_id, held, len(ids), 0.0, 0.0, 0.0, 0.0,
                               identical=True)
        result.held = held if held < len(ids) else None
        return result
    fresh.ensure_reference()
    wanted = _positions(len(ids), sample, stored, rng)
    comparison = _Comparison()
    references = fresh.reference_layers or [None] * len(fresh.layers)
    # No room for the float32 reference: the layer-wide rule (weaker, and said so), every
    # position; the floors alone would refuse honest half-precision caches.
    layer_wide = fresh.reference_skipped is not None and fresh.reference_layers is None
    for index, (fresh_layer, stored_layer, reference_layer) in enumerate(
            zip(fresh.layers, stored, references)):
        if layer_wide:
            compare_layer_wide(index, fresh_layer, stored_layer,
                               TOLERANCE.get(kv_dtype, TOLERANCE["bfloat16"]), comparison)
            comparison.positions.update(range(fresh_layer[1] - fresh_layer[2].shape[-2],
                                              fresh_layer[1]))
            wanted = None
            continue
        _compare_layer(index, fresh_layer, stored_layer, reference_layer, kv_dtype, wanted,
                       comparison)
    detail = ""
    if len(fresh.layers) != len(stored):
        comparison.first = comparison.first or {"layer": min(len(fresh.layers), len(stored)),
                                                "position": 0, "part": "layers"}
        detail = f"the model has {len(fresh.layers)} layers, the cache {len(stored)}"
    result = Recomputation(item_id, len(comparison.positions), len(ids), comparison.max_abs,
                           comparison.max_rel, comparison.max_ratio, 0.0,
                           seed=None if wanted is None else seed,
                           referenced=fresh.reference_layers is not None,
                           first_difference=comparison.first, detail=detail,
                           reference_skipped=fresh.reference_skipped)
    result.held = held if held < len(ids) else None
    if result.first_difference is None:
        _compare_behaviour(runtime, stored, fresh, rng, kv_dtype, result)
    return result


def identical(fresh: list[tuple], stored: list[tuple]) -> bool:
    """Are the stored layers these, bit for bit: the same layer types, lengths, shapes,
    dtypes and bytes? Bytes, not values: ``==`` calls -0.0 and +0.0 equal, and a process that
    flushes denormals (``torch.set_flush_denormal``) reads a denormal as 0.0, yet their bytes
    differ. A NaN is never identical (no prefill is proved by one)."""
    import torch

    if len(fresh) != len(stored):
        return False
    for (kind, total, keys, values), (s_kind, s_total, s_keys, s_values) in zip(fresh, stored):
        if kind != s_kind or total != s_total:
            return False
        for mine, theirs in ((keys, s_keys), (values, s_values)):
            if (not isinstance(theirs, torch.Tensor) or mine.shape != theirs.shape
                    or mine.dtype != theirs.dtype):
                return False
            theirs = theirs.to(mine.device)
            if bool(torch.isnan(mine).any()) or not torch.equal(_bits(mine), _bits(theirs)):
                return False
    return True


#: An integer dtype of each element width: a tensor's bits, compared without float rules.
_BITS = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _bits(tensor: Any) -> Any:
    """``tensor``'s bytes as integers of its element width (a view where it is contiguous)."""
    import torch

    return tensor.contiguous().view(getattr(torch, _BITS[tensor.element_size()]))


def require_recomputed_here(runtime: ProvingRuntime, info: KVFileInfo,
                            stored: list[tuple] | None = None, *, always: bool = False,
                            sample: int | None = None,
                            seed: int | None = None) -> Recomputation | None:
    """Accept a cache another runtime computed only once ``runtime`` (the one loading it)
    reproduces it: every position, tensors and behaviour, within this module's bounds. A
    cache of the loading runtime itself is left to the producer check (None returned), unless
    ``always`` (a load asked to prove it: ``recompute``), then ``sample`` positions drawn with
    ``seed`` (None: every position).

    When it recomputed, the caller must use ``result.layers`` (this runtime's own prefill),
    not the stored tensors: the comparison proves the cache is this model's within the bound,
    but inside the bound an attacker can still steer an answer; the prefill this process ran
    cannot be steered (docs/explanation/proof-bound.md).

    ``stored``: the cache's layers as torch tensors (default: mapped from the KV file).

    Raises:
        RecomputationFailed: it records no token ids, or ``runtime`` does not reproduce it.
    """
    made_by = producer_runtime(info.metadata)
    if made_by == runtime.name and not always:
        return None
    what = f"KV cache {info.path.name}"
    if not info.token_ids:
        if made_by == runtime.name:
            raise RecomputationFailed(
                f"{what} records no token ids, so it cannot be recomputed, and recomputation "
                "was asked for; save it with token_ids= (or load it without recompute).")
        raise RecomputationFailed(
            f"{what} was computed by {made_by} and is being loaded into {runtime.name}: it is "
            f"accepted only once {runtime.name} reproduces it, but it records no token ids. "
            "Import it again with the ids it covers (cubepack import mlx FILE --model M "
            "--token-ids IDS).")
    cross = made_by != runtime.name  # another runtime's cache: every position, always
    result = recompute_layers(None, stored if stored is not None else mapped_layers(info),
                              info.kv_dtype, info.token_ids, str(info.metadata.get("id") or
                                                                 info.path.name),
                              sample=None if cross else sample, seed=seed, runtime=runtime)
    if not result.ok and not cross:
        raise RecomputationFailed(f"{what}: {runtime.name} does not reproduce it: it "
                                  f"{describe(result)}. It is not what this model computes.")
    if not result.ok:
        raise RecomputationFailed(
            f"{what} was computed by {made_by}; {runtime.name}, loading it, computes something "
            f"else: it {describe(result)}. Load it into the model that made it, in {made_by}, "
            "or recompute it here.")
    return result


def _positions(total: int, sample: int | None, stored: list[tuple], rng: random.Random
               ) -> set[int] | None:
    """The positions a sampled check compares (None: every position). Drawn by the verifier
    across the whole length, plus the last position and a share inside each sliding layer's
    kept window (a window that starts after any prefix an attacker could predict)."""
    if sample is None or sample >= total:
        return None
    # The last position, and the rest of the sample from the others: drawn from every
    # position, a sample of total - 1 covered them all once in ``total`` runs, and a check the
    # user asked to be partial ran full (a flaky "partial" in the tests showed it).
    chosen = set(rng.sample(range(total - 1), max(0, sample - 1))) | {total - 1}
    for kind, cumulative, keys, _ in stored:
        kept = keys.shape[-2]
        if kind == SLIDING and 0 < kept < cumulative:
            window = range(cumulative - kept, cumulative)
            chosen |= set(rng.sample(window, min(kept, max(1, math.ceil(sample / 2)))))
    return chosen


def _compare_layer(index: int, fresh: tuple, stored: tuple, reference: tuple | None,
                   kv_dtype: str, wanted: set[int] | None, comparison: _Comparison) -> None:
    """Compare the positions both hold (a sliding layer keeps only its last ones), restricted
    to the sampled positions of a partial check, each against its own bound
    (:func:`position_bound`)."""
    import torch

    _, fresh_total, fresh_keys, fresh_values = fresh
    _, stored_total, stored_keys, stored_values = stored
    fresh_start = fresh_total - fresh_keys.shape[-2]
    stored_start = stored_total - stored_keys.shape[-2]
    start, end = max(fresh_start, stored_start), min(fresh_total, stored_total)
    if end <= start:
        return
    positions = [p for p in range(start, end) if wanted is None or p in wanted]
    if not positions:
        return
    selected = torch.tensor([p - start for p in positions])
    parts = (("keys", fresh_keys, stored_keys, None if reference is None else reference[2]),
             ("values", fresh_values, stored_values, None if reference is None else reference[3]))
    for part, new, old, ref in parts:
        new = new[..., start - fresh_start:end - fresh_start, :]
        old = old[..., start - stored_start:end - stored_start, :]
        if ref is not None:
            ref = ref[..., start - fresh_start:end - fresh_start, :]
            if ref.shape != new.shape:
                ref = None  # a reference that keeps another window: the floor alone
        if new.shape != old.shape:
            comparison.first = comparison.first or {"layer": index, "position": start,
                                                    "part": f"{part} shape"}
            continue
        new, old = new.float(), old.to(new.device).float()
        dims = tuple(d for d in range(new.dim()) if d != new.dim() - 2)
        # NaN compares false with any bound: make it the largest error instead.
        difference = (new - old).nan_to_num(nan=math.inf)
        error = difference.abs().amax(dim=dims)
        norm = difference.pow(2).sum(dim=dims).sqrt()
        bound, norm_bound = position_bound(new, ref, kv_dtype)
        error, bound = error.cpu()[selected], bound.cpu()[selected]
        norm, norm_bound = norm.cpu()[selected], norm_bound.cpu()[selected]
        scale = max(new.abs().max().item(), 1e-12)
        worst = error.max().item() if error.numel() else 0.0
        ratio = torch.maximum(error / bound.clamp(min=1e-30), norm / norm_bound.clamp(min=1e-30))
        comparison.max_abs = max(comparison.max_abs, worst)
        comparison.max_rel = max(comparison.max_rel, worst / scale)
        comparison.max_ratio = max(comparison.max_ratio, ratio.max().item())
        comparison.positions.update(positions)
        beyond = torch.nonzero(ratio > 1)
        if len(beyond) and comparison.first is None:
            at = int(beyond[0])
            what = ((float(error[at]), float(bound[at]), "largest") if error[at] > bound[at] else
                    (float(norm[at]), float(norm_bound[at]), "norm"))
            comparison.first = {"layer": index, "position": positions[at], "part": part,
                                "error": what[0], "bound": what[1], "measure": what[2]}


def compare_layer_wide(index: int, fresh: tuple, stored: tuple, tolerance: float,
                       comparison: _Comparison) -> None:
    """The layer-wide rule (``max |Δ| / max |fresh|`` per layer within ``tolerance``), for a
    runtime that cannot recompute in float32 to measure its noise per position (llama.cpp,
    whose GGUF weights are the dtype). Weaker than :func:`_compare_layer`: see the module
    docstring."""
    _, fresh_total, fresh_keys, fresh_values = fresh
    _, stored_total, stored_keys, stored_values = stored
    start = max(fresh_total - fresh_keys.shape[-2], stored_total - stored_keys.shape[-2])
    for part, new, old in (("keys", fresh_keys, stored_keys), ("values", fresh_values,
                                                               stored_values)):
        new = new[..., new.shape[-2] - (fresh_total - start):, :].float()
        old = old[..., old.shape[-2] - (stored_total - start):, :].float()
        if new.shape != old.shape:
            comparison.first = comparison.first or {"layer": index, "position": start,
                                                    "part": f"{part} shape"}
            continue
        error = (new - old).abs().nan_to_num(nan=math.inf)
        scale = max(new.abs().max().item(), 1e-12)
        comparison.max_abs = max(comparison.max_abs, error.max().item())
        comparison.max_rel = max(comparison.max_rel, error.max().item() / scale)
        if error.max().item() / scale > tolerance and comparison.first is None:
            bad = (error > tolerance * scale).flatten(0, 1).any(0).any(-1)
            comparison.first = {"layer": index, "part": part,
                                "position": start + int(bad.nonzero()[0])}


def _compare_behaviour(runtime: ProvingRuntime, stored: list[tuple], fresh: Prefill, rng: random.Random,
                       kv_dtype: str, result: Recomputation) -> None:
    """Continue the stored and the recomputed cache with the same tokens: random probes (one
    sequence, so each cache is extended once) and the greedy continuation; their logits at
    every step must agree within :func:`step_bound`, top-1 included.

    For a half-precision cache the continuations run in the float32 reference, the stored,
    fresh and reference caches in one forward: what is compared is then what the *caches*
    change in the answer, without the continuation's own rounding on top (the noise rule on
    logits measures the same thing: the fresh cache against the reference one), and on a
    CPU without half-precision matrix units it costs a fraction of a half-precision forward.
    The greedy continuation is the reference's (the answer without the dtype's rounding)."""
    import torch

    probes = [rng.randrange(runtime.vocab_size) for _ in range(PROBES)]
    batch = stored[0][2].shape[0] if stored else 1
    runner, caches = runtime, [stored, fresh.layers]
    last, own = fresh.last_logits, fresh.layers
    if fresh.reference_layers is not None:
        runner, last, own = fresh.reference, fresh.reference_logits, fresh.reference_layers
        caches.append(fresh.reference_layers)
        caches = [[(kind, total, keys.float(), values.float())
                   for kind, total, keys, values in layers] for layers in caches]
    greedy = _greedy(runner, own, last, batch)
    result.probes, result.greedy = probes, greedy
    # One continuation: the greedy answer first (it follows the cache), then the random
    # probes; every cache in one batch where their shapes allow.
    tokens = greedy + probes
    logits = _continue(runner, caches, tokens, batch)
    stored_logits, fresh_logits = logits[0], logits[1]
    reference = logits[2] if len(logits) > 2 else None
    bound = step_bound(fresh_logits, reference, kv_dtype)
    gap = (stored_logits - fresh_logits).abs().nan_to_num(nan=math.inf).amax(-1)
    scale = max(fresh_logits.abs().max().item(), 1e-12)
    result.max_logit_error = float(gap.max()) / scale
    result.max_logit_ratio = float((gap / bound.clamp(min=1e-30)).max())
    top_stored, top_fresh = stored_logits.argmax(-1), fresh_logits.argmax(-1)
    # A flipped top-1 counts unless the fresh logits tie the two tokens within the bound.
    tie = (fresh_logits.gather(-1, top_fresh[:, None]) -
           fresh_logits.gather(-1, top_stored[:, None]))[:, 0] <= bound
    flipped = (top_stored != top_fresh) & ~tie
    beyond = gap > bound
    if bool(flipped.any() or beyond.any()):
        which = int(torch.nonzero(flipped | beyond)[0])
        step = which % len(tokens)
        kind = "greedy" if step < len(greedy) else "probe"
        result.first_difference = {"layer": "logits", "position": result.total + step,
                                   "part": f"{kind} token {tokens[step]} (step {step})"}
        result.detail = ("the continuation logits differ: the stored cache's top token is "
                         f"{int(top_stored[which])}, the recomputed one's "
                         f"{int(top_fresh[which])}" if bool(flipped[which]) else
                         "the continuation logits differ")


def _continue(runner: Any, caches: list[list[tuple]], tokens: list[int], batch: int
              ) -> list[Any]:
    """Each cache's ``[batch * len(tokens), vocab]`` float32 logits for ``tokens``: one
    forward over the caches stacked on the batch axis when every layer's shapes agree (a
    single-sequence cache), else one forward per cache."""
    import torch

    shapes = {tuple((tuple(k.shape), tuple(v.shape), k.device) for _, _, k, v in layers)
              for layers in caches}
    if batch != 1 or len(shapes) != 1:
        return [runner.probe_logits(layers, tokens, batch) for layers in caches]
    merged = [(kind, total, torch.cat([layers[i][2].to(keys.dtype) for layers in caches]),
               torch.cat([layers[i][3].to(values.dtype) for layers in caches]))
              for i, (kind, total, keys, values) in enumerate(caches[0])]
    return list(runner.probe_logits(merged, tokens, len(caches)).split(len(tokens)))


def _greedy(runtime: Runtime, layers: list[tuple], last_logits: Any, batch: int) -> list[int]:
    """The cache's own greedy continuation, :data:`GREEDY` tokens (of its first sequence):
    what a user of this cache would be answered."""
    if last_logits is None or GREEDY <= 0:
        return []
    tokens = [int(last_logits[0].argmax())]
    if isinstance(runtime, Incremental):  # a token a step, not the prefix again
        return runtime.greedy(layers, tokens[0], GREEDY, batch)
    while len(tokens) < GREEDY:
        logits = runtime.probe_logits(layers, tokens, batch)
        tokens.append(int(logits[len(tokens) - 1].argmax()))
    return tokens


def describe(result: Recomputation) -> str:
    scope = (f"all {result.positions} positions" + (
        f" the cache holds (of {result.total}: every layer slides)" if result.held else "")
             if result.full else
             f"{result.positions} of {result.total} positions (sampled, seed {result.seed})")
    against = ("the dtype's noise measured against a float32 recomputation" if result.referenced
               else f"the layer-wide tolerance, weaker: {result.reference_skipped}"
               if result.reference_skipped
               else "the dtype's rounding floor")
    if result.ok and result.identical:
        return (f"recomputed {scope}: the stored tensors are this prefill bit for bit (no "
                "bound or probe needed: identical caches answer identically)")
    if result.ok:
        return (f"recomputed {scope}: max abs error {result.max_abs_error:.3g}, at most "
                f"{result.max_noise_ratio:.3g} of each position's bound ({against}); "
                f"next-token logits of {len(result.probes)} probes and {len(result.greedy)} "
                f"greedy steps within {result.max_logit_ratio:.3g} of their bound")
    where = result.first_difference or {}
    if where.get("layer") == "logits":
        return (f"reproduces the tensors ({scope}) but not their behaviour: {result.detail} "
                f"for {where.get('part')} (logit error {result.max_logit_ratio:.3g}x its bound)")
    size = (f": {where['measure']} error {where['error']:.3g} > bound {where['bound']:.3g} "
            f"({against})" if "bound" in where else "")
    return (f"differs from the model's own prefill at layer {where.get('layer')}, position "
            f"{where.get('position')} ({where.get('part')}){size}"
            + (f"; {result.detail}" if result.detail else ""))


def load_for_recompute(model: Any, repo_id: str | None, revision: str | None,
                       dtype: str | None) -> Any:
    """A loaded model to recompute with: ``model`` itself when loaded, else loaded from the
    folder or Hub id given, or from the pin's revision (``repo_id@revision``) in the HF cache,
    in the pinned ``dtype``. Never from a path the cube names: that would let the cube choose
    what proves it."""
    if model is not None and not isinstance(model, (str, Path)):
        return model
    if model is not None:
        folder, _, _ = resolve_model_folder(str(model))
    elif repo_id and revision:
        folder, _, _ = resolve_model_folder(repo_id, revision, local_files_only=True)
    else:
        raise CubepackError("recomputation needs the producer model: pass --model (the pin "
                            "names no Hub revision to find it in the HF cache)")
    return load_model(folder, dtype)


def load_model(folder: Path, dtype: str | None) -> Any:
    """A causal LM from ``folder`` for inference, in ``dtype`` when given."""
    import torch

    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)} if dtype else {}
    return load_causal_lm(folder, **kwargs)
