"""Compute a :class:`~cubepack.identity.ModelIdentity` from a loaded model, a folder or a Hub id.

Folder and Hub-id fingerprints read only JSON and file bytes (no torch import), so ``cubepack
fingerprint`` and ``cubepack verify`` stay fast. A loaded model is fingerprinted from the files it
was loaded from (its ``name_or_path``), the config it was loaded with (load-time overrides
count) and the dtype it runs in; a model with no files behind it gets a digest of its state
dict, marked ``state-dict-sha256:``.

Weights are hashed, never trusted by name: a Hub-cache blob's file name is its sha256 only once
cubepack has hashed it and found so. File digests are remembered by (device, inode, size,
mtime_ns, ctime_ns), which a user cannot set back, so re-fingerprinting costs a ``stat``.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import logging
import os
import re
import weakref
from collections import Counter
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from .._util import atomic, canonical, constants
from .._util.canonical import digest_of_file_hashes
from .._util.hashing import HashCache, hash_files, shared_cache
from .._util.paths import names_a_path
from .._util.quiet import terminal_bars
from .._util.revision import is_commit
from .._util.safetensors_header import Header, read_header
from ..errors import (
    CubepackError,
    FormatError,
    HubError,
    IntegrityError,
    ModelNotFoundError,
    UsageError,
)
from ._config_fields import (
    compute_config,
    config_digest,
    geometry_from_config,
    quantization_from_config,
)
from ._identity import ABSENT, ModelIdentity, dtype_name
from ._tokenizer_fields import (
    SLOW_TOKENIZER_FILES,
    prompt_format_from_folder,
    prompt_format_from_object,
    tokenizer_digest_from_json,
    tokenizer_digest_from_object,
)

__all__ = [
    "compute_config",
    "digest_of_file_hashes",
    "fingerprint",
    "geometry_from_config",
    "hub_origin",
    "resolve_model_folder",
    "select_weight_names",
    "tokenizer_digest_from_json",
]

logger = logging.getLogger("cubepack")

#: An LFS blob in the HF cache is named by its sha256 (regular files by their git sha1).
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.ckpt", "*.h5",
                    "*.msgpack")
_ADAPTER_PREFIX = "adapter_model"


@terminal_bars
def fingerprint(model_or_path: Any, *, revision: str | None = None, tokenizer: Any = None,
                dtype: str | None = None, local_files_only: bool = False) -> ModelIdentity:
    """Fingerprint a model.

    Args:
        model_or_path: a loaded ``PreTrainedModel``, a local model folder, or a Hub model id
            (resolved through the HF cache; works offline when the revision is cached).
        revision: for a Hub id, the branch, tag or commit to resolve (default ``main``).
        tokenizer: a tokenizer object to fingerprint instead of the model folder's
            ``tokenizer.json`` (for models whose folder holds no tokenizer).
        dtype: for a folder or Hub id, the dtype the model will run in, when it is not the
            stored dtype (e.g. ``"bfloat16"`` for an fp32 checkpoint loaded in bf16).

    Returns:
        The model's :class:`ModelIdentity`.

    Raises:
        ModelNotFoundError: the folder or Hub id cannot be found (offline: not in the cache).
        FormatError: the folder has no readable ``config.json``.

    Example:
        ```python
        identity = cubepack.fingerprint("org/model-a", revision="main")
        print(identity.revision, identity.weights_digest)
        ```
    """
    if isinstance(model_or_path, (str, os.PathLike)):
        folder, model_id, resolved_revision = resolve_model_folder(
            str(model_or_path), revision, local_files_only=local_files_only)
        if revision is not None and revision != resolved_revision and (
                resolved_revision is None or is_commit(revision)):
            raise UsageError(  # never a revision silently ignored: a folder is what it holds
                f"--revision {revision} picks a revision of a Hub model id, but {model_or_path} "
                "is a local folder" + (f" holding commit {resolved_revision}" if resolved_revision
                                       else " (not from the HF cache: it has no revision)")
                + ". Name the model by its Hub id to pin that revision, or drop --revision.")
        return _fingerprint_folder(folder, model_id=model_id, revision=resolved_revision,
                                   tokenizer=tokenizer, dtype=dtype)
    if hasattr(model_or_path, "config") and hasattr(model_or_path, "state_dict"):
        return _fingerprint_loaded(model_or_path, tokenizer=tokenizer)
    raise CubepackError(
        f"Cannot fingerprint a {type(model_or_path).__name__}: pass a transformers model, a model "
        "folder or a Hub model id."
    )


# --- resolving where a model's files are -------------------------------------------------------

def resolve_model_folder(name: str, revision: str | None = None, *,
                         local_files_only: bool = False) -> tuple[Path, str | None, str | None]:
    """Return (folder, hub model id or None, 40-hex commit or None) for a folder or Hub id.

    A Hub id is resolved through the HF cache (``snapshot_download``, which honours
    ``HF_HUB_OFFLINE`` and ``HF_ENDPOINT``); ``local_files_only`` never touches the network.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        model_id, commit = hub_origin(path)
        return path, model_id, commit
    # Not a folder: say so in every refusal below, since the name may have meant one (a typo,
    # another working directory) as well as a Hub model.
    no_folder = f"there is no folder {name} here ({path.absolute()})"
    if names_a_path(name):  # not a folder, yet no Hub id either
        raise ModelNotFoundError(f"Model {name} is neither a folder ({no_folder}) nor a Hub "
                                 "model id (name or owner/name). Pass a model folder that "
                                 "exists, or a Hub id.")
    from huggingface_hub import constants as hub_constants
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    # HF_HUB_OFFLINE is read by huggingface_hub once, at import; we honour it when set later too.
    local_files_only = local_files_only or constants.hub_offline()
    endpoint = hub_constants.ENDPOINT
    try:
        folder = Path(snapshot_download(name, revision=revision, repo_type="model",
                                        local_files_only=local_files_only))
    except HFValidationError as exc:
        raise ModelNotFoundError(f"Model {name} is neither a folder ({no_folder}) nor a Hub "
                                 "model id (name or owner/name: letters, digits, '-', '_', "
                                 "'.'). Pass a model folder that exists, or a Hub id.") from exc
    except RevisionNotFoundError as exc:
        raise ModelNotFoundError(f"Model {name} has no revision {revision!r}.") from exc
    except RepositoryNotFoundError as exc:
        raise ModelNotFoundError(
            f"Model {name} is neither a folder ({no_folder}) nor a model on the Hub at "
            f"{endpoint} (or it is private: set HF_TOKEN). Pass a model folder that exists, or "
            "a Hub id that endpoint has (HF_ENDPOINT names another).") from exc
    except LocalEntryNotFoundError as exc:
        if not local_files_only:  # online, but the endpoint could not be reached
            raise HubError(f"Model {name} is not a folder ({no_folder}), and as a Hub model it "
                           f"could not be fetched from {endpoint} ({exc.__cause__ or exc}) and "
                           "is not in the Hugging Face cache; check HF_ENDPOINT and the "
                           "connection, or pass a model folder.") from exc
        raise ModelNotFoundError(
            f"Model {name} is not a folder ({no_folder}), and as a Hub model at revision "
            f"{revision or 'main'} it is not in the Hugging Face cache and the Hub cannot be "
            "reached (offline: HF_HUB_OFFLINE); download it once online, or pass a model "
            "folder.") from exc
    except (HfHubHTTPError, OSError) as exc:
        problem = atomic.cache_problem(exc) if isinstance(exc, OSError) else None
        if problem is not None:  # the HF cache cannot be written: the setting that moves it
            raise problem from exc
        raise HubError(f"Cannot resolve model {name} (not a folder: {no_folder}): "
                       f"{exc}") from exc
    model_id, commit = hub_origin(folder)
    return folder, model_id or name, commit


def hub_origin(folder: Path) -> tuple[str | None, str | None]:
    """(repo id, commit) when ``folder`` is a snapshot in the HF cache, else (None, None).

    The cache layout is ``<cache>/models--org--name/snapshots/<commit>/``; the commit is the only
    revision evidence transformers 5 leaves behind.
    """
    parts = Path(os.path.abspath(folder)).parts
    for index in range(len(parts) - 2, 0, -1):
        if parts[index] == "snapshots" and is_commit(parts[index + 1]):
            repo_dir = parts[index - 1]
            kind, _, rest = repo_dir.partition("--")
            if kind in ("models", "datasets", "spaces") and rest:
                return rest.replace("--", "/"), parts[index + 1]
    return None, None


def select_weight_names(names: list[str]) -> list[str]:
    """Which of a model folder's top-level file names hold its weights (pure).

    safetensors files win when present (transformers prefers them); otherwise pickled
    checkpoints. Adapter files are not base weights and are excluded. Used for local folders
    and for a Hub revision's file list alike, so both give the same weights digest.
    """
    def matching(patterns: tuple[str, ...]) -> list[str]:
        return sorted(name for name in names if "/" not in name
                      and not name.startswith(_ADAPTER_PREFIX)
                      and any(fnmatch.fnmatch(name, pattern) for pattern in patterns))

    return matching(("*.safetensors",)) or matching(_WEIGHT_PATTERNS)


def weight_files(folder: Path) -> list[Path]:
    """The weight files of a local model folder (see :func:`select_weight_names`)."""
    names = [entry.name for entry in folder.iterdir() if entry.is_file()]
    return [folder / name for name in select_weight_names(names)]


def files_digest(folder: Path, files: list[Path], cache: HashCache | None = None) -> str:
    """sha256 over sorted (relative name, file sha256): the weights digest of a folder.

    Every file is hashed (once: later calls find it in the hash cache). A Hub-cache blob whose
    content is not the sha256 its name claims is refused.

    Raises:
        IntegrityError: a corrupt HF-cache blob, naming the file and how to repair it.
    """
    digests = hash_files(files, cache=cache or shared_cache(), description="hashing weights")
    for path in files:
        claimed = blob_name_sha256(path)
        if claimed is not None and digests[path] != claimed:
            raise IntegrityError(_corrupt_blob_message(folder, path, claimed, digests[path]))
    return digest_of_file_hashes([(path.relative_to(folder).as_posix(), digests[path])
                                  for path in files])


def blob_name_sha256(path: Path) -> str | None:
    """The sha256 a Hub-cache symlink's blob name *claims* (LFS blobs are stored under their
    sha256), or None. A claim only: :func:`files_digest` checks it against the content."""
    if not path.is_symlink():
        return None
    target = os.readlink(path)
    name = os.path.basename(target)
    if _SHA256_HEX.fullmatch(name) and os.path.basename(os.path.dirname(target)) == "blobs":
        return name
    return None


def _corrupt_blob_message(folder: Path, path: Path, claimed: str, found: str) -> str:
    repo_id, commit = hub_origin(folder)
    blob = os.path.realpath(path)
    fix = (f"hf download {repo_id} --revision {commit} --force-download" if repo_id
           else "download the model again")
    return (f"The weights file {path.name} of {repo_id or folder} is corrupt in the Hugging Face "
            f"cache: its blob is named sha256 {claimed} but its content hashes to {found} (the "
            f"Hub client checks only sizes). Delete {blob} and {fix}.")


# --- the fields --------------------------------------------------------------------------------

def tokenizer_digest_from_folder(folder: Path) -> str | None:
    tokenizer_json = folder / "tokenizer.json"
    if tokenizer_json.is_file():
        return tokenizer_digest_from_json(tokenizer_json.read_text(encoding="utf-8"))
    files = [folder / name for name in SLOW_TOKENIZER_FILES if (folder / name).is_file()]
    if not files:
        return None
    return files_digest(folder, files)


def stored_dtype(headers: list[Header], config: dict[str, Any]) -> str:
    """The dtype the weights are stored in: the majority float dtype (by bytes) in the weight
    files' safetensors headers, else the config's declared dtype, else float32."""
    counts: Counter[str] = Counter()
    for header in headers:
        for tensor in header.tensors.values():
            if tensor.dtype.startswith(("F", "BF")):
                counts[tensor.dtype_name] += max(1, tensor.end - tensor.begin)
    if counts:
        return counts.most_common(1)[0][0]
    declared = config.get("dtype") or config.get("torch_dtype")
    return dtype_name(declared) if declared else "float32"


#: What a model folder's fingerprint reads besides the weights and ``config.json``: the
#: tokenizer (``tokenizer.json``, else the slow tokenizer's files), the prompt format, the
#: adapter config; and every ``adapter_model*`` file.
FINGERPRINT_FILES = ("tokenizer.json", *SLOW_TOKENIZER_FILES, "tokenizer_config.json",
                     "special_tokens_map.json", "chat_template.jinja", "adapter_config.json")


def fingerprint_inputs(names: list[str]) -> list[str]:
    """Which of a model folder's top-level file names its fingerprint reads, weights aside
    (pure): ``config.json`` first. The slow tokenizer's files only without a ``tokenizer.json``,
    as :func:`tokenizer_digest_from_folder` reads them."""
    present = set(names)
    slow = () if "tokenizer.json" in present else SLOW_TOKENIZER_FILES
    wanted = [name for name in FINGERPRINT_FILES if name in present
              and (name not in SLOW_TOKENIZER_FILES or name in slow)]
    adapters = sorted(name for name in present if "/" not in name
                      and name.startswith(_ADAPTER_PREFIX))
    return [constants.MODEL_CONFIG, *wanted, *adapters]


@functools.lru_cache(maxsize=None)
def _installed_versions(packages: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    versions = []
    for package in packages:
        try:
            versions.append((package, importlib_metadata.version(package)))
        except importlib_metadata.PackageNotFoundError:
            continue
    return tuple(versions)


def installed_versions(*packages: str) -> dict[str, str]:
    """The installed versions of ``packages`` (those installed), read once per process: each
    read parses a package's metadata file (milliseconds, per conversion otherwise)."""
    return dict(_installed_versions(packages))


def library_versions() -> dict[str, str]:
    """Versions of the libraries that shape a cache (informational; read once per process)."""
    return installed_versions("cubepack", "transformers", "torch", "safetensors", "tokenizers")


def adapters_from_folder(folder: Path) -> str | None:
    files = sorted(p for p in folder.glob(_ADAPTER_PREFIX + "*") if p.is_file())
    config = folder / "adapter_config.json"
    if not files:
        return None
    return files_digest(folder, files + ([config] if config.is_file() else []))


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / constants.MODEL_CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise FormatError(f"{folder} is not a model folder: it has no config.json.") from exc
    except ValueError as exc:
        raise FormatError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise FormatError(f"{path} must hold a JSON object.")
    return config


# --- the two kinds of input ----------------------------------------------------------------------

def _fingerprint_folder(folder: Path, *, model_id: str | None, revision: str | None,
                        tokenizer: Any, dtype: str | None) -> ModelIdentity:
    config = _read_config(folder)
    files = weight_files(folder)
    if not files:
        raise ModelNotFoundError(f"{folder} holds no weight files (*.safetensors, *.bin, ...).")
    run_dtype = dtype or stored_dtype([read_header(path) for path in files
                                       if path.suffix == ".safetensors"], config)
    return folder_identity(folder, config, weights_digest=files_digest(folder, files),
                           dtype=run_dtype, model_id=model_id, revision=revision,
                           tokenizer=tokenizer)


def folder_identity(folder: Path, config: dict[str, Any], *, weights_digest: str, dtype: str,
                    model_id: str | None, revision: str | None,
                    tokenizer: Any = None) -> ModelIdentity:
    """A model folder's identity, given its weights digest and run dtype: every other field
    read from the folder's files (:data:`FINGERPRINT_FILES`) and ``config``. The one
    definition for a folder holding its weights and for a Hub revision whose weights are known
    by their LFS sha256 only (:mod:`._hub`)."""
    run_dtype = dtype
    return ModelIdentity(
        weights_digest=weights_digest,
        tokenizer_digest=(tokenizer_digest_from_object(tokenizer) if tokenizer is not None
                          else tokenizer_digest_from_folder(folder)),
        geometry=geometry_from_config(config),
        compute_config=compute_config(config),
        dtype=run_dtype,
        kv_dtype=run_dtype,
        quantization=quantization_from_config(config),
        adapters=adapters_from_folder(folder),
        prompt_format_digest=(prompt_format_from_object(tokenizer) if tokenizer is not None
                              else prompt_format_from_folder(folder)),
        model_id=model_id,
        revision=revision,
        config_digest=config_digest(config),
        versions=library_versions(),
    )


#: Identities of loaded models, reused while the model's dtype, source files (by stat) and
#: adapters are unchanged: a fingerprint per ``load_kv_cache`` would otherwise dominate it.
#: When only the files changed (the folder rewritten under a live model), the identity first
#: taken is kept: the model in memory still holds the weights it was loaded from. So a loaded
#: model's identity is fixed the first time cubepack fingerprints it.
_LOADED_IDENTITIES: weakref.WeakKeyDictionary[Any, tuple[Any, ModelIdentity]] = \
    weakref.WeakKeyDictionary()


def _fingerprint_loaded(model: Any, *, tokenizer: Any) -> ModelIdentity:
    folder = _loaded_from(model)
    files = weight_files(folder) if folder else []
    config = model.config.to_dict()
    live_compute = compute_config(config)
    memo_key = _memo_key(model, folder, files, live_compute) if files and tokenizer is None \
        else None
    if memo_key is not None:
        remembered = _LOADED_IDENTITIES.get(model)
        if remembered is not None and remembered[0] == memo_key:
            return remembered[1]
        if remembered is not None and remembered[0][:3] == memo_key[:3]:
            # Only the files changed (rewritten, new inodes) since cubepack first fingerprinted
            # this loaded model: its weights in memory are still those it was loaded from, so
            # its identity is the one taken then, never the new files'.
            _warn_files_changed(model, folder)
            return remembered[1]
    run_dtype = dtype_name(model.dtype)
    model_id, revision = hub_origin(folder) if folder else (None, None)
    weights = files_digest(folder, files) if files else state_dict_digest(model)
    if tokenizer is not None:
        tokenizer_digest = tokenizer_digest_from_object(tokenizer)
        prompt_format = prompt_format_from_object(tokenizer)
    else:
        tokenizer_digest = tokenizer_digest_from_folder(folder) if folder else None
        prompt_format = prompt_format_from_folder(folder) if folder else None
    name = getattr(model, "name_or_path", None) or None
    identity = ModelIdentity(
        weights_digest=weights,
        tokenizer_digest=tokenizer_digest,
        geometry=geometry_from_config(config),
        compute_config=_loaded_compute_config(model, folder, live_compute),
        prompt_format_digest=prompt_format,
        dtype=run_dtype,
        kv_dtype=run_dtype,
        quantization=quantization_from_config(config),
        adapters=_loaded_adapters(model) or (adapters_from_folder(folder) if folder else None),
        model_id=model_id or (name if name and not names_a_path(name) else None),
        revision=revision,
        config_digest=config_digest(config),
        versions=library_versions(),
    )
    if memo_key is not None:
        _LOADED_IDENTITIES[model] = (memo_key, identity)
    return identity


def _loaded_compute_config(model: Any, folder: Path | None,
                           live: dict[str, Any]) -> dict[str, Any]:
    """The compute config of a loaded model: its folder's, plus whatever the loaded config
    changed (``from_pretrained(..., rope_scaling=...)`` or an edit in memory).

    A loaded config holds every attribute with its class default, while ``config.json`` may
    omit defaults; comparing the loaded config with the config its own class builds from that
    file isolates the load-time changes, so an unchanged load fingerprints exactly like the
    folder does.
    """
    if folder is None or not (folder / constants.MODEL_CONFIG).is_file():
        return live
    on_disk = _read_config(folder)
    try:
        implied = compute_config(type(model.config).from_dict(on_disk).to_dict())
    except Exception:  # noqa: BLE001 - a config its own class cannot rebuild: use the live one
        return live
    result = compute_config(on_disk)
    for key in set(live) | set(implied):
        if live.get(key, ABSENT) != implied.get(key, ABSENT):
            if key in live:
                result[key] = live[key]
            else:
                result.pop(key, None)
    return result


_WARNED_CHANGED: weakref.WeakSet[Any] = weakref.WeakSet()


def _warn_files_changed(model: Any, folder: Path) -> None:
    try:
        if model in _WARNED_CHANGED:
            return
        _WARNED_CHANGED.add(model)
    except TypeError:
        pass
    logger.warning("cubepack: the files of %s changed after this loaded model was first "
                   "fingerprinted; it keeps the identity of the weights it holds (those files "
                   "as first seen). Reload the model to use the new files.", folder)


def _memo_key(model: Any, folder: Path, files: list[Path],
              live_compute: dict[str, Any]) -> tuple | None:
    if getattr(model, "_hf_peft_config_loaded", False):
        return None  # adapters can be switched in place; always recompute
    watched = files + [p for p in (folder / "tokenizer.json", folder / constants.MODEL_CONFIG,
                                   folder / "tokenizer_config.json",
                                   folder / "chat_template.jinja") if p.exists()]
    return (str(model.dtype), str(folder), canonical.digest(live_compute),
            tuple(HashCache.key(p) for p in watched))


def _loaded_from(model: Any) -> Path | None:
    """The folder a loaded model's weights came from, or None for a model built in memory."""
    name = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", "")
    if not name:
        return None
    path = Path(name)
    if path.is_dir():
        return path
    commit = getattr(model.config, "_commit_hash", None)
    try:
        folder, _, _ = resolve_model_folder(name, commit) if not commit else _cached_snapshot(name, commit)
    except CubepackError:
        return None
    return folder


def _cached_snapshot(name: str, commit: str) -> tuple[Path, str, str]:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, revision=commit, local_files_only=True)), name, commit
    except Exception as exc:  # any cache miss means "no files we can vouch for"
        raise ModelNotFoundError(f"{name}@{commit} is not in the HF cache.") from exc


def state_dict_digest(model: Any) -> str:
    """Digest of a model's tensors (name, dtype, shape, bytes) for models with no files."""
    import torch

    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            flat = tensor.detach().to("cpu").contiguous().reshape(-1)
            digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}|".encode())
            digest.update(memoryview(flat.view(torch.uint8).numpy()))
    return "state-dict-sha256:" + digest.hexdigest()


def _loaded_adapters(model: Any) -> str | None:
    if not getattr(model, "_hf_peft_config_loaded", False):
        return None
    import torch

    configs = {name: {key: sorted(value) if isinstance(value, (set, frozenset)) else value
                      for key, value in cfg.to_dict().items()}  # PEFT keeps target_modules a set
               for name, cfg in getattr(model, "peft_config", {}).items()}
    digest = hashlib.sha256(canonical.dumps(configs, compact=True).encode())
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            if "lora_" in name:
                flat = tensor.detach().to("cpu").contiguous().reshape(-1)
                digest.update(name.encode())
                digest.update(memoryview(flat.view(torch.uint8).numpy()))
    return "sha256:" + digest.hexdigest()
