"""The vectors kind's phases."""

from __future__ import annotations

from typing import ClassVar

from .._kind import Kind


class Vectors(Kind):
    """A text memory's vectors: recorded on the embedder's pin (the ``models`` section)."""

    name: ClassVar[str] = "vectors"
