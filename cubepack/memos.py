"""The MemOS hook: cubepack's guarantees where MemOS users already load cubes.

- :func:`init_from_remote_repo` pulls a cube at an exact commit and verifies it (never
  ``git clone``), points MemOS at the pinned snapshot of each producer model, lets MemOS load the
  non-activation memories, and installs the activations itself from KV files, each checked
  against the model MemOS actually loaded. MemOS's own ``pickle.load`` is never reached.
- :func:`install` / :func:`uninstall` put the same path under ``GeneralMemCube`` itself (class
  attributes, so ``MOSCore.register_mem_cube`` is covered too).
- :func:`pack_cube` writes a live ``GeneralMemCube`` straight to a packed cube, no pickle between.

MemOS is imported only inside these functions (it has import-time side effects).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _atomic
from . import _constants as constants
from . import _memos_layout as memos_layout
from ._canonical import json_safe
from ._revision import is_commit
from .errors import CubepackError, IdentityMismatch
from .fingerprints import fingerprint, hub_origin
from .hub import parse_repo_spec, pull
from .identity import dtype_name
from .kvfile import build_dynamic_cache, check_kv_file, read_kv_header, save_kv_cache
from .pack import activation_filename, pack
from .verify import verify

logger = logging.getLogger("cubepack.memos")
POLICIES = ("error", "drop", "rebuild")
_ORIGINALS: dict[str, Any] = {}


@dataclass
class HookReport:
    """What the hook did for one cube; attached to the cube as ``cube.cubepack``."""

    cube_dir: Path
    commit_sha: str | None = None
    loaded: list[str] = field(default_factory=list)
    dropped: dict[str, list[str]] = field(default_factory=dict)
    rebuilt: dict[str, list[str]] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)  # role -> folder MemOS loaded


def init_from_remote_repo(cube_id: str, *, revision: str | None = None,
                          endpoint: str | None = None, memory_types: list[str] | None = None,
                          default_config: Any = None, on_mismatch: str = "error",
                          token: str | None = None, local_dir: str | Path | None = None,
                          trusted_keys: list[Any] | None = None,
                          require_signature: bool = False) -> Any:
    """Pull, verify and load a cube as a MemOS ``GeneralMemCube``.

    Args:
        cube_id: ``owner/name`` or ``owner/name@revision``.
        revision: branch, tag or commit (or give it in ``cube_id``).
        endpoint: Hub endpoint (default: ``HF_ENDPOINT`` / huggingface.co).
        memory_types: as MemOS's (``text_mem``, ``act_mem``, ``para_mem``, ``pref_mem``).
        default_config: a ``GeneralMemCubeConfig`` merged as MemOS merges it; if it swaps in
            another model, each activation is handled by ``on_mismatch``.
        on_mismatch: ``"error"`` (raise :class:`IdentityMismatch`), ``"drop"`` (skip the item,
            one log line naming it and the fields) or ``"rebuild"`` (re-extract the item from its
            stored source text with the live model).
        local_dir: where to place the pulled cube (default: a new temporary folder).
        trusted_keys, require_signature: as for ``cubepack verify`` (signed cubes only).

    Raises:
        HubError, VerificationFailed: the cube could not be pulled, or is not what was packed
            (raised before MemOS builds anything).
        IdentityMismatch: a cache does not match the model MemOS loaded (policy ``"error"``).
    """
    _check_policy(on_mismatch)
    repo_id, wanted = parse_repo_spec(cube_id, revision)
    target = Path(local_dir) if local_dir else Path(tempfile.mkdtemp(prefix="cubepack-cube-")) / "cube"
    spec = f"{repo_id}@{wanted}" if wanted else repo_id
    pulled = pull(spec, local_dir=target, endpoint=endpoint, token=token,
                  trusted_keys=trusted_keys, require_signature=require_signature)
    cube = _build(pulled.local_dir, pulled.report.lock, memory_types=memory_types,
                  default_config=default_config, on_mismatch=on_mismatch, endpoint=endpoint,
                  token=token)
    cube.cubepack.commit_sha = pulled.commit_sha
    return cube


def init_from_dir(cube_dir: str | Path, *, memory_types: list[str] | None = None,
                  default_config: Any = None, on_mismatch: str = "error",
                  endpoint: str | None = None, token: str | None = None,
                  trusted_keys: list[Any] | None = None, require_signature: bool = False) -> Any:
    """Verify a packed cube folder, then load it as a ``GeneralMemCube`` (see above)."""
    _check_policy(on_mismatch)
    report = verify(cube_dir, trusted_keys=trusted_keys, require_signature=require_signature)
    return _build(Path(cube_dir), report.lock, memory_types=memory_types,
                  default_config=default_config, on_mismatch=on_mismatch, endpoint=endpoint,
                  token=token)


def _check_policy(on_mismatch: str) -> None:
    if on_mismatch not in POLICIES:
        raise CubepackError(f"on_mismatch must be one of {', '.join(POLICIES)}, not {on_mismatch!r}.")


# --- building the cube -------------------------------------------------------------------------

def _build(cube_dir: Path, lock: dict[str, Any], *, memory_types: list[str] | None,
           default_config: Any, on_mismatch: str, endpoint: str | None, token: str | None) -> Any:
    from memos.configs.mem_cube import GeneralMemCubeConfig
    from memos.mem_cube.general import GeneralMemCube
    from memos.mem_cube.utils import merge_config_with_default

    recorded = GeneralMemCubeConfig.from_json_file(str(cube_dir / "config.json"))
    effective = merge_config_with_default(recorded, default_config) if default_config is not None \
        else recorded
    report = HookReport(cube_dir=cube_dir)
    effective = _pin_models(recorded, effective, lock, report, endpoint=endpoint, token=token)
    cube = GeneralMemCube(effective)
    types = memory_types or ["text_mem", "act_mem", "para_mem", "pref_mem"]
    others = [kind for kind in types if kind != "act_mem"]
    if others:
        cube.load(str(cube_dir), others)  # MemOS loads these; act_mem is ours, never its pickle
    if "act_mem" in types and cube.act_mem is not None:
        _install_activations(cube, cube_dir, lock, report, on_mismatch)
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
                    continue
                raise CubepackError(f"The pinned {role} model {pin['repo_id']}@{pin['revision']} "
                                    f"cannot be downloaded: {exc}") from exc
            current["model_name_or_path"] = folder
            report.models[role] = folder
    return type(effective).model_validate(effective_dict)


def _install_activations(cube: Any, cube_dir: Path, lock: dict[str, Any], report: HookReport,
                         on_mismatch: str) -> None:
    from memos.memories.activation.item import KVCacheItem

    llm = cube.act_mem.llm
    model = llm.model
    pinned = lock["models"].get(memos_layout.ACT_ROLE, {}).get("identity")
    if pinned and dtype_name(model.dtype) != pinned["dtype"]:
        import torch

        # MemOS loads with torch_dtype="auto"; run the model in the dtype the cube was made in.
        model.to(getattr(torch, pinned["dtype"]))
    live = fingerprint(model)
    for item_id, entry in sorted(lock["activations"].items()):
        path = cube_dir / entry["file"]
        try:
            info = check_kv_file(path, live)
        except IdentityMismatch as mismatch:
            if on_mismatch == "error":
                raise IdentityMismatch(
                    f"Activation {item_id!r} of cube {cube.config.cube_id}", mismatch.mismatches,
                    "MemOS loaded another model than the one that produced it; load the cube "
                    "without a model-changing default_config, or pass on_mismatch='drop' or "
                    "'rebuild'.") from None
            fields = mismatch.fields
            if on_mismatch == "drop":
                logger.warning("cubepack: dropped activation %s: produced by another model (%s)",
                               item_id, ", ".join(fields))
                report.dropped[item_id] = fields
                continue
            cube.act_mem.add([_rebuild(cube, path, item_id)])
            report.rebuilt[item_id] = fields
            continue
        cache = build_dynamic_cache(info, model.config, device=model.device)
        cube.act_mem.add([KVCacheItem(id=item_id, memory=cache, metadata=dict(info.metadata))])
        report.loaded.append(item_id)


def _rebuild(cube: Any, path: Path, item_id: str) -> Any:
    metadata = read_kv_header(path).metadata
    text = metadata.get("source_text")
    if not isinstance(text, str) or not text:
        raise CubepackError(f"Activation {item_id!r} cannot be rebuilt: its KV file records no "
                            "source_text.")
    item = cube.act_mem.extract(text)
    item.id = item_id
    item.metadata = {**metadata, **(item.metadata or {}), "rebuilt_by_cubepack": True}
    logger.warning("cubepack: rebuilt activation %s with the loaded model", item_id)
    return item


# --- install / uninstall ------------------------------------------------------------------------

def install(require_pin: bool = True, *, trusted_keys: list[Any] | None = None,
            require_signature: bool = False) -> None:
    """Route ``GeneralMemCube.init_from_remote_repo`` / ``init_from_dir`` through cubepack.

    After it, ``GeneralMemCube.init_from_remote_repo("owner/name@<sha>")`` pulls and verifies
    with cubepack; with ``require_pin`` an id without a 40-hex commit is refused; and
    ``init_from_dir`` on a folder holding ``cubepack.lock`` verifies it first (folders without
    a lock load as before). ``trusted_keys`` / ``require_signature`` apply to every cube loaded
    through the hook. Idempotent; :func:`uninstall` restores MemOS's methods.
    """
    from memos.mem_cube.general import GeneralMemCube

    _ORIGINALS["require_pin"] = require_pin
    _ORIGINALS["signature"] = {"trusted_keys": list(trusted_keys or []),
                               "require_signature": require_signature}
    if "init_from_remote_repo" in _ORIGINALS:
        return
    _ORIGINALS["init_from_remote_repo"] = GeneralMemCube.__dict__["init_from_remote_repo"]
    _ORIGINALS["init_from_dir"] = GeneralMemCube.__dict__["init_from_dir"]
    GeneralMemCube.init_from_remote_repo = staticmethod(_hooked_remote)
    GeneralMemCube.init_from_dir = staticmethod(_hooked_dir)


def uninstall() -> None:
    """Restore MemOS's own ``init_from_remote_repo`` and ``init_from_dir``."""
    from memos.mem_cube.general import GeneralMemCube

    if "init_from_remote_repo" not in _ORIGINALS:
        return
    GeneralMemCube.init_from_remote_repo = _ORIGINALS.pop("init_from_remote_repo")
    GeneralMemCube.init_from_dir = _ORIGINALS.pop("init_from_dir")
    _ORIGINALS.pop("require_pin", None)
    _ORIGINALS.pop("signature", None)


def installed() -> bool:
    return "init_from_remote_repo" in _ORIGINALS


def _endpoint_from_base_url(base_url: str | None) -> str | None:
    """MemOS passes ``<endpoint>/datasets``; the default means "the configured Hub"."""
    if not base_url or base_url.rstrip("/") == "https://huggingface.co/datasets":
        return None
    return re.sub(r"/datasets/?$", "", base_url.rstrip("/"))


def _hooked_remote(cube_id: str, base_url: str = "https://huggingface.co/datasets",
                   memory_types: list[str] | None = None, default_config: Any = None) -> Any:
    repo_id, revision = parse_repo_spec(cube_id)
    if _ORIGINALS.get("require_pin", True) and not is_commit(revision):
        raise CubepackError(
            f"Refusing unpinned cube id {cube_id!r}: a branch or tag can move. Pin it to a "
            f"commit, e.g. GeneralMemCube.init_from_remote_repo('{repo_id}@<40-hex commit>') (the "
            f"commit is printed by `cubepack push` and `cubepack pull {repo_id}`), or call "
            "cubepack.memos.install(require_pin=False).")
    return init_from_remote_repo(cube_id, endpoint=_endpoint_from_base_url(base_url),
                                 memory_types=memory_types, default_config=default_config,
                                 **_ORIGINALS.get("signature", {}))


def _hooked_dir(dir: str, memory_types: list[str] | None = None,  # noqa: A002 - MemOS's name
                default_config: Any = None) -> Any:
    if (Path(dir) / constants.LOCK_FILENAME).is_file():
        return init_from_dir(dir, memory_types=memory_types, default_config=default_config,
                             **_ORIGINALS.get("signature", {}))
    original = _ORIGINALS["init_from_dir"].__func__
    return original(dir, memory_types, default_config)


# --- packing a live cube ------------------------------------------------------------------------

def pack_cube(cube: Any, out_dir: str | Path, *, license: str | None = None,
              pretty_name: str | None = None) -> Any:
    """Write a live ``GeneralMemCube`` to ``out_dir`` as a packed cube, with no pickle between.

    MemOS dumps the other memories; each activation is written as a KV file with the identity of
    the model MemOS loaded (``act_mem.llm.model``); pins come from that model. When the model was
    loaded from a Hub snapshot, ``config.json`` names the Hub id again, not the local path.
    Atomic: ``out_dir`` appears complete or not at all.
    """
    out = Path(out_dir)
    staging = _atomic.staging_dir(out, "pack-cube")
    try:
        dump_dir = staging / "cube"
        dump_dir.mkdir()
        types = [kind for kind in ("text_mem", "para_mem", "pref_mem") if getattr(cube, kind, None)]
        cube.dump(str(dump_dir), memory_types=types)  # config.json + non-activation memories
        model = cube.act_mem.llm.model if cube.act_mem is not None else None
        if model is not None:
            producer = fingerprint(model)
            for item_id, item in cube.act_mem.kv_cache_memories.items():
                metadata = {**json_safe(item.metadata or {}), "id": item_id}
                save_kv_cache(item.memory, dump_dir / activation_filename(item_id),
                              producer=producer, metadata=metadata)
            _restore_hub_ids(dump_dir / "config.json")
        pack(dump_dir, model=model, license=license, pretty_name=pretty_name)
        _atomic.replace_dir(dump_dir, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _restore_hub_ids(config_path: Path) -> None:
    config = json.loads(config_path.read_text())
    changed = False
    for role in memos_layout.ROLES:
        inner = memos_layout.llm_config(config, role)
        name = (inner or {}).get("model_name_or_path")
        if name and Path(name).is_dir():
            repo_id, _ = hub_origin(Path(name))
            if repo_id:
                inner["model_name_or_path"] = repo_id
                changed = True
    if changed:
        _atomic.write_text(config_path, json.dumps(config, indent=2, ensure_ascii=False))
