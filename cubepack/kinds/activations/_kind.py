"""The activations kind's phases: each delegates to the module owning its rule."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from .._kind import Kind
from . import _verify

if TYPE_CHECKING:
    from ...format.sections import Lock
    from ...trust._policy import TrustPolicy
    from ...trust._report import VerifyReport


class Activations(Kind):
    """KV caches and a vLLM cube's prompts: the ``activations`` section."""

    name: ClassVar[str] = "activations"
    section: ClassVar[str | None] = "activations"
    memory: ClassVar[str | None] = "activation"
    serves: ClassVar[str | None] = "load_kv_cache"

    def check_bytes(self, report: VerifyReport, lock: Lock, intact: set[str]) -> None:
        _verify.check_headers(report, lock, intact)

    def check_proofs(self, report: VerifyReport, lock: Lock, policy: TrustPolicy) -> None:
        _verify.check_proofs(report, lock, policy)

    def established(self, report: VerifyReport) -> frozenset[str]:
        return _verify.established(report)
