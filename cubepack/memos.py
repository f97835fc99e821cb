"""The MemOS hook: cubepack's guarantees where MemOS users already load cubes.

- :func:`init_from_remote_repo` pulls a cube at an exact commit and verifies it (never an
  unpinned ``git clone``), points MemOS at the pinned snapshot of each producer model, lets
  MemOS load the non-activation memories, and installs the activations itself from KV files,
  each checked against the model MemOS actually loaded.
- :func:`install` / :func:`uninstall` put the same path under MemOS itself: the class
  attributes ``GeneralMemCube.init_from_remote_repo`` / ``init_from_dir`` (so
  ``MOSCore.register_mem_cube`` is covered), and the leaves: the ``load`` of MemOS's activation
  memories (``KVCacheMemory``, ``VLLMKVCacheMemory``), the only MemOS code that unpickles. So
  every entry point (``GeneralMemCube.load``, ``NaiveMemCube.load``, ``MOSCore.load``, the
  scheduler) verifies a packed folder and reads an unpacked one through the allowlist reader.
- :func:`pack_cube` writes a live ``GeneralMemCube`` straight to a packed cube, no pickle between.

MemOS is imported only inside these functions (it has import-time side effects).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import _atomic
from . import _constants as constants
from . import _memos_layout as memos_layout
from ._canonical import json_safe
from ._memos_activations import (POLICIES, HookReport, check_policy, load_packed,
                                 load_unpacked)
from ._memos_activations import require_provenance as require_provenance_of
from ._memos_embedder import check_text_vectors
from ._revision import is_commit
from .errors import (CubepackError, HubError, SignatureError, UnsafeInputError,
                     UnsupportedError, UsageError)
from .fingerprints import fingerprint
from .hub import parse_repo_spec, pull
from .kvfile import save_kv_cache
from ._recompute import memos_prompt_ids
from .pack import VLLM_REFUSAL, activation_filename, pack
from .verify import verify

__all__ = ["HookReport", "HookSettings", "POLICIES", "init_from_dir", "init_from_remote_repo",
           "install", "installed", "pack_cube", "settings", "uninstall"]

logger = logging.getLogger("cubepack.memos")
DEFAULT_BASE_URL = "https://huggingface.co/datasets"


def init_from_remote_repo(cube_id: str, *, revision: str | None = None,
                          endpoint: str | None = None, repo_type: str = "dataset",
                          memory_types: list[str] | None = None, default_config: Any = None,
                          on_mismatch: str = "error", token: str | None = None,
                          local_dir: str | Path | None = None,
                          trusted_keys: list[Any] | None = None,
                          require_signature: bool = False, strict_models: bool = False,
                          recompute: bool | int | None = None,
                          require_provenance: str | None = None) -> Any:
    """Pull, verify and load a cube as a MemOS ``GeneralMemCube``.

    Args:
        cube_id: ``owner/name`` or ``owner/name@revision``.
        revision: branch, tag or commit (or give it in ``cube_id``).
        endpoint: Hub endpoint (default: ``HF_ENDPOINT`` / huggingface.co).
        repo_type: ``"dataset"`` (MemOS's default) or ``"model"``.
        memory_types: as MemOS's (``text_mem``, ``act_mem``, ``para_mem``, ``pref_mem``).
        default_config: a ``GeneralMemCubeConfig`` merged as MemOS merges it; if it swaps in
            another model, each activation is handled by ``on_mismatch``.
        on_mismatch: ``"error"`` (raise :class:`IdentityMismatch`), ``"drop"`` (skip the item,
            one log line naming it and the fields) or ``"rebuild"`` (re-extract the item from its
            stored source with the live model).
        local_dir: where to place the pulled cube (default: a new temporary folder).
        trusted_keys, require_signature: as for ``cubepack verify`` (signed cubes only).
        strict_models: refuse the cube when a pinned model cannot be checked remotely.
        recompute: prove each cache with the model MemOS loaded (all tokens, or the first N).
        require_provenance: ``"recorded"`` or ``"recomputed"``: refuse weaker activations.

    Raises:
        HubError, VerificationFailed: the cube could not be pulled, or is not what was packed
            (raised before MemOS builds anything).
        IdentityMismatch: a cache does not match the model MemOS loaded (policy ``"error"``).
        RecomputationFailed: the loaded model does not reproduce a cache, or its provenance is
            weaker than required.
    """
    check_policy(on_mismatch)
    repo_id, wanted = parse_repo_spec(cube_id, revision)
    target = Path(local_dir) if local_dir else Path(tempfile.mkdtemp(prefix="cubepack-cube-")) / "cube"
    spec = f"{repo_id}@{wanted}" if wanted else repo_id
    pulled = pull(spec, local_dir=target, endpoint=endpoint, token=token, repo_type=repo_type,
                  trusted_keys=trusted_keys, require_signature=require_signature,
                  strict_models=strict_models)
    cube = _build(pulled.local_dir, pulled.report.lock, memory_types=memory_types,
                  default_config=default_config, on_mismatch=on_mismatch, endpoint=endpoint,
                  token=token, recompute=recompute, require_provenance=require_provenance)
    cube.cubepack.commit_sha = pulled.commit_sha
    return cube


def init_from_dir(cube_dir: str | Path, *, memory_types: list[str] | None = None,
                  default_config: Any = None, on_mismatch: str = "error",
                  endpoint: str | None = None, token: str | None = None,
                  trusted_keys: list[Any] | None = None, require_signature: bool = False,
                  recompute: bool | int | None = None,
                  require_provenance: str | None = None) -> Any:
    """Verify a packed cube folder, then load it as a ``GeneralMemCube`` (see above)."""
    check_policy(on_mismatch)
    report = verify(cube_dir, trusted_keys=trusted_keys, require_signature=require_signature)
    return _build(Path(cube_dir), report.lock, memory_types=memory_types,
                  default_config=default_config, on_mismatch=on_mismatch, endpoint=endpoint,
                  token=token, recompute=recompute, require_provenance=require_provenance)


# --- building the cube -------------------------------------------------------------------------

def _build(cube_dir: Path, lock: dict[str, Any], *, memory_types: list[str] | None,
           default_config: Any, on_mismatch: str, endpoint: str | None, token: str | None,
           recompute: bool | int | None = None, require_provenance: str | None = None) -> Any:
    from memos.configs.mem_cube import GeneralMemCubeConfig
    from memos.mem_cube.general import GeneralMemCube
    from memos.mem_cube.utils import merge_config_with_default

    recorded = GeneralMemCubeConfig.from_json_file(str(cube_dir / "config.json"))
    effective = merge_config_with_default(recorded, default_config) if default_config is not None \
        else recorded
    report = HookReport(cube_dir=cube_dir, verified=True)
    effective = _pin_models(recorded, effective, lock, report, endpoint=endpoint, token=token)
    cube = GeneralMemCube(effective)
    types = memory_types or ["text_mem", "act_mem", "para_mem", "pref_mem"]
    others = [kind for kind in types if kind != "act_mem"]
    if others:
        cube.load(str(cube_dir), others)  # MemOS loads these; act_mem is ours (verified above)
    if "text_mem" in types and cube.text_mem is not None:
        check_text_vectors(cube.text_mem, cube_dir, lock, report, on_mismatch)
    if "act_mem" in types and cube.act_mem is not None:
        load_packed(cube.act_mem, cube_dir, lock, report, on_mismatch, recompute)
    require_provenance_of(lock, report, require_provenance)
    cube.cubepack = report
    return cube


def _pin_models(recorded: Any, effective: Any, lock: dict[str, Any], report: HookReport, *,
                endpoint: str | None, token: str | None) -> Any:
    """Point each producer at its pinned snapshot, when the effective config still names the
    model the cube was packed with. A ``default_config`` that swapped the model keeps its own
    model: the identity check on each activation then applies the mismatch policy."""
    from huggingface_hub import snapshot_download

    recorded_dict = recorded.model_dump(mode="json")
    effective_dict = effective.model_dump(mode="json")
    for role, pin in lock["models"].items():
        original = memos_layout.llm_config(recorded_dict, role)
        current = memos_layout.llm_config(effective_dict, role)
        if current is None or original is None:
            continue
        if current.get("model_name_or_path") != original.get("model_name_or_path"):
            logger.info("cubepack: default_config replaces the %s model %s with %s", role,
                        original.get("model_name_or_path"), current.get("model_name_or_path"))
            continue
        if pin.get("repo_id") and pin.get("revision"):
            try:
                folder = snapshot_download(pin["repo_id"], revision=pin["revision"],
                                           endpoint=endpoint, token=token)
            except Exception as exc:  # noqa: BLE001 - any failure: the pin cannot be honoured
                if not pin.get("strict"):
                    # Only the activation producer must match bit for bit; a helper model
                    # (extractor, embedder) falls back to its name, and the user is told.
                    logger.warning("cubepack: the pinned %s model %s@%s cannot be downloaded "
                                   "(%s); MemOS will load %s by name", role, pin["repo_id"],
                                   pin["revision"], exc, original.get("model_name_or_path"))
                    continue
                raise CubepackError(f"The pinned {role} model {pin['repo_id']}@{pin['revision']} "
                                    f"cannot be downloaded: {exc}. Use an endpoint that hosts "
                                    f"that commit (and a token that can read it), or put the "
                                    f"commit in the HF cache first.") from exc
            current["model_name_or_path"] = folder
            report.models[role] = folder
    return type(effective).model_validate(effective_dict)


# --- install / uninstall ------------------------------------------------------------------------

@dataclass(frozen=True)
class HookSettings:
    """What the installed hook enforces. A later :func:`install` only tightens it."""

    require_pin: bool = True
    trusted_keys: tuple[str, ...] = ()
    require_signature: bool = False
    on_mismatch: str = "error"

    @property
    def signature_required(self) -> bool:
        return self.require_signature or bool(self.trusted_keys)

    def trust(self) -> dict[str, Any]:
        return {"trusted_keys": list(self.trusted_keys),
                "require_signature": self.require_signature}


_STATE: dict[str, Any] = {"settings": None, "originals": {}}
#: Policies from strictest to most lenient (a later install may only move left).
_STRICTNESS = {"error": 0, "drop": 1, "rebuild": 2}


def _from_environment() -> HookSettings:
    """Settings servers set for the ``memos.plugins`` install: ``CUBEPACK_MEMOS_ON_MISMATCH``,
    ``CUBEPACK_MEMOS_TRUSTED_KEYS`` (paths joined by ``os.pathsep``) and
    ``CUBEPACK_MEMOS_REQUIRE_SIGNATURE=1``."""
    keys = tuple(k for k in os.environ.get("CUBEPACK_MEMOS_TRUSTED_KEYS", "").split(os.pathsep) if k)
    return HookSettings(
        on_mismatch=check_policy(os.environ.get("CUBEPACK_MEMOS_ON_MISMATCH") or "error"),
        trusted_keys=keys, require_signature=constants.env_flag("CUBEPACK_MEMOS_REQUIRE_SIGNATURE"))


def install(require_pin: bool | None = None, *, trusted_keys: list[Any] | None = None,
            require_signature: bool | None = None, on_mismatch: str | None = None) -> HookSettings:
    """Route MemOS's cube loading through cubepack (see the module docstring); return the
    settings now in force.

    The first call sets the settings: the arguments given, else the environment (for servers
    that install through the ``memos.plugins`` entry point), else the defaults
    (``require_pin=True``, no keys, ``on_mismatch="error"``). A later call, such as MemOS's
    plugin discovery running again, only makes them stricter: it can require a pin or a
    signature, add keys when none were set, or move the policy towards ``"error"``, never the
    reverse. Call :func:`uninstall` first to loosen them.
    """
    if on_mismatch is not None:
        check_policy(on_mismatch)
    given = {"require_pin": require_pin, "require_signature": require_signature,
             "on_mismatch": on_mismatch,
             "trusted_keys": tuple(str(k) for k in trusted_keys) if trusted_keys else None}
    current: HookSettings | None = _STATE["settings"]
    if current is None:
        base = _from_environment()
        updated = replace(base, **{k: v for k, v in given.items() if v is not None})
    else:
        updated = replace(
            current,
            require_pin=current.require_pin or bool(require_pin),
            require_signature=current.require_signature or bool(require_signature),
            trusted_keys=current.trusted_keys or given["trusted_keys"] or (),
            on_mismatch=min(current.on_mismatch, on_mismatch or current.on_mismatch,
                            key=_STRICTNESS.__getitem__))
    _STATE["settings"] = updated
    _patch()
    return updated


def settings() -> HookSettings | None:
    """The settings the installed hook enforces, or None when it is not installed."""
    return _STATE["settings"]


def installed() -> bool:
    return _STATE["settings"] is not None


def uninstall() -> None:
    """Restore MemOS's own methods and forget the settings."""
    for (owner, name), original in _STATE["originals"].items():
        setattr(owner, name, original)
    _STATE["originals"].clear()
    _STATE["settings"] = None


def _patch() -> None:
    from memos.mem_cube.general import GeneralMemCube
    from memos.memories.activation.kv import KVCacheMemory
    from memos.memories.activation.vllmkv import VLLMKVCacheMemory

    targets = {(GeneralMemCube, "init_from_remote_repo"): staticmethod(_hooked_remote),
               (GeneralMemCube, "init_from_dir"): staticmethod(_hooked_dir),
               (KVCacheMemory, "load"): _guarded_act_load,
               (VLLMKVCacheMemory, "load"): _guarded_act_load}
    for (owner, name), replacement in targets.items():
        if (owner, name) not in _STATE["originals"]:
            _STATE["originals"][(owner, name)] = owner.__dict__[name]
            setattr(owner, name, replacement)


def _hook_settings() -> HookSettings:
    return _STATE["settings"] or HookSettings()


# --- the hooked entry points --------------------------------------------------------------------

def _remote_kind(base_url: str | None) -> tuple[str, str | None, str]:
    """("hub", endpoint, repo type) for a Hugging Face-style base URL (ending in ``/datasets`` or
    ``/models``, as MemOS builds them), else ("git", base URL, "") for any other remote (git
    hosts, ``file://``, ModelScope), which MemOS clones."""
    base = (base_url or DEFAULT_BASE_URL).rstrip("/")
    for suffix, repo_type in (("/datasets", "dataset"), ("/models", "model")):
        if base.endswith(suffix):
            endpoint = base[: -len(suffix)]
            return "hub", (None if endpoint == "https://huggingface.co" else endpoint), repo_type
    return "git", base, ""


def _hooked_remote(cube_id: str, base_url: str = DEFAULT_BASE_URL,
                   memory_types: list[str] | None = None, default_config: Any = None) -> Any:
    current = _hook_settings()
    kind, where, repo_type = _remote_kind(base_url)
    repo, _, revision = cube_id.partition("@")
    if current.require_pin and not is_commit(revision):
        what = ("a Hub commit (printed by `cubepack push` and `cubepack pull`)" if kind == "hub"
                else "a git commit (`git rev-parse HEAD` in that repository)")
        raise UsageError(
            f"Refusing unpinned cube id {cube_id!r}: a branch or tag can move. Pin it to {what}: "
            f"GeneralMemCube.init_from_remote_repo('{repo}@<40-hex commit>', ...), or call "
            "cubepack.memos.install(require_pin=False) on a fresh install.")
    if kind == "hub":
        return init_from_remote_repo(cube_id, endpoint=where, repo_type=repo_type,
                                     memory_types=memory_types, default_config=default_config,
                                     on_mismatch=current.on_mismatch, **current.trust())
    folder = git_checkout(f"{where}/{repo}", revision or None)
    return _hooked_dir(str(folder), memory_types, default_config)


def git_checkout(url: str, revision: str | None) -> Path:
    """Clone ``url`` into a new temporary folder and check out ``revision`` (a commit; the
    default branch when None), as MemOS's own remotes work, but at the commit asked for."""
    folder = Path(tempfile.mkdtemp(prefix="cubepack-git-")) / "cube"

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], capture_output=True, text=True)
        if done.returncode:
            raise HubError(f"git {args[0]} of {url} failed: "
                           f"{(done.stderr.strip().splitlines() or ['no message'])[-1]}")
        return done.stdout.strip()

    git("clone", "--quiet", "--no-checkout", url, str(folder))
    git("-C", str(folder), "-c", "advice.detachedHead=false", "checkout", "--quiet",
        revision or "HEAD")
    head = git("-C", str(folder), "rev-parse", "HEAD")
    if revision and head != revision:
        raise HubError(f"git checked out {head} for {url}@{revision}; refusing another commit.")
    shutil.rmtree(folder / ".git")  # the cube is the working tree; git's own files are not in it
    return folder


def _hooked_dir(dir: str, memory_types: list[str] | None = None,  # noqa: A002 - MemOS's name
                default_config: Any = None) -> Any:
    current = _hook_settings()
    state = _lock_state(Path(dir))
    if state == "file":
        return init_from_dir(dir, memory_types=memory_types, default_config=default_config,
                             on_mismatch=current.on_mismatch, **current.trust())
    _refuse_unpacked(Path(dir), state, current)
    original = _STATE["originals"][_general_cube(), "init_from_dir"].__func__
    return original(dir, memory_types, default_config)  # the act memory's load is guarded too


def _guarded_act_load(self: Any, dir: str) -> None:  # noqa: A002 - MemOS's name
    """``KVCacheMemory.load`` / ``VLLMKVCacheMemory.load`` under the hook: a folder with a lock
    is verified and its KV files loaded, each checked against the live model; a folder without
    one is read through the allowlist reader. MemOS's ``pickle.load`` is never called."""
    current = _hook_settings()
    folder = Path(dir)
    state = _lock_state(folder)
    report = HookReport(cube_dir=folder)
    if state == "file":
        verified = verify(folder, **current.trust())
        report.verified = True
        if hasattr(self.llm, "model"):  # vLLM memories hold prompts: a packed cube has none
            load_packed(self, folder, verified.lock, report, current.on_mismatch)
    else:
        _refuse_unpacked(folder, state, current)
        load_unpacked(self, folder, report, current.on_mismatch)
    self.cubepack = report


def _lock_state(folder: Path) -> str:
    lock = folder / constants.LOCK_FILENAME
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        return "other"
    return "file" if lock.is_file() else "absent"


def _refuse_unpacked(folder: Path, state: str, current: HookSettings) -> None:
    if state == "other":
        raise UnsafeInputError(f"{folder / constants.LOCK_FILENAME} is not a regular file; "
                               "refusing the cube (a packed cube's lock is a plain file).")
    if current.signature_required:
        raise SignatureError(f"{folder} holds no cubepack.lock, so it cannot carry a trusted "
                             "signature, and the hook requires one; pack and sign it "
                             "(cubepack pack --sign-key) or load it with another install.")


def _general_cube() -> Any:
    from memos.mem_cube.general import GeneralMemCube

    return GeneralMemCube


# --- packing a live cube ------------------------------------------------------------------------

def pack_cube(cube: Any, out_dir: str | Path, *, license: str | None = None,
              pretty_name: str | None = None, recompute: bool = False) -> Any:
    """Write a live ``GeneralMemCube`` to ``out_dir`` as a packed cube, with no pickle between.

    MemOS dumps the other memories; each activation is written as a KV file with the identity of
    the model MemOS loaded (``act_mem.llm.model``) and the token ids MemOS prefilled (rebuilt
    from its source through MemOS's chat-template path, kept when they match the cache's
    length); pins come from that model. When the model was loaded from a Hub snapshot,
    ``config.json`` names the Hub id again, not the local path. With ``recompute``, the model
    proves every cache (provenance ``recomputed``). Atomic: ``out_dir`` appears complete or not
    at all.
    """
    out = Path(out_dir)
    if cube.act_mem is not None and not hasattr(cube.act_mem.llm, "model"):
        raise UnsupportedError(f"This cube's activation memory ({type(cube.act_mem).__name__}) "
                               f"has no local model. {VLLM_REFUSAL}")
    staging = _atomic.staging_dir(out, "pack-cube")
    try:
        dump_dir = staging / "cube"
        dump_dir.mkdir()
        types = [kind for kind in ("text_mem", "para_mem", "pref_mem") if getattr(cube, kind, None)]
        cube.dump(str(dump_dir), memory_types=types)  # config.json + non-activation memories
        model = cube.act_mem.llm.model if cube.act_mem is not None else None
        if model is not None:
            producer = fingerprint(model)
            tokenizer = getattr(cube.act_mem.llm, "tokenizer", None)
            for item_id, item in cube.act_mem.kv_cache_memories.items():
                metadata = {**json_safe(item.metadata or {}), "id": item_id}
                save_kv_cache(item.memory, dump_dir / activation_filename(item_id),
                              producer=producer, metadata=metadata,
                              token_ids=_prompt_ids(tokenizer, metadata, item.memory))
        pack(dump_dir, model=model, license=license, pretty_name=pretty_name,
             recompute=recompute)
        _atomic.replace_dir(dump_dir, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _prompt_ids(tokenizer: Any, metadata: dict[str, Any], cache: Any) -> list[int] | None:
    """The ids MemOS prefilled for this item, when they can be rebuilt and match the cache."""
    if tokenizer is None or metadata.get("source_text") is None:
        return None
    try:
        ids = memos_prompt_ids(tokenizer, metadata["source_text"])
    except Exception:  # noqa: BLE001 - no template, odd source: record no ids rather than guess
        return None
    return ids if len(ids) == cache.get_seq_length() else None

