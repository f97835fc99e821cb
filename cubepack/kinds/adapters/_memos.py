"""The adapters kind's load check under MemOS (``Adapters.load_memos``): each of a packed
cube's LoRA adapters checked against the base MemOS would pair it with.

MemOS 2.0.33's parametric memory (``LoRAMemory``, backend ``lora``) is a placeholder: its
``load`` reads nothing, its ``dump`` writes the 11 bytes ``Placeholder`` to
``parametric_memory.adapter``, and it never builds its ``extractor_llm``. So MemOS applies no
adapter; the model its config names for the parametric memory (``para_mem.config.
extractor_llm``) is the base the cube says the adapter belongs to, and that is what the hook
checks each adapter against (fingerprinted from its files as MemOS's ``HFLLM`` would load it,
``torch_dtype="auto"``: the stored dtype). Applying an adapter to a live model is
:func:`cubepack.load_adapter`'s job, which checks that model.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..._util.checks import Catalogue
from ...errors import CubepackError, IdentityMismatch
from ...format.sections import Lock
from ...identity._fingerprint import fingerprint, resolve_model_folder
from ...trust._policy import TrustPolicy
from . import _lora as adapters_mod

logger = logging.getLogger("cubepack.memos")

#: What the hook reports for an adapter MemOS has no model for.
NOT_APPLIED = ("not applied: MemOS 2.0.33 loads no adapter (its LoRA memory is a placeholder) "
               "and the cube's config gives its parametric memory no model to check it against; "
               "verified against the lock only. Apply it with cubepack.load_adapter(model, "
               "cube_dir, name), which checks the model")


def para_base_name(config: dict[str, Any]) -> str | None:
    """The model a MemOS config (as a dict) names for its LoRA parametric memory, or None."""
    para = config.get("para_mem") if isinstance(config.get("para_mem"), dict) else {}
    if para.get("backend") != "lora":
        return None
    inner = ((para.get("config") or {}).get("extractor_llm") or {}).get("config") or {}
    name = inner.get("model_name_or_path")
    return name if isinstance(name, str) and name else None


def check_adapters(lock: Lock, config: dict[str, Any], report: Any,
                   policy: TrustPolicy) -> None:
    """Check every adapter of a verified cube against the base its MemOS ``config`` names for
    the parametric memory; record the outcome in ``report.adapters``.

    Raises:
        IdentityMismatch: that base is not the adapter's pinned one (policy ``error``, and
            ``rebuild``: an adapter cannot be rebuilt), naming the fields.
        CubepackError: the base cannot be found locally and ``strict_models`` is set.
    """
    named = para_base_name(config)
    for name, entry in sorted(lock.adapters.items()):
        pin = lock.models[entry.model_role]
        if named is None:
            report.adapters[name] = NOT_APPLIED
            continue
        revision = pin.revision if named == pin.repo_id else None
        try:
            folder, _, _ = resolve_model_folder(named, revision, local_files_only=True)
            adapters_mod.check_live_base(name, entry, pin, fingerprint(str(folder)),
                                         adapters_mod.folder_shapes(Path(folder)))
        except IdentityMismatch as exc:
            if policy.mismatch_action() != "drop":
                raise
            logger.warning("cubepack: dropped adapter %s: %s", name, exc)
            report.dropped.setdefault("para_mem", []).append(name)
            report.adapters[name] = f"dropped: {exc}"
            continue
        except CubepackError as exc:
            if policy.asks(Catalogue.MODEL_IDENTITY):
                raise
            report.adapters[name] = (f"not checked: the parametric memory's model {named} is "
                                     f"not available locally ({exc})")
            continue
        report.adapters[name] = (f"checked against {named}, the model the cube's parametric "
                                 "memory names: the adapter's pinned base")
