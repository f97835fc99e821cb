"""Proof by recomputation: the live model must reproduce a cache's keys and values.

Causal attention makes a prefix check exact: the keys and values of the first N tokens depend
on those N tokens only, so a prefill of the stored ``token_ids`` (or a prefix of them) must give
the stored tensors at those positions, up to floating-point noise. A cache whose values were
altered under a correct header, another model's cache relabelled, or a cache built at shifted
positions differs far beyond that noise.

Tolerance (``max |stored - recomputed|`` per layer, relative to ``max |recomputed|`` of that
layer): float32 1e-4, float16 5e-3, bfloat16 2e-2. A recomputation runs the same computation in
the same dtype, so what differs is reduction order and kernels (a CPU against a GPU, eager
against SDPA attention, another BLAS): measured on the same machine the difference is 0 or a
few ulps; across kernels it stays within a few ulps of the dtype's epsilon per layer
(float32 1.2e-7, float16 9.8e-4, bfloat16 7.8e-3), compounding mildly through depth. The bounds
sit one to three orders of magnitude above that and far below what an edit or another model
produces (relative differences of order 1).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CubepackError
from ..identity._fingerprint import fingerprint, resolve_model_folder
from ..identity._identity import ModelIdentity, compare
from ._format import KVFileInfo
from ._torch import cache_layers, mapped_layers

TOLERANCE = {"float32": 1e-4, "float64": 1e-8, "float16": 5e-3, "bfloat16": 2e-2}


@dataclass
class Recomputation:
    """The outcome for one activation: what was checked and how close it came."""

    item_id: str
    positions: int
    max_abs_error: float
    max_rel_error: float
    tolerance: float
    seconds: float
    first_difference: dict[str, Any] | None = None  # layer, position, part (keys|values)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.first_difference is None and self.positions > 0

    def to_dict(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "positions": self.positions,
                "max_abs_error": self.max_abs_error, "max_rel_error": self.max_rel_error,
                "tolerance": self.tolerance, "seconds": round(self.seconds, 4), "ok": self.ok,
                "first_difference": self.first_difference, "detail": self.detail}


@dataclass
class _Comparison:
    max_abs: float = 0.0
    max_rel: float = 0.0
    positions: set = field(default_factory=set)
    first: dict[str, Any] | None = None


def recompute(model: Any, info: KVFileInfo, item_id: str, *, tokens: int | None = None,
              token_ids: list[int] | None = None) -> Recomputation:
    """Prefill ``model`` on the cache's token ids (the first ``tokens`` of them) and compare
    every layer's keys and values with the stored ones.

    ``token_ids`` overrides the header's (used when converting a pickle that recorded none).

    Raises:
        CubepackError: the cache records no token ids to recompute from.
    """
    import torch

    ids = token_ids if token_ids is not None else info.token_ids
    if not ids:
        raise CubepackError(f"Activation {item_id!r} records no token_ids, so it cannot be "
                            "recomputed; pack it from a source that records them.")
    count = len(ids) if tokens is None else max(1, min(tokens, len(ids)))
    tolerance = TOLERANCE.get(info.kv_dtype, 2e-2)
    started = time.perf_counter()
    device = next(model.parameters()).device
    with torch.no_grad():
        output = model.base_model(torch.tensor([ids[:count]], device=device), use_cache=True)
    fresh = cache_layers(output.past_key_values)
    stored = mapped_layers(info)
    comparison = _Comparison()
    for index, (fresh_layer, stored_layer) in enumerate(zip(fresh, stored)):
        _compare_layer(index, fresh_layer, stored_layer, tolerance, comparison)
    seconds = time.perf_counter() - started
    detail = ""
    if len(fresh) != len(stored):
        comparison.first = comparison.first or {"layer": min(len(fresh), len(stored)),
                                                "position": 0, "part": "layers"}
        detail = f"the model has {len(fresh)} layers, the cache {len(stored)}"
    return Recomputation(item_id, len(comparison.positions), comparison.max_abs,
                         comparison.max_rel, tolerance, seconds, comparison.first, detail)


def _compare_layer(index: int, fresh: tuple, stored: tuple, tolerance: float,
                   comparison: _Comparison) -> None:
    """Compare the positions both hold: a sliding layer keeps only its last positions, a
    prefix check covers only the first N."""
    import torch

    _, fresh_total, fresh_keys, fresh_values = fresh
    _, stored_total, stored_keys, stored_values = stored
    fresh_start = fresh_total - fresh_keys.shape[-2]
    stored_start = stored_total - stored_keys.shape[-2]
    start, end = max(fresh_start, stored_start), min(fresh_total, stored_total)
    if end <= start:
        return
    for part, new, old in (("keys", fresh_keys, stored_keys), ("values", fresh_values,
                                                               stored_values)):
        new = new[..., start - fresh_start:end - fresh_start, :].float()
        old = old[..., start - stored_start:end - stored_start, :].to(new.device).float()
        if new.shape != old.shape:
            comparison.first = comparison.first or {"layer": index, "position": start,
                                                    "part": f"{part} shape"}
            continue
        error = (new - old).abs()
        scale = max(new.abs().max().item(), 1e-12)
        worst = error.max().item() if error.numel() else 0.0
        comparison.max_abs = max(comparison.max_abs, worst)
        comparison.max_rel = max(comparison.max_rel, worst / scale)
        comparison.positions.update(range(start, end))
        if worst / scale > tolerance and comparison.first is None:
            bad = (error > tolerance * scale).flatten(0, 1).any(0).any(-1)  # per position
            offset = int(torch.nonzero(bad)[0])
            comparison.first = {"layer": index, "position": start + offset, "part": part}


def describe(result: Recomputation) -> str:
    if result.ok:
        return (f"recomputed {result.positions} positions: max abs error "
                f"{result.max_abs_error:.3g}, max relative {result.max_rel_error:.3g} "
                f"(tolerance {result.tolerance:g})")
    where = result.first_difference or {}
    return (f"differs from the model's own prefill at layer {where.get('layer')}, position "
            f"{where.get('position')} ({where.get('part')}): max relative error "
            f"{result.max_rel_error:.3g} > tolerance {result.tolerance:g}"
            + (f"; {result.detail}" if result.detail else ""))


def load_for_recompute(model: Any, pin: dict[str, Any]) -> Any:
    """A loaded model to recompute with: ``model`` itself when loaded, else loaded from the
    folder or Hub id given (or the pinned revision in the HF cache), in the pinned dtype."""
    if model is not None and not isinstance(model, (str, Path)):
        return model
    identity = pin.get("identity") or {}
    if model is not None:
        folder, _, _ = resolve_model_folder(str(model))
    elif pin.get("repo_id") and pin.get("revision"):
        folder, _, _ = resolve_model_folder(pin["repo_id"], pin["revision"], local_files_only=True)
    elif pin.get("name") and Path(pin["name"]).expanduser().is_dir():
        folder = Path(pin["name"]).expanduser()  # pinned by weights digest: the folder it named
        if identity and compare(ModelIdentity.from_dict(identity),
                                fingerprint(folder, dtype=identity.get("dtype"))):
            raise CubepackError(f"the folder the pin names ({folder}) no longer holds the pinned "
                                "model; pass --model with the producer")
    else:
        raise CubepackError("recomputation needs the producer model: pass --model")
    return load_model(folder, identity.get("dtype"))


def load_model(folder: Path, dtype: str | None) -> Any:
    """A causal LM from ``folder`` for inference, in ``dtype`` when given."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)} if dtype else {}
    return AutoModelForCausalLM.from_pretrained(str(folder), **kwargs).eval()
