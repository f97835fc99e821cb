"""Proof by recomputation: the live model must reproduce a cache, in its tensors and in what it
does.

Causal attention makes the check exact position by position: the keys and values at position
``p`` depend on tokens ``0..p`` only, so a prefill of the stored ``token_ids`` must give the
stored tensors, up to floating-point noise. Two bounds apply, both decided by the verifier:

- **Tensors**, per layer, ``max |stored - recomputed| / max |recomputed|`` over the positions
  checked: float32 1e-4, float16 3e-2, bfloat16 2.5e-1. The same computation in the same dtype
  differs only by reduction order and kernels (CPU against GPU, eager against SDPA attention,
  another BLAS). Measured on the tiny test models (large weights, so a worst case) for eager
  against SDPA attention, up to 256 tokens: float32 6e-7, float16 9.3e-3, bfloat16 8.0e-2; the
  bounds sit about three times above. An edit or another model differs by order 1.
- **Behaviour**: a per-element bound lets an attacker move every value by up to the
  tolerance in the worst direction (along the gradient of a next-token logit), which can flip
  greedy decoding while every tensor stays within bounds. So the verifier also continues both
  caches with the same sequence of probe tokens it draws at random and compares the logits at
  every step: ``max |Δ logit|``
  relative to the largest logit must stay within :data:`LOGIT_BOUND` (float32 1e-5, float16
  3e-2, bfloat16 2.5e-1; measured kernel noise 1.4e-6, 9.1e-3, 7.7e-2), and the top-1 token must
  agree unless the recomputed logits tie the two tokens within that bound. A cache accepted is
  thus one whose next-token logits, for tokens the attacker could not predict, are within the
  bound of what the live model computes.

A partial check (``sample=k``) compares ``k`` positions drawn at random by the verifier (seeded;
the seed is reported so a run can be repeated) across the whole length, always including the
last position and positions inside every sliding layer's kept window. It costs a full prefill
(position ``p`` needs every token before it) and saves only comparisons; only a full check
(every position) proves a cache ``recomputed``.
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
from ._torch import cache_from_layers, cache_layers, forward, mapped_layers, output_cache

TOLERANCE = {"float32": 1e-4, "float64": 1e-8, "float16": 3e-2, "bfloat16": 2.5e-1}
#: Largest ``max |Δ logit| / max |logit|`` between the stored and the recomputed cache's
#: next-token logits for a probe token (see the module docstring and the README).
LOGIT_BOUND = {"float32": 1e-5, "float64": 1e-10, "float16": 3e-2, "bfloat16": 2.5e-1}
#: Probe tokens (one random continuation) fed to both caches by the behavioural check.
PROBES = 8


@dataclass
class Recomputation:
    """The outcome for one activation: what was checked and how close it came."""

    item_id: str
    positions: int  # positions compared
    total: int  # positions the cache holds (its token count)
    max_abs_error: float
    max_rel_error: float
    tolerance: float
    seconds: float
    seed: int | None = None  # for a sampled (partial) check
    max_logit_error: float = 0.0
    logit_bound: float = 0.0
    probes: list[int] = field(default_factory=list)
    first_difference: dict[str, Any] | None = None  # layer, position, part (keys|values|logits)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.first_difference is None and self.positions > 0

    @property
    def full(self) -> bool:
        """Every position was compared: only this proves a cache ``recomputed``."""
        return self.positions == self.total

    def to_dict(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "positions": self.positions, "total": self.total,
                "full": self.full, "seed": self.seed, "max_abs_error": self.max_abs_error,
                "max_rel_error": self.max_rel_error, "tolerance": self.tolerance,
                "max_logit_error": self.max_logit_error, "logit_bound": self.logit_bound,
                "probes": self.probes, "seconds": round(self.seconds, 4), "ok": self.ok,
                "first_difference": self.first_difference, "detail": self.detail}


@dataclass
class _Comparison:
    max_abs: float = 0.0
    max_rel: float = 0.0
    positions: set = field(default_factory=set)
    first: dict[str, Any] | None = None


def recompute(model: Any, info: KVFileInfo, item_id: str, *, sample: int | None = None,
              seed: int | None = None, token_ids: list[int] | None = None) -> Recomputation:
    """Prefill ``model`` on the cache's token ids and compare every layer's keys and values
    with the stored ones (all positions, or ``sample`` positions drawn at random), then compare
    the two caches' next-token logits for random probe tokens.

    ``token_ids`` overrides the header's (used when converting a pickle that recorded none).

    Raises:
        CubepackError: the cache records no token ids to recompute from.
    """
    ids = token_ids if token_ids is not None else info.token_ids
    return recompute_layers(model, mapped_layers(info), info.kv_dtype, ids, item_id,
                            sample=sample, seed=seed)


class TorchRuntime:
    """How the checks run a transformers model: its prefill (through the base model) as
    (type, cumulative_length, keys, values) layers, and the next-token logits of probe tokens
    fed to a cache built from such layers. Another runtime (``cubepack.mlx``) supplies the
    same three things for its models, so one set of comparisons and bounds serves every
    runtime: what is proved is what the *loading* runtime computes."""

    name = "transformers"

    def __init__(self, model: Any):
        self.model = model

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.get_text_config().vocab_size)

    def prefill_layers(self, ids: list[int]) -> list[tuple]:
        import torch

        device = next(self.model.parameters()).device
        with torch.no_grad():
            output = forward(self.model.base_model, torch.tensor([ids], device=device))
        return cache_layers(output_cache(output))

    def probe_logits(self, layers: list[tuple], probes: list[int], batch: int) -> Any:
        """float32 logits, ``[batch * len(probes), vocab]``, of ``probes`` fed after ``layers``."""
        import torch

        device = next(self.model.parameters()).device
        tokens = torch.tensor([probes] * batch, device=device)
        with torch.no_grad():
            cache = cache_from_layers(layers, self.model.config, device=device)
            return forward(self.model, tokens, cache).logits.float().flatten(0, 1)


def recompute_layers(model: Any, stored: list[tuple], kv_dtype: str, ids: list[int] | None,
                     item_id: str, *, sample: int | None = None, seed: int | None = None,
                     runtime: Any = None) -> Recomputation:
    """:func:`recompute` for layers already in memory ((type, cumulative_length, keys,
    values) as torch tensors, e.g. read from a MemOS pickle): the same prefill and the same
    comparisons. ``runtime``: the runtime that recomputes (default :class:`TorchRuntime` of
    ``model``); its prefill and probe logits are compared with the same bounds."""
    runtime = runtime or TorchRuntime(model)
    if not ids:
        raise CubepackError(f"Activation {item_id!r} records no token_ids, so it cannot be "
                            "recomputed; pack it from a source that records them.")
    seed = secrets.randbits(32) if seed is None else seed
    rng = random.Random(seed)
    wanted = _positions(len(ids), sample, stored, rng)
    tolerance = TOLERANCE.get(kv_dtype, 2.5e-1)
    started = time.perf_counter()
    fresh = runtime.prefill_layers(list(ids))
    comparison = _Comparison()
    for index, (fresh_layer, stored_layer) in enumerate(zip(fresh, stored)):
        _compare_layer(index, fresh_layer, stored_layer, tolerance, wanted, comparison)
    detail = ""
    if len(fresh) != len(stored):
        comparison.first = comparison.first or {"layer": min(len(fresh), len(stored)),
                                                "position": 0, "part": "layers"}
        detail = f"the model has {len(fresh)} layers, the cache {len(stored)}"
    result = Recomputation(item_id, len(comparison.positions), len(ids), comparison.max_abs,
                           comparison.max_rel, tolerance, 0.0,
                           seed=None if wanted is None else seed,
                           logit_bound=LOGIT_BOUND.get(kv_dtype, 2.5e-1),
                           first_difference=comparison.first, detail=detail)
    if result.first_difference is None:
        _compare_behaviour(runtime, stored, fresh, rng, result)
    result.seconds = time.perf_counter() - started
    return result


def require_recomputed_here(runtime: Any, info: KVFileInfo,
                            stored: list[tuple] | None = None, *, always: bool = False,
                            sample: int | None = None,
                            seed: int | None = None) -> Recomputation | None:
    """Accept a cache another runtime computed only once ``runtime`` (the one loading it)
    reproduces it: every position, tensors and behaviour, within this module's bounds. A
    cache of the loading runtime itself is left to the producer check (None returned), unless
    ``always`` (a load asked to prove it: ``recompute``), then ``sample`` positions drawn with
    ``seed`` (None: every position).

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
    chosen = set(rng.sample(range(total), sample)) | {total - 1}
    for kind, cumulative, keys, _ in stored:
        kept = keys.shape[-2]
        if kind == SLIDING and 0 < kept < cumulative:
            window = range(cumulative - kept, cumulative)
            chosen |= set(rng.sample(window, min(kept, max(1, math.ceil(sample / 2)))))
    return chosen


def _compare_layer(index: int, fresh: tuple, stored: tuple, tolerance: float,
                   wanted: set[int] | None, comparison: _Comparison) -> None:
    """Compare the positions both hold (a sliding layer keeps only its last ones), restricted
    to the sampled positions of a partial check."""
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
    contiguous = len(positions) == end - start  # a full check: views, no gather
    for part, new, old in (("keys", fresh_keys, stored_keys), ("values", fresh_values,
                                                               stored_values)):
        if contiguous:
            new = new[..., start - fresh_start:end - fresh_start, :]
            old = old[..., start - stored_start:end - stored_start, :]
        else:
            new = new.index_select(-2, torch.tensor([p - fresh_start for p in positions],
                                                    device=new.device))
            old = old.index_select(-2, torch.tensor([p - stored_start for p in positions],
                                                    device=old.device))
        new, old = new.float(), old.to(new.device).float()
        if new.shape != old.shape:
            comparison.first = comparison.first or {"layer": index, "position": start,
                                                    "part": f"{part} shape"}
            continue
        error = (new - old).abs().nan_to_num(nan=math.inf)  # NaN compares false with a bound
        scale = max(new.abs().max().item(), 1e-12)
        worst = error.max().item() if error.numel() else 0.0
        comparison.max_abs = max(comparison.max_abs, worst)
        comparison.max_rel = max(comparison.max_rel, worst / scale)
        comparison.positions.update(positions)
        if worst / scale > tolerance and comparison.first is None:
            bad = (error > tolerance * scale).flatten(0, 1).any(0).any(-1)  # per position
            offset = int(torch.nonzero(bad)[0])
            comparison.first = {"layer": index, "position": positions[offset], "part": part}


def _compare_behaviour(runtime: Any, stored: list[tuple], fresh: list[tuple],
                       rng: random.Random, result: Recomputation) -> None:
    """Continue the stored and the recomputed cache with the same random probe tokens (one
    sequence, so each cache is extended once); their logits at every probe step must agree
    within the dtype's bound, top-1 included."""
    import torch

    probes = [rng.randrange(runtime.vocab_size) for _ in range(PROBES)]
    result.probes = probes
    batch = stored[0][2].shape[0] if stored else 1
    stored_logits, fresh_logits = (runtime.probe_logits(layers, probes, batch)
                                   for layers in (stored, fresh))
    scale = max(fresh_logits.abs().max().item(), 1e-12)
    gap = (stored_logits - fresh_logits).abs().nan_to_num(nan=math.inf).max(-1).values / scale
    result.max_logit_error = float(gap.max().item())
    top_stored, top_fresh = stored_logits.argmax(-1), fresh_logits.argmax(-1)
    # A flipped top-1 counts unless the recomputed logits tie the two tokens within the bound.
    tie = (fresh_logits.gather(-1, top_fresh[:, None]) -
           fresh_logits.gather(-1, top_stored[:, None]))[:, 0] / scale <= result.logit_bound
    flipped = (top_stored != top_fresh) & ~tie
    beyond = gap > result.logit_bound
    if bool(flipped.any() or beyond.any()):
        which = int(torch.nonzero(flipped | beyond)[0])
        step = which % len(probes)
        result.first_difference = {"layer": "logits", "position": result.total + step,
                                   "part": f"probe token {probes[step]} (step {step})"}
        result.detail = ("the continuation logits differ: the stored cache's top token is "
                         f"{int(top_stored[which])}, the recomputed one's {int(top_fresh[which])}"
                         if bool(flipped[which]) else "the continuation logits differ")


def describe(result: Recomputation) -> str:
    scope = (f"all {result.positions} positions" if result.full else
             f"{result.positions} of {result.total} positions (sampled, seed {result.seed})")
    if result.ok:
        return (f"recomputed {scope}: max abs error {result.max_abs_error:.3g}, max relative "
                f"{result.max_rel_error:.3g} (tolerance {result.tolerance:g}); next-token "
                f"logits of {len(result.probes)} probes within {result.max_logit_error:.3g} "
                f"(bound {result.logit_bound:g})")
    where = result.first_difference or {}
    if where.get("layer") == "logits":
        return (f"reproduces the tensors ({scope}) but not their behaviour: {result.detail} "
                f"for {where.get('part')} (max relative logit error "
                f"{result.max_logit_error:.3g} > bound {result.logit_bound:g})")
    return (f"differs from the model's own prefill at layer {where.get('layer')}, position "
            f"{where.get('position')} ({where.get('part')}): max relative error "
            f"{result.max_rel_error:.3g} > tolerance {result.tolerance:g}"
            + (f"; {result.detail}" if result.detail else ""))


def load_for_recompute(model: Any, pin: dict[str, Any]) -> Any:
    """A loaded model to recompute with: ``model`` itself when loaded, else loaded from the
    folder or Hub id given, or from the pinned revision in the HF cache, in the pinned dtype.
    Never from a path the cube names: that would let the cube choose what proves it."""
    if model is not None and not isinstance(model, (str, Path)):
        return model
    identity = pin.get("identity") or {}
    if model is not None:
        folder, _, _ = resolve_model_folder(str(model))
    elif pin.get("repo_id") and pin.get("revision"):
        folder, _, _ = resolve_model_folder(pin["repo_id"], pin["revision"], local_files_only=True)
    else:
        raise CubepackError("recomputation needs the producer model: pass --model (the pin "
                            "names no Hub revision to find it in the HF cache)")
    return load_model(folder, identity.get("dtype"))


def load_model(folder: Path, dtype: str | None) -> Any:
    """A causal LM from ``folder`` for inference, in ``dtype`` when given."""
    import torch

    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)} if dtype else {}
    return load_causal_lm(folder, **kwargs)
