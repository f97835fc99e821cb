"""The adapters kind's phases: each delegates to the module owning its rule."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .._kind import Kind, LoadJob, MigrateJob, PackJob, PackOptions
from . import _load, _memos, _lora, _migrate, _pack, _verify

if TYPE_CHECKING:
    from ...format.sections import Lock
    from ...trust._report import VerifyReport


class Adapters(Kind):
    """LoRA adapters: the ``adapters`` section, stated in ``cubepack.yaml`` too."""

    name: ClassVar[str] = "adapters"
    section: ClassVar[str | None] = "adapters"
    memory: ClassVar[str | None] = "parametric"
    in_config: ClassVar[bool] = True
    serves: ClassVar[str | None] = "load_adapter"
    memos_memory: ClassVar[str | None] = "para_mem"

    def check_memos_config(self, job: LoadJob) -> None:
        # MemOS 2.0.33 applies no adapter: each is checked against the base its config names
        # for the parametric memory (none named, or that memory not asked: not applied).
        if job.lock.adapters and (job.whole or job.memory(self) is not None):
            _memos.check_adapters(job.lock, dict(job.config), job.report, job.policy)

    def counts(self, lock: Lock) -> dict[str, int]:
        return {"adapters": len(lock.adapters)}

    def files(self, lock: Lock) -> set[str]:
        return {locator.path for entry in lock.adapters.values() for locator in entry.locators}

    def refuse(self, cube: Path, files: list[str], options: PackOptions) -> None:
        _pack.refuse(cube, files, options)

    def pin(self, job: PackJob) -> None:
        _pack.pin(job)

    def memories(self, job: PackJob, content: list[str]) -> list[str]:
        return _pack.memories(job, content)

    def entries(self, job: PackJob, staging: Path, digests: dict[str, str],
                pins: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return _pack.entries(job, digests)

    def finish(self, job: PackJob, staging: Path, written: Lock, result: Any) -> None:
        _pack.finish(written, result)

    def check_bytes(self, report: VerifyReport, lock: Lock, intact: set[str]) -> None:
        _verify.check_files(report, lock, intact)

    def model_note(self, role: str) -> str:
        return " (the base this adapter was packed for)" if _lora.is_adapter_role(role) else ""

    def check_base(self, report: VerifyReport, lock: Lock, role: str, base: Any) -> None:
        if _lora.is_adapter_role(role):
            _verify.check_base(report, lock, role, base)

    def rewrites(self, job: MigrateJob) -> set[str]:
        return _migrate.rewrites(job)

    def migrate(self, job: MigrateJob) -> None:
        _migrate.migrate(job)

    def load(self, model: Any, cube: Path, lock: Lock, name: str | None, adapter_name: str,
             private: Path, where: str) -> Any:
        """Check ``model`` against the adapter's base pin, then let PEFT apply the adapter
        from a private copy (in ``private``) of the bytes just verified against ``lock``."""
        return _load.apply(model, cube, lock, name, adapter_name, private, where)
