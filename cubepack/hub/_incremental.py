"""How a push lands a cube in commits (issue #40, item 3): only what differs from the remote at
its parent, in several commits when it is more than :data:`COMMIT_FILES` files, the lock last,
and never over a cube another push landed meanwhile.

- **Several commits.** Files new to the repo (new shards, their indexes) go first, at most
  :data:`COMMIT_FILES` a commit; the last commit holds everything that replaces or deletes a
  file the remote's lock names, the lock itself and the signing files. Until it lands the
  branch holds the old lock and files it does not list: ``pull`` refuses such a commit (its
  unlisted files), ``cubepack.open`` reads the old cube. No intermediate commit is ever
  presented as the new cube.
- **Races.** Every commit names its parent (``parent_commit``). When another push lands first
  (412), the push looks at the remote again: if the remote's lock is still the one it planned
  against (the other push changed no cube, or only added files no lock lists), it plans again
  and retries; otherwise it stops with :class:`~cubepack.errors.PushConflict` and the remote
  stays as the other push left it (its own early commits held only files no lock lists, and
  the winner's plan deleted them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._util import constants
from ..errors import PushConflict, SignatureError
from ..format import _fileset as fileset
from ._client import lfs_sha256

#: The most files one commit adds or deletes: the Hub's recommendation for commits over HTTP.
COMMIT_FILES = 100
#: Files that always land in the last commit: what presents the cube.
_LAST = frozenset({constants.LOCK_FILENAME, *fileset.SIGNING})


def lock_id(remote: dict[str, Any]) -> str | None:
    """The remote lock's content id (its sha256 when stored by LFS, else its git blob id);
    None when the branch holds no lock."""
    sibling = remote.get(constants.LOCK_FILENAME)
    if sibling is None:
        return None
    return lfs_sha256(sibling) or getattr(sibling, "blob_id", None) or "?"


def commits(additions: list[tuple[str, Path]], deletions: list[str],
            remote: dict[str, Any]) -> list[tuple[list[tuple[str, Path]], list[str]]]:
    """The commits of a push, in order: one when it is at most :data:`COMMIT_FILES` files;
    else files new to the repo in batches of that many, then the last commit (files that
    replace one the remote holds, the lock and the signing files, and the deletions)."""
    if len(additions) + len(deletions) <= COMMIT_FILES:
        return [(additions, deletions)]
    early = [(path, local) for path, local in additions
             if path not in remote and path not in _LAST]
    last = [(path, local) for path, local in additions if path in remote or path in _LAST]
    batches: list[tuple[list[tuple[str, Path]], list[str]]] = [
        (early[at:at + COMMIT_FILES], []) for at in range(0, len(early), COMMIT_FILES)]
    return batches + [(last, deletions)]


def conflict(repo_id: str, branch: str, planned: str | None, found: str | None,
             head: str) -> PushConflict:
    """The error of a push whose branch now holds another cube than the one it planned
    against (another push landed first)."""
    return PushConflict(
        f"{repo_id}@{branch} moved while pushing: another push landed a different cube first "
        f"(now at commit {head}; its lock is {found or 'gone'}, this push planned against "
        f"{planned or 'no lock'}). Nothing of this push is presented as the cube, and the "
        f"remote stays as the other push left it. Pull it (cubepack pull {repo_id}), re-pack "
        "your changes onto it, and push again.")


def refuse_unsigning(repo_id: str, branch: str, remote: dict[str, Any], local: dict[str, str],
                     changes: bool) -> None:
    """A push that would replace a signed cube by an unsigned one is refused (before anything
    is committed) unless asked for (``allow_unsigned``): a changed signed cube is signed again
    (``--sign-key``) or published unsigned on purpose.

    Raises:
        SignatureError: the branch's cube is signed, this one is not.
    """
    signature = constants.SIGNATURE_FILENAME
    if changes and signature in remote and signature not in local:
        what = ("signed over its memories, not its layout (compacted since it was signed: "
                "its attestation is kept, and cubepack.open with trusted keys refuses it)"
                if constants.ATTESTATION_FILENAME in local else "not signed")
        raise SignatureError(
            f"{repo_id}@{branch} holds a signed cube ({signature}) and this cube is {what}: "
            "pushing it would publish the changed cube without a signature over its lock. Sign "
            "it as you push (cubepack push ... --sign-key KEY), or pass --allow-unsigned to "
            "publish it so on purpose. Nothing was pushed.")
