"""The activations kind's phases: each delegates to the module owning its rule."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ...format.sections.shards import activation_count
from ...kv._load import load_kv_cache
from .._kind import Kind, LoadJob, MigrateJob, PackJob
from . import _memos, _migrate, _on_demand, _pack, _shards, _upgrade, _verify

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
    noun: ClassVar[str | None] = "KV caches"
    memos_memory: ClassVar[str | None] = "act_mem"

    def memos_own(self, lock: Lock) -> bool:
        return True  # MemOS's own load unpickles: a cube's activations are always ours

    def load_memos(self, job: LoadJob) -> tuple[Any, ...]:
        memory = job.memory(self)
        if memory is None:  # still refused by the policy when the whole cube is loaded
            if job.whole:
                _memos.require_provenance(job.lock, job.report,
                                          job.policy.required_provenance())
            return ()
        return _memos.load_memos(memory, job.cube, job.lock, job.report, job.policy,
                                 job.seals, fetch=job.fetch)

    def counts(self, lock: Lock) -> dict[str, int]:
        # A lock as written (its shards' memories counted by its shards' entries, not read).
        return {"activations": activation_count(lock)}

    def files(self, lock: Lock) -> set[str]:
        return {entry.file for entry in lock.activations.values()} | {
            shard.path for shard in lock.shards.values()}

    def refuse(self, cube: Path, files: list[str], options: Any) -> None:
        _shards.refuse(options)

    def pin(self, job: PackJob) -> None:
        _pack.pin(job)
        _shards.carry_labels(job)

    def stage(self, job: PackJob, staging: Path) -> list[str]:
        _shards.unshard(job, staging)
        return _pack.stage(job, staging)

    def prove(self, job: PackJob, staging: Path) -> dict[str, dict[str, Any]]:
        return _pack.prove(job, staging)

    def memories(self, job: PackJob, content: list[str]) -> list[str]:
        return _pack.memories(content) + _shards.shard_files(content)

    def entries(self, job: PackJob, staging: Path, digests: dict[str, str],
                pins: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return _pack.entries(job, staging, digests, pins)

    def store(self, job: PackJob, staging: Path,
              sections: dict[str, Any]) -> dict[str, Any]:
        return _shards.store(job, staging, sections["activations"])

    def settings(self, job: PackJob, sections: dict[str, Any]) -> dict[str, Any]:
        return _shards.settings(job, sections)

    def finish(self, job: PackJob, staging: Path, written: Lock, result: Any) -> None:
        _pack.finish(job, staging, _shards.resolved(written, staging), result)

    def check_bytes(self, report: VerifyReport, lock: Lock, intact: set[str]) -> None:
        _verify.check_headers(report, lock, intact)

    def prove_indexed(self, cube: Path, indexes: list[Any]) -> dict[str, Any]:
        return _shards.prove_shards(cube, indexes)

    def check_proofs(self, report: VerifyReport, lock: Lock, policy: TrustPolicy) -> None:
        _verify.check_proofs(report, lock, policy)

    def established(self, report: VerifyReport) -> frozenset[str]:
        return _verify.established(report)

    def rewrites(self, job: MigrateJob) -> set[str]:
        return _migrate.rewrites(job)

    def migrate(self, job: MigrateJob) -> None:
        _migrate.migrate(job)

    def upgradable(self, cube: Path, lock: Lock) -> dict[str, bool]:
        return _upgrade.upgradable(cube, lock)

    def upgrade(self, path: Path, model: str | Path, revision: str | None) -> bool | None:
        return _upgrade.upgrade_file(path, model, revision)

    def load(self, path: Any, model: Any, plan: Recomputation, *, device: Any = None,
             copy: bool = False, identity: Any = None, data: Any = None,
             item: str | None = None, source: Any = None) -> Any:
        """One KV file into a ``DynamicCache`` for ``model``, refusing any other producer, and
        proved with ``model`` when ``plan`` asks (:func:`cubepack.kv._load.load_kv_cache`);
        ``data``: the file's bytes, decrypted in memory; ``item``: ``path`` is a cube folder,
        and the memory is its item (a shard's range or a whole file, checked against its
        index or lock first: :func:`~cubepack.kinds.activations._shards.open_memory`), read
        through ``source`` when given (a private cube's ranges:
        :func:`~cubepack.kinds.activations._on_demand.read_memory`)."""
        if item is not None and source is not None:
            path, data = _on_demand.read_memory(source, item)
        elif item is not None:
            path, data = _shards.open_memory(Path(path), item)
        return load_kv_cache(path, model, device=device, copy=copy, identity=identity,
                             recompute=plan.asked, sample=plan.sample, seed=plan.seed, data=data)
