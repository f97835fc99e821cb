"""The activations kind's phases: each delegates to the module owning its rule."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ...kv._load import load_kv_cache
from .._kind import Kind, MigrateJob, PackJob
from . import _migrate, _pack, _verify

if TYPE_CHECKING:
    from ...format.sections import Lock
    from ...trust._policy import Recomputation, TrustPolicy
    from ...trust._report import VerifyReport


class Activations(Kind):
    """KV caches and a vLLM cube's prompts: the ``activations`` section."""

    name: ClassVar[str] = "activations"
    section: ClassVar[str | None] = "activations"
    memory: ClassVar[str | None] = "activation"
    serves: ClassVar[str | None] = "load_kv_cache"

    def pin(self, job: PackJob) -> None:
        _pack.pin(job)

    def stage(self, job: PackJob, staging: Path) -> list[str]:
        return _pack.stage(job, staging)

    def prove(self, job: PackJob, staging: Path) -> dict[str, dict[str, Any]]:
        return _pack.prove(job, staging)

    def memories(self, job: PackJob, content: list[str]) -> list[str]:
        return _pack.memories(content)

    def entries(self, job: PackJob, staging: Path, digests: dict[str, str],
                pins: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return _pack.entries(job, staging, digests, pins)

    def finish(self, job: PackJob, staging: Path, written: Lock, result: Any) -> None:
        _pack.finish(job, staging, written, result)

    def check_bytes(self, report: VerifyReport, lock: Lock, intact: set[str]) -> None:
        _verify.check_headers(report, lock, intact)

    def check_proofs(self, report: VerifyReport, lock: Lock, policy: TrustPolicy) -> None:
        _verify.check_proofs(report, lock, policy)

    def established(self, report: VerifyReport) -> frozenset[str]:
        return _verify.established(report)

    def rewrites(self, job: MigrateJob) -> set[str]:
        return _migrate.rewrites(job)

    def migrate(self, job: MigrateJob) -> None:
        _migrate.migrate(job)

    def load(self, path: Any, model: Any, plan: Recomputation, *, device: Any = None,
             copy: bool = False, identity: Any = None, data: Any = None) -> Any:
        """One KV file into a ``DynamicCache`` for ``model``, refusing any other producer, and
        proved with ``model`` when ``plan`` asks (:func:`cubepack.kv._load.load_kv_cache`);
        ``data``: the file's bytes, decrypted in memory."""
        return load_kv_cache(path, model, device=device, copy=copy, identity=identity,
                             recompute=plan.asked, sample=plan.sample, seed=plan.seed, data=data)
