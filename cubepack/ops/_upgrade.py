"""``cubepack upgrade``: bring memory files and cubes written by an older cubepack to the
current formats, proving each against its producer first (each file by the memory kind it
belongs to: ``upgradable``, ``upgrade``; KV files: ``kinds/activations/_upgrade``).

A cube is verified first, as far as its lock version allows, and refused (untouched) if it
fails; the upgrade is staged from the files its lock lists only, each reached without
following a symlink (a folder copy would follow a symlinked folder and link files from
outside into the cube, which a push then uploads). A current cube is left untouched. An
upgraded cube has a new lock, which no signature signed: its ``cubepack.sig`` and attestation
are removed, and the result names them and the command that signs it again.
"""

from __future__ import annotations

import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util import atomic, constants
from .._util.paths import regular_file, resolve_inside
from .._util.quiet import terminal_bars
from ..errors import UsageError
from ..format import _fileset as fileset
from ..format import _partial as partialformat
from ..kinds import KINDS
from ._pack import pack
from ._private import is_private
from ._verify import verify_for_upgrade

__all__ = ["UpgradeResult", "upgrade"]


@dataclass
class UpgradeResult:
    path: Path
    upgraded: list[str] = field(default_factory=list)
    current: list[str] = field(default_factory=list)
    #: the signing files (``cubepack.sig``, the attestation) an upgraded cube no longer holds:
    #: they signed the lock it replaced
    unsigned: list[str] = field(default_factory=list)
    #: the command that signs the upgraded cube again, when ``unsigned`` names any
    sign_again: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "upgraded": self.upgraded, "current": self.current,
                "unsigned": self.unsigned, "sign_again": self.sign_again}


@terminal_bars
def upgrade(path: str | Path, model: str | Path, *, revision: str | None = None,
            shards: bool | None = None, shard_size: int | None = None) -> UpgradeResult:
    """Upgrade a KV file, or every KV file of a cube and then the cube itself (re-packed).

    Args:
        model: the producer (a folder or Hub id, as for ``pack --model``).
        shards: a cube's layout, as for ``pack``: True converts a cube of one file a memory
            to shards, False back (docs/reference/shards.md); None keeps what ``pack``
            decides.
        shard_size: a shard's bound in bytes, as for ``pack`` (implies ``shards``).

    A cube is verified first, as ``verify`` would (a version-1 lock as far as version 1
    allows), and staged from its verified, listed regular files only.

    Raises:
        VerificationFailed: the cube does not verify (edited after packing, unlisted files,
            symlinks...); nothing is changed.
        IdentityMismatch: a file was not produced by ``model`` (naming every field).

    Returns:
        an ``UpgradeResult``: what was upgraded, what was already current, and whether the
        cube must be signed again.

    Example:
        ```python
        result = cubepack.upgrade("my-cube", model="org/model-a")
        print(result.upgraded, result.sign_again)
        ```
    """
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist.")
    if path.is_dir():
        partialformat.refuse(path, "upgrade", "rewrites the cube's files, memories included")
        return _upgrade_cube(path, model, revision, shards, shard_size)
    if shards is not None or shard_size is not None:
        raise UsageError(f"{path} is a file: shards are a cube's layout; upgrade its cube.")
    result = UpgradeResult(path)
    done = next((done for kind in KINDS
                 if (done := kind.upgrade(path, model, revision)) is not None), None)
    if done is None:
        raise UsageError(f"{path} is no file cubepack upgrades; give a KV file or a cube.")
    (result.upgraded if done else result.current).append(path.name)
    return result


def _upgrade_cube(cube: Path, model: str | Path, revision: str | None, shards: bool | None,
                  shard_size: int | None) -> UpgradeResult:
    """Verify first (a cube edited after packing is refused, untouched); stage only the
    verified files the lock lists, each reached without following a symlink; upgrade the
    format-1 KV files there against ``model``; re-pack; swap. A current cube is left as is."""
    lock = verify_for_upgrade(cube).lock
    result = UpgradeResult(cube)
    if is_private(lock):  # its KV files are ciphertexts: their formats cannot even be read
        raise UsageError(f"{cube} is a private cube: upgrade rewrites KV files, and a private "
                         "cube's are ciphertexts, whose plaintext cubepack never writes to a "
                         "file. Upgrade its clear source (cubepack upgrade SOURCE --model "
                         "MODEL), then encrypt it again (cubepack encrypt SOURCE --to ...).")
    held = {name: (kind, outdated) for kind in KINDS
            for name, outdated in kind.upgradable(cube, lock).items()}
    # Current: written by this cubepack (4, or 6 or 7 when sharded), nothing outdated, and
    # laid out as asked (a layout change is a re-pack).
    sharded = bool(lock.shards)
    laid_out = (shards is None or shards == sharded) and (shard_size is None or sharded)
    if lock.version in (constants.LOCK_VERSION, constants.SHARDED_LOCK_VERSION,
                        constants.APPENDED_LOCK_VERSION) and laid_out \
            and not any(old for _, old in held.values()):
        result.current = sorted(held)
        return result
    with atomic.placing(cube, elsewhere="copy the cube to a writable folder and upgrade the copy"):
        staging = atomic.staging_dir(cube, "upgrade")
        try:
            for name in sorted(lock.files):  # not the folder: nothing unlisted, nothing linked
                atomic.link_or_copy(regular_file(cube, name), resolve_inside(staging, name))
            # The lock too, so pack keeps what a re-pack keeps (its lineage, adapter pins); a
            # version-1 lock it cannot read, so the cube id of a bundle without MemOS's
            # config.json is passed as well: without it, the staging folder named no id.
            atomic.link_or_copy(regular_file(cube, constants.LOCK_FILENAME),
                                staging / constants.LOCK_FILENAME)
            for name, (kind, _) in sorted(held.items()):
                upgraded = kind.upgrade(resolve_inside(staging, name), model, revision)
                (result.upgraded if upgraded else result.current).append(name)
            pack(staging, model=str(model), revision=revision,
                 cube_id=None if constants.MEMOS_CONFIG in lock.files else lock.cube_id,
                 shards=shards, shard_size=shard_size)
            # The staging folder holds no signing file (nothing signed its new lock).
            result.unsigned = [name for name in fileset.SIGNING if (cube / name).is_file()]
            atomic.replace_dir(staging, cube)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    if result.unsigned:  # sign takes no --revision: without --model it checks the HF cache's
        result.sign_again = (f"cubepack sign {shlex.quote(str(cube))} --key KEY"  # pinned one
                             + ("" if revision else f" --model {shlex.quote(str(model))}"))
    return result



