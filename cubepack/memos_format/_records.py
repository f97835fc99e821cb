"""MemOS's producer records (PR #2302 ``model_identity``, #2305 ``metadata.producer``)
compared with a pinned model. Pure. The provenance labels pack derives from them are the
lock's format (:mod:`cubepack.format._lock`); what backs a label, the evidence module's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import Mismatch
from ..identity._identity import ModelIdentity, dtype_name

__all__ = ["names_agree", "record_conflicts"]

_GEOMETRY_KEYS = (("num_hidden_layers", "num_layers"), ("num_kv_heads", "num_kv_heads"),
                  ("head_dim", "head_dim"))


def names_agree(claimed: str, pinned_name: str | None, pinned: ModelIdentity) -> bool:
    """Does a recorded model name denote the pinned model? Equal names, the pinned Hub id, or
    the same folder."""
    candidates = {name for name in (pinned_name, pinned.model_id) if name}
    if claimed in candidates:
        return True
    return any(Path(claimed).expanduser().resolve() == Path(name).expanduser().resolve()
               for name in candidates if Path(name).expanduser().exists())


def record_conflicts(record: dict[str, Any], pinned: ModelIdentity,
                     pinned_name: str | None) -> list[Mismatch]:
    """Every field of a MemOS producer record (#2302 ``model_identity``, #2305
    ``metadata.producer``) that contradicts the pinned model. Fingerprints MemOS computes from
    ``to_diff_dict()`` and ``to_str()`` change with library versions, so they are not compared;
    names, dtype and shapes are."""
    found = []
    name = record.get("model_name_or_path")
    if isinstance(name, str) and name and not names_agree(name, pinned_name, pinned):
        found.append(Mismatch("record.model_name_or_path", pinned_name or pinned.model_id, name,
                              of_producer=True))
    dtype = record.get("torch_dtype")
    if isinstance(dtype, str) and dtype not in ("auto", "") and dtype_name(dtype) != pinned.dtype:
        found.append(Mismatch("record.torch_dtype", pinned.dtype, dtype_name(dtype),
                              of_producer=True))
    for key, geometry_key in _GEOMETRY_KEYS:
        value = record.get(key)
        expected = pinned.geometry.get(geometry_key)
        if type(value) is int and expected is not None and value != expected:
            found.append(Mismatch(f"record.{key}", expected, value, of_producer=True))
    if "quantization" in record and bool(record["quantization"]) != bool(pinned.quantization):
        found.append(Mismatch("record.quantization", pinned.quantization, record["quantization"],
                              of_producer=True))
    return found
