"""``cubepack migrate``: a new packed cube for a new model and/or embedder, from what the old
cube proves.

The old cube is verified first and never written to. The new one is built in a staging folder
beside ``out`` and renamed into place only once it is packed, so ``out`` either does not change
or holds the whole new cube:

- each activation is re-prefilled by the new model (:mod:`~cubepack.kinds.activations._reprefill`: from its
  stored token ids, or re-tokenised from its source text, which the result says), so its
  provenance is ``recomputed`` by construction;
- every textual memory that holds a vector is re-embedded by the new embedder, in batches, and
  pack records the new vectors and the embedder's probe vectors;
- ``config.json`` names the new model (and embedder);
- adapters cannot be migrated (an adapter is valid only for its base model): with a new model
  they are left out and listed, per adapter, in the result and in the lineage;
- everything else is copied unchanged, then the new cube is locked by ``pack`` with a lineage
  section naming the old cube (see :mod:`~cubepack.trust._lineage`).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from .._util import atomic, canonical, constants
from .._util.paths import resolve_inside
from .._util.quiet import terminal_bars
from ..errors import FormatError, UsageError
from ..format.sections import Lock
from ..identity._fingerprint import fingerprint, hub_origin, resolve_model_folder
from ..kv._format import read_kv_header
from ..kv._recompute import load_model
from ..kv._torch import write_kv_layers
from ..kinds.vectors._embedder import BATCH, embed
from ..kinds import MigrateResult
from ..kinds.activations._reprefill import provenance, reprefill
from ..kinds.vectors._vectors import EMBEDDER_ROLE, memory_vectors, with_vectors
from ..memos_format import _layout as memos_layout
from ..trust import _lineage as lineage
from ..trust._policy import TrustPolicy
from ..trust._signing import check_key
from ._pack import pack
from ._private import is_private
from ._verify import verify

BY = "cubepack migrate"


@terminal_bars
def migrate(cube_dir: str | Path, policy: TrustPolicy | None = None, *, out: str | Path,
            model: Any = None, revision: str | None = None, embedder: str | None = None,
            progress: bool | None = None, sign_key: str | Path | None = None,
            sign_password: str | None = None, **options: Any) -> MigrateResult:
    """Build at ``out`` a packed cube for ``model`` and/or ``embedder`` from the cube at
    ``cube_dir`` (see the module docstring).

    Args:
        out: where the new cube goes: a path that does not exist, or an empty folder.
        model: the new activation producer (folder, Hub id or loaded model).
        revision: branch, tag or commit of a Hub ``model``.
        embedder: the new embedder (a spec, as for ``verify --embedder``).
        progress: a progress bar while re-embedding (default: only on a terminal).
        policy: what the old cube must prove before anything is derived from it (a
            :class:`TrustPolicy`, or its fields as ``options``: ``trusted_keys``,
            ``require_signature``, ``require_lineage``, ``require_provenance``,
            ``strict_models``, ...; its ``model`` is the *old* cube's producer).
        sign_key: sign the new cube (ECDSA P-256/P-384 private key, PEM): its attestation
            states the lineage as derived by this migrate, the only step that can; a later
            ``cubepack sign`` or ``pack --sign-key`` carries it as a claim.

    Raises:
        UsageError: neither ``model`` nor ``embedder``; ``out`` exists and is not an empty
            folder, or lies inside the old cube.
        VerificationFailed: the old cube does not verify.
        RecomputationFailed: an activation the new model's tokenizer cannot reproduce (its ids
            are another tokenizer's and it records no source text to re-tokenise).

    Returns:
        a ``MigrateResult``: the new cube, its parent, its digests, the activations it re-
        prefilled, the vectors it re-embedded, and the lineage it records.

    Example:
        ```python
        result = cubepack.migrate("my-cube", out="my-cube-for-b", model="org/model-b")
        print(result.activations)
        ```
    """
    if model is None and embedder is None:
        raise UsageError("migrate needs a new model, a new embedder or both: pass --model M "
                         "and/or --embedder E.")
    if revision is not None and model is None:
        raise UsageError("--revision picks a revision of --model; pass --model too.")
    policy = TrustPolicy.build(policy, **options)
    policy.require_honoured("migrate")
    cube, target = Path(cube_dir), Path(out)
    _check_target(cube, target)
    if sign_key is not None:
        check_key(sign_key, private=True, password=sign_password)  # fail before any work
    # The whole policy, before anything is written (raises VerificationFailed).
    report = verify(cube, policy, progress=progress)
    lock_bytes = (cube / constants.LOCK_FILENAME).read_bytes()
    lock = report.lock
    if is_private(lock):  # its memories are encrypted: migrate would rebuild ciphertexts
        raise UsageError(f"{cube} is a private cube: migrate its clear source (or a copy "
                         "decrypted with age on a disk you trust), then encrypt the result.")
    config = _memos_config(cube, lock)
    dropped = lineage.adapters_in(lock) if model is not None else {}
    ancestors = lineage.ancestors_document(cube, lock)
    target_model = _TargetModel(model, revision) if model is not None else None

    with atomic.placing(target, elsewhere="pass another --out"):
        created = atomic.missing_parents(target)
        staging = atomic.staging_dir(target, "migrate")
        try:
            rewritten = {constants.ANCESTORS_FILENAME, constants.SIGNATURE_FILENAME}
            rewritten |= {path for paths in dropped.values() for path in paths}
            if target_model is not None:
                rewritten |= {entry.file for entry in lock.activations.values()}
            textual = _vector_files(cube, config, lock) if embedder else []
            rewritten |= set(textual) | ({constants.MEMOS_CONFIG} if config is not None else set())
            # Copied, not linked: the new cube is its user's to edit in place, the old one must not
            # change with it.
            for name in sorted(set(lock.files) - rewritten):
                atomic.copy_file(resolve_inside(cube, name), resolve_inside(staging, name))
            # The old lock too, so pack keeps what a re-pack keeps (a pin it need not move).
            atomic.copy_file(cube / constants.LOCK_FILENAME, staging / constants.LOCK_FILENAME)
            if ancestors is not None:
                atomic.write_text(resolve_inside(staging, constants.ANCESTORS_FILENAME),
                                  canonical.dumps(ancestors))
            reprefilled, proven = {}, {}
            if target_model is not None:
                reprefilled, proven = _reprefill_all(cube, staging, lock, target_model)
            reembedded = sum(_reembed(cube, staging, name, embedder, progress)
                             for name in textual) if embedder else 0
            if config is not None:
                _write_config(staging, config, target_model, embedder)
            section = lineage.build(
                lineage.parent_link(cube, lock, lock_bytes),
                models=_model_changes(lock, target_model),
                embedder=_embedder_change(lock, embedder),
                retokenized=[item for item, done in reprefilled.items() if done["retokenized"]],
                reembedded=reembedded, adapters_dropped=list(dropped))
            packed = pack(staging, model=target_model.source if target_model else None,
                          revision=revision, embedder=embedder, progress=progress,
                          cube_id=lock.cube_id if config is None else None,
                          sign_key=sign_key, sign_password=sign_password,
                          derived={"lineage": section, "provenance": proven})
            atomic.replace_dir(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            atomic.remove_empty(created)
            raise
    return MigrateResult(cube_dir=target, parent_dir=cube, digest=packed.digest,
                         content_digest=packed.content_digest, activations=reprefilled,
                         reembedded=reembedded, adapters_dropped=dropped, lineage=section)


def _check_target(cube: Path, target: Path) -> None:
    """``out`` must be absent or an empty folder, and not the old cube or inside it."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise UsageError(f"{target} exists and is not a folder; give migrate a new path (--out).")
    if target.is_dir() and any(target.iterdir()):
        raise UsageError(f"{target} exists and is not empty; migrate writes a new cube and never "
                         "over files: give a new path or an empty folder (--out).")
    old, new = cube.resolve(), target.resolve()
    if new == old or old in new.parents:
        raise UsageError(f"{target} is inside the cube being migrated, which migrate leaves "
                         "untouched; give a path outside it (--out).")


def _memos_config(cube: Path, lock: Lock) -> dict[str, Any] | None:
    """The old cube's config.json (verified, strict JSON), or None for a cube without one."""
    if constants.MEMOS_CONFIG not in lock.files:
        return None
    config = canonical.loads_strict((cube / constants.MEMOS_CONFIG).read_bytes())
    if not isinstance(config, dict):
        raise FormatError(f"{cube / constants.MEMOS_CONFIG} must hold a JSON object.")
    return config


# --- activations ------------------------------------------------------------------------------

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
        info = read_kv_header(resolve_inside(cube, entry.file))
        done = reprefill(target.live, item_id, token_ids=info.token_ids, metadata=info.metadata,
                         producer=info.producer, identity=target.identity,
                         tokenizer=target.tokenizer)
        label = provenance(done, target.identity, f"{BY} ({target.label})")
        write_kv_layers(done.layers, resolve_inside(staging, entry.file),
                        producer=target.identity, token_ids=done.token_ids,
                        metadata={**info.metadata, "provenance": label})
        reprefilled[item_id] = {"tokens": len(done.token_ids), "retokenized": done.retokenized}
        proven[entry.file] = label  # the file this migrate wrote: what its label is of
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


# --- text memories ----------------------------------------------------------------------------

def _vector_files(cube: Path, config: dict[str, Any] | None, lock: Lock) -> list[str]:
    """The text memories (named by config.json, or MemOS's default name) holding vectors."""
    names = memos_layout.memory_files(config or {}, list(lock.files)).get("textual", [])
    return [name for name in names if memory_vectors(resolve_inside(cube, name))]


def _reembed(cube: Path, staging: Path, name: str, spec: str, progress: bool | None) -> int:
    """Re-embed every memory of the text memory ``name`` that holds a vector, in batches (a
    progress bar on a terminal); write the file with the new vectors into ``staging``."""
    memories = memory_vectors(resolve_inside(cube, name))
    texts = [text for _, text, _ in memories]
    bar = _progress_bar(len(texts), f"re-embedding {name}", progress)
    fresh: list[list[float]] = []
    try:
        for start in range(0, len(texts), BATCH):
            asked = texts[start:start + BATCH]
            batch = embed(spec, asked)
            # Per batch: one too many here and one too few in the next would put every later
            # vector beside the wrong memory.
            if not isinstance(batch, list) or len(batch) != len(asked):
                raise FormatError(f"The embedder {spec} returned "
                                  f"{len(batch) if isinstance(batch, list) else 'no list of'} "
                                  f"vectors for {len(asked)} memories ({name}, memories "
                                  f"{start + 1}-{start + len(asked)}); nothing was written.")
            fresh += [_vector(spec, vector) for vector in batch]
            if bar is not None:
                bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
    dimensions = sorted({len(vector) for vector in fresh})
    if len(dimensions) > 1:
        raise FormatError(f"The embedder {spec} returned vectors of dimensions "
                          f"{', '.join(map(str, dimensions))} for {name}: one store holds one "
                          "dimension; nothing was written.")
    document = with_vectors(resolve_inside(cube, name),
                            {memory_id: vector for (memory_id, _, _), vector
                             in zip(memories, fresh)})
    atomic.write_text(resolve_inside(staging, name),
                      json.dumps(document, ensure_ascii=False, indent=2) + "\n")
    return len(fresh)


def _vector(spec: str, vector: Any) -> list[float]:
    """One embedder answer as floats: a non-empty list of finite numbers (not booleans, not
    strings), else a FormatError."""
    if not (isinstance(vector, list) and vector and all(
            type(x) in (int, float) and math.isfinite(x) for x in vector)):
        raise FormatError(f"The embedder {spec} returned a vector that is not a non-empty list "
                          f"of finite numbers ({str(vector)[:80]}); nothing was written.")
    return [float(x) for x in vector]


def _progress_bar(total: int, description: str, progress: bool | None) -> Any:
    if not (constants.progress_enabled() if progress is None else progress) or not total:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="memory", desc=description, leave=False)


def embedder_label(spec: str) -> str:
    """How the lineage names an embedder: its spec, a Hub-cache snapshot by its Hub id."""
    folder = Path(spec).expanduser()
    if folder.is_dir():
        repo_id, commit = hub_origin(folder)
        return f"{repo_id}@{commit}" if repo_id else spec
    return spec


def _embedder_change(lock: Lock, spec: str | None) -> dict[str, str] | None:
    if spec is None:
        return None
    old = lock.models.get(EMBEDDER_ROLE)
    return {"from": lineage.pin_label(old) if old is not None and old.name else
            "unnamed (config.json names no embedder)", "to": embedder_label(spec)}


# --- config.json --------------------------------------------------------------------------------

def _write_config(staging: Path, config: dict[str, Any], target: _TargetModel | None,
                  embedder: str | None) -> None:
    """config.json naming the new model (by Hub id when it has one) and the new embedder."""
    config = json.loads(json.dumps(config))
    if target is not None:
        _rename(memos_layout.llm_config(config, memos_layout.ACT_ROLE), target.name)
    if embedder is not None:
        inner = memos_layout.llm_config(config, EMBEDDER_ROLE)
        kind, _, rest = embedder.partition(":")
        if kind in ("openai", "ollama") and "#" in rest:
            base, _, name = rest.rpartition("#")
            for key in ("base_url", "api_base"):
                if inner is not None and key in inner:
                    inner[key] = base
        else:
            repo_id, _ = hub_origin(Path(embedder).expanduser())
            name = repo_id or embedder
        _rename(inner, name)
    atomic.write_text(staging / constants.MEMOS_CONFIG,
                      json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _rename(inner: dict[str, Any] | None, name: str) -> None:
    if inner is None:
        return
    key = "model" if "model" in inner and "model_name_or_path" not in inner \
        else "model_name_or_path"
    inner[key] = name
