"""What ``migrate`` does with a cube's activations: each is re-prefilled by the new model
(:mod:`._reprefill`: from its stored token ids, or re-tokenised from its source text, which
the result says), so its provenance is ``recomputed`` by construction; config.json names the
new model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..._util.paths import resolve_inside
from ...format.sections import Lock
from ...identity._fingerprint import fingerprint, resolve_model_folder
from ...kv._recompute import load_model
from ...kv._torch import write_kv_layers
from ...memos_format import _layout as memos_layout
from ...trust import _lineage as lineage
from ...format.sections import shards as shardformat
from .._kind import MigrateJob
from . import _shards
from ._pack import activation_filename
from ._reprefill import provenance, reprefill

NAME = "activations"
BY = "cubepack migrate"


def rewrites(job: MigrateJob) -> set[str]:
    """With a new model, every KV file is written anew (the model is fingerprinted now,
    before anything is written)."""
    if job.model is None:
        job.state[NAME] = None
        return set()
    job.state[NAME] = _TargetModel(job.model, job.revision)
    # A sharded memory's shard and its index: the new cube's memories are written one a file,
    # then sharded again by pack (the old lock was sharded).
    return {name for entry in job.lock.activations.values()
            for name in ((entry.file,) if entry.checksums is None
                         else (entry.file, shardformat.index_name(entry.file)))}


def migrate(job: MigrateJob) -> None:
    """Re-prefill every activation with the new model; name it in config.json."""
    target = job.state[NAME]
    reprefilled: dict[str, dict[str, Any]] = {}
    if target is not None:
        reprefilled, proven = _reprefill_all(job.cube, job.staging, job.lock, target)
        job.proven.update(proven)
        if job.config is not None:
            memos_layout.rename_model(memos_layout.llm_config(job.config, memos_layout.ACT_ROLE),
                                      target.name)
    job.lineage["models"] = _model_changes(job.lock, target)
    job.lineage["retokenized"] = [item for item, done in reprefilled.items()
                                  if done["retokenized"]]
    job.result["activations"] = reprefilled


class _TargetModel:
    """The new producer: its identity (as pack will pin it), loaded once, its tokenizer when a
    source text must be re-tokenised."""

    def __init__(self, model: Any, revision: str | None):
        self.source = model
        if isinstance(model, (str, Path)):
            self.identity = fingerprint(model, revision=revision)
            self.folder, _, _ = resolve_model_folder(str(model), revision)
            self._live: Any = None
        else:
            self.identity = fingerprint(model)
            self.folder, self._live = Path(str(model.name_or_path)), model
        self._tokenizer: Any = None
        self.name = (f"{self.identity.model_id}" if self.identity.revision else
                     str(model) if isinstance(model, (str, Path)) else
                     str(self.identity.model_id or model.name_or_path))

    @property
    def live(self) -> Any:
        if self._live is None:
            self._live = load_model(self.folder, self.identity.dtype)
        return self._live

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.folder))
        return self._tokenizer

    @property
    def label(self) -> str:
        identity = self.identity
        return f"{identity.model_id}@{identity.revision}" if identity.revision else self.name


def _reprefill_all(cube: Path, staging: Path, lock: Lock, target: _TargetModel
                   ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Re-prefill every activation with the new model into ``staging``; return what each one
    was built from and its ``recomputed`` label."""
    reprefilled, proven = {}, {}
    for item_id, entry in sorted(lock.activations.items()):
        info = _shards.read_header(cube, entry)
        name = entry.file if entry.checksums is None else activation_filename(item_id)
        done = reprefill(target.live, item_id, token_ids=info.token_ids, metadata=info.metadata,
                         producer=info.producer, identity=target.identity,
                         tokenizer=target.tokenizer)
        label = provenance(done, target.identity, f"{BY} ({target.label})")
        write_kv_layers(done.layers, resolve_inside(staging, name),
                        producer=target.identity, token_ids=done.token_ids,
                        metadata={**info.metadata, "provenance": label})
        reprefilled[item_id] = {"tokens": len(done.token_ids), "retokenized": done.retokenized}
        proven[name] = label  # the file this migrate wrote: what its label is of
    return reprefilled, proven


def _model_changes(lock: Lock, target: _TargetModel | None) -> dict[str, Any]:
    if target is None:
        return {}
    old = lock.models.get(memos_layout.ACT_ROLE)
    weights = old.identity.weights_digest if old is not None and old.identity else None
    return {memos_layout.ACT_ROLE: {
        "from": lineage.pin_label(old),
        "to": target.label,
        "from_weights": str(weights or "unpinned"),
        "to_weights": target.identity.weights_digest}}
