"""``cubepack migrate``: a new packed cube for a new model and/or embedder, from what the old
cube proves.

The old cube is verified first and never written to. The new one is built in a staging folder
beside ``out`` and renamed into place only once it is packed, so ``out`` either does not change
or holds the whole new cube:

- each memory kind says which files it writes anew (``rewrites``), then writes them for the
  new model or embedder (``migrate``: activations re-prefilled, a text memory's vectors
  re-embedded, adapters left out, each named by config.json and the lineage as it changed);
- everything else is copied unchanged, then the new cube is locked by ``pack`` with a lineage
  section naming the old cube (see :mod:`~cubepack.trust._lineage`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from .._util import atomic, canonical, constants
from .._util.paths import resolve_inside
from .._util.quiet import terminal_bars
from ..errors import FormatError, UsageError
from ..format.sections import Lock
from ..format import _partial as partialformat
from ..kinds import KINDS, MigrateJob, MigrateOptions, MigrateResult
from ..trust import _lineage as lineage
from ..trust._policy import TrustPolicy
from ..trust._signing import check_key
from ._pack import pack
from ._private import is_private
from ._verify import verify


@terminal_bars
def migrate(cube_dir: str | Path, policy: TrustPolicy | None = None,
            options: MigrateOptions | None = None, **fields: Any) -> MigrateResult:
    """Build at ``out`` a packed cube for ``model`` and/or ``embedder`` from the cube at
    ``cube_dir`` (see the module docstring).

    Args:
        policy: what the old cube must prove before anything is derived from it (a
            :class:`TrustPolicy`, or its fields among ``fields``: ``trusted_keys``,
            ``require_signature``, ``require_lineage``, ``require_provenance``,
            ``strict_models``, ...; ``model`` and ``embedder`` are migrate's: the old
            cube's producer is ``policy``'s ``model``).
        options: a ``MigrateOptions``: the settings below.
        fields: the same settings by keyword, set over ``options``, and the policy's fields.

    Options:
        out: where the new cube goes: a path that does not exist, or an empty folder.
        model: the new activation producer (folder, Hub id or loaded model).
        revision: branch, tag or commit of a Hub ``model``.
        embedder: the new embedder (a spec, as for ``verify --embedder``).
        progress: a progress bar while re-embedding (default: only on a terminal).
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
    options, rest = MigrateOptions.take(options, fields)
    options.check()
    policy = TrustPolicy.build(policy, **rest)
    policy.require_honoured("migrate")
    cube, target = Path(cube_dir), Path(options.out)
    partialformat.refuse(cube, "migrate", "rewrites every memory for the new model")
    _check_target(cube, target)
    if options.sign_key is not None:  # fail before any work
        check_key(options.sign_key, private=True, password=options.sign_password)
    # The whole policy, before anything is written (raises VerificationFailed).
    report = verify(cube, policy, progress=options.progress)
    lock_bytes = (cube / constants.LOCK_FILENAME).read_bytes()
    lock = report.lock
    if is_private(lock):  # its memories are encrypted: migrate would rebuild ciphertexts
        raise UsageError(f"{cube} is a private cube: migrate its clear source (or a copy "
                         "decrypted with age on a disk you trust), then encrypt the result.")
    config = _memos_config(cube, lock)
    ancestors = lineage.ancestors_document(cube, lock)
    with atomic.placing(target, elsewhere="pass another --out"):
        created = atomic.missing_parents(target)
        staging = atomic.staging_dir(target, "migrate")
        try:
            job = MigrateJob.of(cube, staging, lock, config, options)
            section = _derive(job, ancestors, lock_bytes)
            packed = pack(staging, options.packing(
                cube_id=lock.cube_id if job.config is None else None,
                derived={"lineage": section, "provenance": job.proven}))
            atomic.replace_dir(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            atomic.remove_empty(created)
            raise
    return MigrateResult(cube_dir=target, parent_dir=cube, digest=packed.digest,
                         content_digest=packed.content_digest, lineage=section, **job.result)


def _derive(job: MigrateJob, ancestors: dict[str, Any] | None,
            lock_bytes: bytes) -> dict[str, Any]:
    """The new cube's files in ``job.staging``: each kind's memories written anew for the new
    model or embedder, everything else copied; return the lineage section it records."""
    cube, staging, lock = job.cube, job.staging, job.lock
    rewritten = {constants.ANCESTORS_FILENAME, constants.SIGNATURE_FILENAME}
    for kind in KINDS:
        rewritten |= kind.rewrites(job)
    if job.config is not None:
        rewritten.add(constants.MEMOS_CONFIG)
    # Copied, not linked: the new cube is its user's to edit in place, the old one must not
    # change with it.
    for name in sorted(set(lock.files) - rewritten):
        atomic.copy_file(resolve_inside(cube, name), resolve_inside(staging, name))
    # The old lock too, so pack keeps what a re-pack keeps (a pin it need not move).
    atomic.copy_file(cube / constants.LOCK_FILENAME, staging / constants.LOCK_FILENAME)
    if ancestors is not None:
        atomic.write_text(resolve_inside(staging, constants.ANCESTORS_FILENAME),
                          canonical.dumps(ancestors))
    for kind in KINDS:
        kind.migrate(job)
    if job.config is not None:  # as the kinds renamed its models
        atomic.write_text(staging / constants.MEMOS_CONFIG,
                          json.dumps(job.config, indent=2, ensure_ascii=False) + "\n")
    return lineage.build(lineage.parent_link(cube, lock, lock_bytes), job.lineage)


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
