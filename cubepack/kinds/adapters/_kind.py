"""The adapters kind's phases."""

from __future__ import annotations

from typing import ClassVar

from .._kind import Kind


class Adapters(Kind):
    """LoRA adapters: the ``adapters`` section, stated in ``cubepack.yaml`` too."""

    name: ClassVar[str] = "adapters"
    section: ClassVar[str | None] = "adapters"
    memory: ClassVar[str | None] = "parametric"
    in_config: ClassVar[bool] = True
    serves: ClassVar[str | None] = "load_adapter"
