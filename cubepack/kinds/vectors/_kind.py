"""The vectors kind's phases: each delegates to the module owning its rule."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .._kind import Kind, LoadJob, MigrateJob, PackJob
from . import _memos, _migrate, _pack, _verify

if TYPE_CHECKING:
    from ...format.sections import Lock
    from ...trust._policy import TrustPolicy
    from ...trust._report import VerifyReport


class Vectors(Kind):
    """A text memory's vectors: recorded on the embedder's pin (the ``models`` section)."""

    name: ClassVar[str] = "vectors"
    memos_memory: ClassVar[str | None] = "text_mem"

    def load_memos(self, job: LoadJob) -> tuple[Any, ...]:
        memory = job.memory(self)  # MemOS loaded it: its vectors are checked with its embedder
        if memory is not None:
            _memos.check_text_vectors(memory, job.cube, job.lock, job.report, job.policy)
        return ()

    def pin(self, job: PackJob) -> None:
        _pack.pin(job)

    def check_proofs(self, report: VerifyReport, lock: Lock, policy: TrustPolicy) -> None:
        _verify.check_proofs(report, lock, policy)

    def rewrites(self, job: MigrateJob) -> set[str]:
        return _migrate.rewrites(job)

    def migrate(self, job: MigrateJob) -> None:
        _migrate.migrate(job)
