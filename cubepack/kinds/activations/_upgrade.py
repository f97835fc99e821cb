"""What ``upgrade`` does with KV files written by an older cubepack: KV format 1 (and lock
version 1) did not record a model's compute config, and hashed only the tokenizer's
structure. Such a file cannot be checked against a live model, so it is never loaded;
upgrading re-fingerprints the producer model you name, requires every field format 1 *did*
record to match it (weights, geometry, dtypes, quantization, adapters, and the format-1
tokenizer digest), and only then rewrites the header with the full current identity. The
tensors are copied unchanged. A format-2 file gains its tensors' checksums."""

from __future__ import annotations

from pathlib import Path

from ..._util import constants
from ..._util.paths import resolve_inside
from ...errors import IdentityMismatch, Mismatch
from ...format.sections import Lock
from ...identity._fingerprint import fingerprint, resolve_model_folder
from ...identity._identity import ModelIdentity, compare_keyed
from ...identity._tokenizer_fields import legacy_tokenizer_digest_v1
from ...kv._format import KVFileInfo, check_kv_info, read_kv_header
from ...kv._torch import mapped_layers, write_kv_layers


def upgradable(cube: Path, lock: Lock) -> dict[str, bool]:
    """Every KV file the lock lists, and whether its format is older than the current one (a
    shard holds current files only: none of its memories is outdated)."""
    return {name: read_kv_header(resolve_inside(cube, name)).version
            != constants.KV_FORMAT_VERSION
            for name in sorted(entry.file for entry in lock.activations.values()
                               if entry.checksums is None)}


def upgrade_file(path: Path, model: str | Path, revision: str | None) -> bool:
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
