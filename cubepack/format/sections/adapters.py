"""The ``adapters`` section (version 3 on): parametric memory, each LoRA adapter by name: its
two files, their digest, the LoRA facts and the strict model role pinning its base."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .files import FileEntry
from .locator import Locator

#: An adapter entry's ``base``: how pack found the base (``source``) and the name the adapter's
#: config claims for it (this key), a claim only.
BASE_CLAIM = "claimed"


@dataclass(frozen=True)
class ModuleFit:
    """What an adapted module is: ``linear`` or ``embedding``, its rank, its [out, in]."""

    kind: str
    rank: int
    shape: tuple[int, int]


@dataclass(frozen=True)
class Adapter:
    """One adapter. ``base_source``: how pack found the base; ``base_claimed``: the name the
    adapter's config claims for it (a claim only). ``rank_pattern``, ``alpha_pattern`` and
    ``use_rslora`` are None in a version-3 lock, which did not record them."""

    name: str
    path: str
    config_file: str
    weights_file: str
    digest: str
    peft_type: str
    rank: int
    lora_alpha: float
    target_modules: str | tuple[str, ...]
    dtype: str
    model_role: str
    modules: Mapping[str, ModuleFit]
    base_source: str
    base_claimed: str | None
    rank_pattern: Mapping[str, int] | None
    alpha_pattern: Mapping[str, float] | None
    use_rslora: bool | None
    config: Locator
    weights: Locator

    @property
    def locators(self) -> tuple[Locator, Locator]:
        return (self.config, self.weights)


def parse(value: dict[str, Any], files: Mapping[str, FileEntry]) -> Mapping[str, Adapter]:
    """The typed section of a validated ``adapters`` value."""
    adapters = {}
    for name, entry in value.items():
        targets = entry["target_modules"]
        adapters[name] = Adapter(
            name=name, path=entry["path"], config_file=entry["config_file"],
            weights_file=entry["weights_file"], digest=entry["digest"],
            peft_type=entry["peft_type"], rank=entry["rank"], lora_alpha=entry["lora_alpha"],
            target_modules=targets if isinstance(targets, str) else tuple(targets),
            dtype=entry["dtype"], model_role=entry["model_role"],
            modules=MappingProxyType({module: ModuleFit(fit["kind"], fit["rank"],
                                                        tuple(fit["shape"]))
                                      for module, fit in entry["modules"].items()}),
            base_source=entry["base"]["source"], base_claimed=entry["base"][BASE_CLAIM],
            rank_pattern=(MappingProxyType(entry["rank_pattern"]) if "rank_pattern" in entry
                          else None),
            alpha_pattern=(MappingProxyType(entry["alpha_pattern"]) if "alpha_pattern" in entry
                           else None),
            use_rslora=entry.get("use_rslora"),
            config=files[entry["config_file"]].locator,
            weights=files[entry["weights_file"]].locator)
    return MappingProxyType(adapters)
