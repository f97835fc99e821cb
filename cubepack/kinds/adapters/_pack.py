"""What ``pack`` does with a cube's adapters: each adapter's base pinned (a strict role
``adapter.<name>``) and its tensors checked against the base's weight shapes, then the lock's
``adapters`` entries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..._util import constants
from ...errors import UsageError
from ...format.sections import Lock
from ...memos_format._layout import memory_files
from .._kind import PackJob, PackOptions
from . import _lora as adapters_mod

NAME = "adapters"


def refuse(cube: Path, files: list[str], options: PackOptions) -> None:
    """PEFT files outside an adapter's folder, and a base named for adapters the folder does
    not hold, are refused at once, before any model is pinned."""
    names = adapters_mod.adapter_folders(files)  # raises on PEFT files outside parametric/
    if options.adapter_base is not None and not names:
        raise UsageError(f"--adapter-base names a base for LoRA adapters, but {cube} holds none "
                         f"(an adapter is a folder {constants.PARAMETRIC_DIR}/NAME/ with "
                         f"{constants.ADAPTER_CONFIG} and {constants.ADAPTER_WEIGHTS}).")


def pin(job: PackJob) -> None:
    """Each adapter's base pinned, its tensors fitted to the base's shapes."""
    names = adapters_mod.adapter_folders(job.files)
    job.state[NAME] = _pin_adapters(job.cube, names, job.pins, job.earlier,
                                    job.options.adapter_base)


def memories(job: PackJob, content: list[str]) -> list[str]:
    """MemOS's parametric memory files, and the adapters' folders' files."""
    return memory_files(job.config, content).get("parametric", []) + \
        adapters_mod.memory_files(content)


def entries(job: PackJob, digests: dict[str, str]) -> dict[str, Any]:
    """The lock's ``adapters`` section."""
    return {name: adapters_mod.lock_entry(info, digests, shapes, how)
            for name, (info, shapes, how) in sorted(job.state[NAME].items())}


def finish(written: Lock, result: Any) -> None:
    """Each adapter's digest, its base's role and how pack found the base."""
    result.adapters = {name: {"digest": entry.digest, "model_role": entry.model_role,
                              "base_source": entry.base_source,
                              "claimed_base": entry.base_claimed}
                       for name, entry in written.adapters.items()}


def _pin_adapters(cube: Path, names: dict[str, str], pins: dict[str, dict[str, Any]],
                  earlier: Lock | None, adapter_base: Any) -> dict[str, tuple[Any, ...]]:
    """Pin each adapter's base (a strict role ``adapter.<name>`` in ``pins``) and check the
    adapter's tensors against the base's weight shapes; name -> (info, base shapes, how the
    base was found)."""
    fitted = {}
    if isinstance(adapter_base, dict):
        unknown = sorted(set(adapter_base) - set(names))
        if unknown:
            raise UsageError(f"adapter_base names {unknown}, which the cube does not hold "
                             f"(its adapters: {sorted(names) or 'none'}).")
    for name in names:
        info = adapters_mod.read_adapter(cube, name)
        given = adapter_base.get(name) if isinstance(adapter_base, dict) else adapter_base
        role = adapters_mod.role(name)
        remembered = earlier.models.get(role) if earlier is not None else None
        pin, shapes, how = adapters_mod.pin_base(info, given, remembered)
        pins[role] = pin
        fitted[name] = (info, shapes, how)
    return fitted
