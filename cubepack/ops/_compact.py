"""``cubepack compact``: rewrite the shards of a sharded cube whose dead share passes a bound
(issue #40, item 3).

Incremental packs leave the bytes of removed and replaced memories in their shards (dead: no
index points at them) and append new memories in new shards whose id ranges may overlap older
ones. Dead bytes cost storage and every full pull; overlapping ranges cost a reader of one
memory one index a shard whose range holds its id. ``compact`` re-packs the cube with every
shard whose dead share is above the bound (default :data:`DEFAULT_DEAD_SHARE`) and every
shard whose range overlaps another laid out anew, in id order; the other shards stay byte for
byte, so the next push uploads only the rewritten shards. It is a ``pack``: staged, then
swapped in whole (an interrupted compact leaves the cube as it was), the pins kept.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._util import constants
from ..errors import UsageError
from ..format import _lock as lockfile
from ._pack import pack

#: The default bound: a shard is rewritten when more than a quarter of its bytes are dead (a
#: full pull then downloads at most a third more than the live memories of each shard).
DEFAULT_DEAD_SHARE = 0.25


@dataclass
class CompactResult:
    """What ``compact`` did: the shards rewritten (gone) and written, dead bytes before and
    after, and the lock's version after."""

    cube_dir: str
    changed: bool
    bound: float
    removed: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    dead_before: int = 0
    dead_after: int = 0
    lock_version: int = 0
    digest: str = ""
    #: what a signature covers after: "lock" (the whole cube: unchanged, or --sign-key),
    #: "memories" (the attestation kept, which names the memories by digest; the layout is not
    #: signed), or None (unsigned)
    signature: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compact(cube_dir: str | Path, *, above: float = DEFAULT_DEAD_SHARE,
            shard_size: int | None = None, sign_key: str | Path | None = None,
            sign_password: str | None = None, progress: bool | None = None) -> CompactResult:
    """Rewrite the shards of the sharded cube ``cube_dir`` whose dead share (dead bytes / the
    shard's size) is above ``above``, every shard whose id range overlaps another's, and every
    shard past the bound (more than a lone memory larger than it), in place and atomically (a
    ``pack`` of the same memories and pins). The bound: ``shard_size`` (bytes; the cube keeps
    it for later packs), else the one the cube was packed with (``cubepack.yaml``'s ``pack``),
    else the default, 2 GiB.

    Raises:
        UsageError: ``above`` is not a share from 0 to 1, ``shard_size`` not a positive
            number of bytes; the folder holds no lock.
        FormatError: the cube's lock is unreadable.

    Returns:
        a ``CompactResult``; ``changed`` False when no shard passed the bound.

    Example:
        ```python
        result = cubepack.compact("my-cube", above=0.25)
        print(result.removed, result.written)
        ```
    """
    if isinstance(above, bool) or not isinstance(above, (int, float)) or not 0 <= above <= 1:
        raise UsageError(f"compact's bound is a share of a shard's bytes, from 0 to 1, not "
                         f"{above!r}.")
    cube = Path(cube_dir)
    if not (cube / constants.LOCK_FILENAME).is_file():
        raise UsageError(f"{cube} holds no {constants.LOCK_FILENAME}: compact rewrites the "
                         f"shards of a packed cube; pack it first (cubepack pack {cube}).")
    before = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    result = CompactResult(str(cube), False, float(above),
                           dead_before=sum(s.dead for s in before.shards.values()),
                           lock_version=before.version, digest=before.digest)
    if not before.shards and not before.private:  # a private cube's shards are in its
        result.signature = _signature(cube)          # manifest: pack refuses it, naming why
        return result
    pack(cube, cube_id=before.cube_id, compact=float(above), shard_size=shard_size,
         sign_key=sign_key, sign_password=sign_password, progress=progress)
    after = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    old = {path: before.files[path].sha256 for path in before.shards}
    new = {path: after.files[path].sha256 for path in after.shards}
    result.removed = sorted(path for path in old if new.get(path) != old[path])
    result.written = sorted(path for path in new if old.get(path) != new[path])
    result.dead_after = sum(s.dead for s in after.shards.values())
    result.lock_version, result.digest = after.version, after.digest
    result.changed = after.digest != before.digest
    result.signature = _signature(cube)
    return result


def _signature(cube: Path) -> str | None:
    if (cube / constants.SIGNATURE_FILENAME).is_file():
        return "lock"
    return "memories" if (cube / constants.ATTESTATION_FILENAME).is_file() else None
