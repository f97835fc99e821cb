"""``cubepack upgrade``: bring KV files and cubes written by an older cubepack to the current
formats, proving each against its producer first.

KV format 1 (and lock version 1) did not record a model's compute config, and hashed only the
tokenizer's structure. Such a file cannot be checked against a live model, so it is never
loaded; upgrading re-fingerprints the producer model you name, requires every field format 1
*did* record to match it (weights, geometry, dtypes, quantization, adapters, and the format-1
tokenizer digest), and only then rewrites the header with the full current identity. The
tensors are copied unchanged.

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
from ..errors import IdentityMismatch, Mismatch, UsageError
from ..format import _fileset as fileset
from ..identity._fingerprint import fingerprint, resolve_model_folder
from ..identity._identity import ModelIdentity, compare_keyed
from ..identity._tokenizer_fields import legacy_tokenizer_digest_v1
from ..kv._format import KVFileInfo, check_kv_info, read_kv_header
from ..kv._torch import mapped_layers, write_kv_layers
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
def upgrade(path: str | Path, model: str | Path, *, revision: str | None = None) -> UpgradeResult:
    """Upgrade a KV file, or every KV file of a cube and then the cube itself (re-packed).

    Args:
        model: the producer (a folder or Hub id, as for ``pack --model``).

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
        return _upgrade_cube(path, model, revision)
    result = UpgradeResult(path)
    (result.upgraded if _upgrade_file(path, model, revision) else result.current).append(path.name)
    return result


def _upgrade_cube(cube: Path, model: str | Path, revision: str | None) -> UpgradeResult:
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
    kv_files = sorted(entry.file for entry in lock.activations.values())
    if lock.version == constants.LOCK_VERSION and all(
            read_kv_header(resolve_inside(cube, name)).version == constants.KV_FORMAT_VERSION
            for name in kv_files):
        result.current = kv_files
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
            for name in kv_files:
                upgraded = _upgrade_file(resolve_inside(staging, name), model, revision)
                (result.upgraded if upgraded else result.current).append(name)
            pack(staging, model=str(model), revision=revision,
                 cube_id=None if constants.MEMOS_CONFIG in lock.files else lock.cube_id)
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


def _upgrade_file(path: Path, model: str | Path, revision: str | None) -> bool:
    info = read_kv_header(path)
    if info.version == constants.KV_FORMAT_VERSION:
        return False
    live = fingerprint(str(model), revision=revision, dtype=info.producer.dtype)
    if info.version >= constants.KV_CHECKABLE_VERSION:
        # Format 2 pins the full identity: the model must be its producer, which is kept as
        # recorded; the rewrite adds the tensors' checksums (of the bytes as they are now).
        check_kv_info(info, live)
        _rewrite(info, info.producer)
        return True
    mismatches = _legacy_mismatches(info.producer, live, str(model), revision)
    if mismatches:
        raise IdentityMismatch(f"KV cache {path.name} (KV format {info.version})", mismatches,
                               "It was not produced by this model; upgrade it with its producer.")
    _rewrite(info, live)
    return True


def _legacy_mismatches(old: ModelIdentity, live: ModelIdentity, model: str,
                       revision: str | None) -> list[Mismatch]:
    """Every field format 1 recorded that the live model contradicts."""
    found = [Mismatch(name, getattr(old, name), getattr(live, name), of_producer=True)
             for name in ("weights_digest", "dtype", "kv_dtype", "quantization", "adapters")
             if getattr(old, name) != getattr(live, name)]
    found += compare_keyed("geometry", old.geometry, live.geometry)
    folder, _, _ = resolve_model_folder(model, revision)
    tokenizer_json = folder / "tokenizer.json"
    legacy = (legacy_tokenizer_digest_v1(tokenizer_json.read_text(encoding="utf-8"))
              if tokenizer_json.is_file() else live.tokenizer_digest)
    if old.tokenizer_digest != legacy:
        found.append(Mismatch("tokenizer_digest", old.tokenizer_digest, legacy, of_producer=True))
    return found


def _rewrite(info: KVFileInfo, live: ModelIdentity) -> None:
    layers = mapped_layers(info, copy=True)  # copied: the file is replaced under the mapping
    write_kv_layers(layers, info.path, producer=live, token_ids=info.token_ids,
                    metadata=info.metadata)
