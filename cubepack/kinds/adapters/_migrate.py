"""What ``migrate`` does with a cube's adapters: an adapter is valid only for its base model,
so with a new model they are left out, and listed, per adapter, in the result and in the
lineage."""

from __future__ import annotations

from ...trust import _lineage as lineage
from .._kind import MigrateJob

NAME = "adapters"


def rewrites(job: MigrateJob) -> set[str]:
    """With a new model, every adapter's files are left out of the new cube."""
    dropped = lineage.adapters_in(job.lock) if job.model is not None else {}
    job.state[NAME] = dropped
    return {path for paths in dropped.values() for path in paths}


def migrate(job: MigrateJob) -> None:
    """Say which adapters were left out."""
    dropped = job.state[NAME]
    job.lineage["adapters_dropped"] = list(dropped)
    job.result["adapters_dropped"] = dropped
