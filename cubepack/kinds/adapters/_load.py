"""The adapters kind's load (``cubepack.load_adapter``'s last step, once the cube is
verified): apply a cube's LoRA adapter to a live model, only if the model is the base the
adapter was pinned to.

Order matters: the live model is fingerprinted and compared with the adapter's base pin, and
its parameter shapes with the adapter's, and only then is peft imported. PEFT reads a private
copy of the bytes this process just hashed against the lock, so a file changed after the check
is never the one applied.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..._util import constants
from ..._util.paths import resolve_inside
from ..._util.quiet import quiet_libraries
from ..._util.safetensors_header import read_header
from ...errors import (
    CubepackError,
    IdentityMismatch,
    IntegrityError,
    Mismatch,
    UnsupportedError,
    UsageError,
)
from ...format.sections import Adapter, Lock
from ...identity._fingerprint import fingerprint
from . import _lora as adapters_mod


def apply(model: Any, cube_dir: Path, lock: Lock, name: str | None,
           adapter_name: str, private: Path, where: str) -> Any:
    """Check ``model`` against the adapter's base pin, then let PEFT apply the adapter from a
    private copy (in ``private``) of the bytes just checked against ``lock``."""
    adapters = lock.adapters
    if name is None and len(adapters) == 1:
        name = next(iter(adapters))
    if name not in adapters:
        raise UsageError(f"{where} holds no adapter {name!r}; its adapters: "
                         f"{sorted(adapters) or 'none'}. Pass one of them as name.")
    entry = adapters[name]
    _refuse_peft_layers(name, model)
    adapters_mod.check_live_base(name, entry, lock.models[entry.model_role],
                                 fingerprint(model), adapters_mod.model_shapes(model))
    for locator, filename in ((entry.config, constants.ADAPTER_CONFIG),
                              (entry.weights, constants.ADAPTER_WEIGHTS)):
        data = resolve_inside(cube_dir, locator.path).read_bytes()
        expected = locator.sha256
        if hashlib.sha256(data).hexdigest() != expected:
            raise IntegrityError(f"{locator.path} changed after it was verified (its sha256 is "
                                 f"no longer {expected}); refusing to apply it.")
        if filename == constants.ADAPTER_CONFIG:  # patterns resolved by the bounded matcher
            data = json.dumps(adapters_mod.literal_config(
                json.loads(data), adapters_mod.model_shapes(model))).encode()
        (private / filename).write_bytes(data)
    from peft import PeftModel

    had_config = hasattr(model, "peft_config")
    try:
        with quiet_libraries():
            applied = PeftModel.from_pretrained(model, str(private), adapter_name=adapter_name,
                                                is_trainable=False)
        _check_all_loaded(name, entry, applied, adapter_name,
                          private / constants.ADAPTER_WEIGHTS)
    except CubepackError:
        _restore(model, had_config)  # PEFT injects into the caller's model in place
        raise
    except Exception as exc:
        _restore(model, had_config)
        raise UnsupportedError(f"PEFT could not apply adapter {name!r} ({entry.path}/) "
                               f"to this model: {type(exc).__name__}: {exc}") from exc
    return applied


def _refuse_peft_layers(name: str, model: Any) -> None:
    """A model already holding PEFT layers (a PeftModel, injected or merged-in adapters) is
    not the pinned base: its outputs carry another adapter's deltas. Checked by class, so
    peft is not imported."""
    found = [(module_name or "(the model)", type(module).__qualname__)
             for module_name, module in model.named_modules()
             if type(module).__module__.split(".")[0] == "peft"]
    if found:
        raise IdentityMismatch(
            f"Adapter {name!r} applies to its bare base model; the model given", [
                Mismatch(f"module {module_name}", "a base-model module", f"PEFT's {kind}")
                for module_name, kind in found[:5]],
            "Pass the base without adapters (load it again, or PeftModel.unload() it).",
            finding="holds PEFT layers already")


def _check_all_loaded(name: str, entry: Adapter, applied: Any, adapter_name: str,
                      weights: Path) -> None:
    """Every adapter tensor PEFT built came from the file, and every tensor of the file was
    used: PEFT initialises afresh (randomly, with init_lora_weights false) whatever the file
    lacks, e.g. modules ``all-linear`` or ``layers_to_transform`` select without tensors."""
    from peft.utils import get_peft_model_state_dict

    built = set(get_peft_model_state_dict(applied, adapter_name=adapter_name,
                                          save_embedding_layers=False))  # refused at pack
    saved = set(read_header(weights).tensors)
    problems = [Mismatch(f"tensor {key}", "in the adapter's file", "initialised afresh by PEFT")
                for key in sorted(built - saved)]
    problems += [Mismatch(f"tensor {key}", "a tensor PEFT loads", "ignored by PEFT")
                 for key in sorted(saved - built)]
    if problems:
        raise IdentityMismatch(
            f"Adapter {name!r} ({entry.path}/)", problems,
            "Save the adapter with PEFT's save_pretrained from the model it was trained in "
            "(target_modules naming exactly the adapted modules).",
            finding="does not hold what its config makes PEFT build on this base")


def _restore(model: Any, had_config: bool) -> None:
    """Undo PEFT's in-place injection: each PEFT layer back to the base layer it wraps."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module_name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer) and module_name:
            parent_name, _, child = module_name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, module.get_base_layer())
    if not had_config and hasattr(model, "peft_config"):
        del model.peft_config
