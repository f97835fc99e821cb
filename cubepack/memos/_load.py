"""Loading a packed cube as a MemOS ``GeneralMemCube``: pull or verify it, point MemOS at the
pinned snapshot of each producer model, let MemOS load the non-activation memories, and install
the activations from KV files, each checked against the model MemOS loaded.

MemOS is imported only inside these functions (it has import-time side effects).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._util import atomic, canonical, constants
from .._util.paths import managed_cube_folder
from .._util.quiet import quietly
from ..errors import CubepackError, FormatError, IntegrityError, UnsafeInputError, UsageError
from ..hub._client import HubClient, cache_repo_dir, offline_requested
from ..hub._pull import parse_repo_spec, pull, resolve_revision
from ..format.sections import Lock
from ..kinds import LoadJob, memos_owned
from ..memos_format import _layout as memos_layout
from ..ops import verify
from ..ops._seam import is_private, load_verified, open_private
from ..trust._age import identity_path
from ..trust._policy import TrustPolicy
from ..trust._report import VerifyReport
from ._activations import HookReport, install_loaded
from ._ondemand import opened
from ._privacy import (
    PrivacySettings,
    cube_memories,
    in_force,
    loaded_seal,
    memory_store,
    refuse_persistent,
    seal,
)

logger = logging.getLogger("cubepack.memos")


@quietly(import_first=("memos",))
def init_from_remote_repo(cube_id: str, policy: TrustPolicy | None = None, *,
                          revision: str | None = None, endpoint: str | None = None,
                          repo_type: str = "dataset", memory_types: list[str] | None = None,
                          default_config: Any = None, token: str | None = None,
                          local_dir: str | Path | None = None,
                          decrypt_with: str | os.PathLike[str] | None = None,
                          recipients: Any = None, stores: Any = None,
                          on_demand: bool = False, **options: Any) -> Any:
    """Pull, verify and load a cube as a MemOS ``GeneralMemCube``.

    Args:
        cube_id: ``owner/name`` or ``owner/name@revision``.
        policy: a :class:`~cubepack.trust.TrustPolicy` (or its fields as ``options``):
            ``on_mismatch`` (``"error"`` raises :class:`IdentityMismatch`, ``"drop"`` skips the
            item with one log line naming it and the fields, ``"rebuild"`` re-extracts it from
            its stored source with the live model), ``trusted_keys`` / ``require_signature``,
            ``strict_models``, ``recompute`` (prove each cache with the model MemOS loaded),
            ``require_provenance``.
        revision: branch, tag or commit (or give it in ``cube_id``).
        endpoint: Hub endpoint (default: ``HF_ENDPOINT`` / huggingface.co).
        repo_type: ``"dataset"`` (MemOS's default) or ``"model"``.
        memory_types: as MemOS's (``text_mem``, ``act_mem``, ``para_mem``, ``pref_mem``).
        default_config: a ``GeneralMemCubeConfig`` merged as MemOS merges it; if it swaps in
            another model, each activation is handled by ``on_mismatch``.
        local_dir: where to place the pulled cube (default: ``$CUBEPACK_CACHE/cubes/<repo>/<commit>``,
            reused by later loads of that commit; a symlink on its way is refused, see
            :func:`cubepack._util.paths.managed_folder`).
        decrypt_with: the identity file opening a private cube (default:
            ``$CUBEPACK_IDENTITY``). It is decrypted in memory only: the pulled folder and the
            HF cache hold its ciphertexts, MemOS reads the plaintext from a RAM folder that is
            gone once the cube is built. Its memories stay private in MemOS: every memory
            of the cube is sealed, so a dump of any of them (``GeneralMemCube.dump``,
            ``KVCacheMemory.dump``, the scheduler's, a text memory's) is a private cube or
            refused (see :mod:`cubepack.memos._privacy`).
        recipients: who a dump of this cube's memories is encrypted to (age or SSH public keys,
            or files of them); without them, the manifest's recipients when a trusted key
            signed the cube, else a dump is refused (an unsigned manifest is a claim).
        stores: persistent databases (``"qdrant:/abs/folder"``, as a refusal names them) the
            private cube's text and preference memories may be loaded into; any other
            persistent store is refused (an in-memory one, Qdrant's ``":memory:"``, needs no
            name).
        on_demand: fetch no activation memory now: the cube is opened at its commit (its
            lock, and its signature under ``trusted_keys``), its other files fetched and
            verified, and each activation memory fetched and checked when MemOS first uses it,
            a failure then raising a typed error naming it (:mod:`cubepack.memos._ondemand`;
            a clear cube only).

    Raises:
        HubError, VerificationFailed: the cube could not be pulled, or is not what was packed
            (raised before MemOS builds anything).
        UnsafeInputError: a symlink or someone else's folder on the managed folder's path
            (before the pull), or config.json sets something that would run code.
        UsageError: a private cube's text or preference memory would go into a persistent
            database not named in ``stores``.
        IdentityMismatch: a cache does not match the model MemOS loaded (policy ``"error"``).
        RecomputationFailed: the loaded model does not reproduce a cache, or its provenance is
            weaker than required.
    """
    policy = TrustPolicy.build(policy, **options)
    policy.require_honoured("the MemOS hook")
    named = PrivacySettings.build(recipients, stores)  # refused before any work
    repo_id, wanted = parse_repo_spec(cube_id, revision)
    policy.require_pinned(wanted, f"unpinned cube id {cube_id!r}", "Name it at its 40-hex "
                          f"commit: '{repo_id}@<commit>' (printed by `cubepack push`).")
    if on_demand:
        if local_dir is not None or decrypt_with is not None:
            raise UsageError("on_demand places nothing (local_dir) and opens clear cubes only "
                             "(decrypt_with): pass one or the other.")
        with opened(repo_id, wanted, policy, endpoint=endpoint, token=token,
                    repo_type=repo_type) as (folder, verified, place, commit):
            cube = _build(folder, verified, policy, memory_types=memory_types,
                          default_config=default_config, endpoint=endpoint, token=token,
                          place=place)
        cube.cubepack.commit_sha = commit
        return cube
    managed = local_dir is None
    if managed:  # one folder per repo and commit, cubepack's own: a later load replaces it
        sha = resolve_revision(repo_id, wanted, repo_type=repo_type, offline=offline_requested(),
                               client=HubClient(endpoint, token, cached=True))
        local_dir = managed_cube_folder(cache_repo_dir(repo_id, repo_type, ".").name, sha,
                                        create_last=False)
        wanted = sha
    target = Path(local_dir)
    spec = f"{repo_id}@{wanted}" if wanted else repo_id
    # The live checks (recomputation, provenance) run against the model MemOS loads, below.
    # A managed folder is named by what sets it (CUBEPACK_CACHE), not by pull's --local-dir.
    placing = atomic.placing(constants.cache_dir(), elsewhere="set CUBEPACK_CACHE to a "
                             "writable folder") if managed else contextlib.nullcontext()
    identity = identity_path(decrypt_with)
    with placing:
        pulled = pull(spec, policy.for_folder(), local_dir=target, endpoint=endpoint,
                      token=token, repo_type=repo_type, force=managed, decrypt_with=identity)
    cube = _build_any(pulled.local_dir, pulled.report, policy, identity, named,
                      memory_types=memory_types, default_config=default_config,
                      endpoint=endpoint, token=token)
    cube.cubepack.commit_sha = pulled.commit_sha
    return cube


@quietly(import_first=("memos",))
def init_from_dir(cube_dir: str | Path, policy: TrustPolicy | None = None, *,
                  memory_types: list[str] | None = None, default_config: Any = None,
                  endpoint: str | None = None, token: str | None = None,
                  decrypt_with: str | os.PathLike[str] | None = None,
                  recipients: Any = None, stores: Any = None,
                  **options: Any) -> Any:
    """Verify a packed cube folder, then load it as a ``GeneralMemCube`` (see above; a
    private cube is opened with ``decrypt_with``, default ``$CUBEPACK_IDENTITY``, and its
    memories sealed: ``recipients`` and ``stores`` as for :func:`init_from_remote_repo`)."""
    policy = TrustPolicy.build(policy, **options)
    policy.require_honoured("the MemOS hook")
    named = PrivacySettings.build(recipients, stores)
    identity = identity_path(decrypt_with)
    report = verify(cube_dir, policy.for_folder(), decrypt_with=identity)
    return _build_any(Path(cube_dir), report, policy, identity, named,
                      memory_types=memory_types, default_config=default_config,
                      endpoint=endpoint, token=token)


def _build_any(cube_dir: Path, verified: VerifyReport, policy: TrustPolicy,
               identity: Path | None, named: PrivacySettings, **options: Any) -> Any:
    """:func:`_build` on a clear cube; on a private one, on its clear cube decrypted into a RAM
    folder (gone when this returns: MemOS holds what it loaded, the KV caches stay mapped),
    every memory of the cube sealed (:mod:`._privacy`) before anything is loaded into it."""
    if not is_private(verified.lock):
        return _build(cube_dir, verified, policy, **options)
    if identity is None:
        raise UsageError(f"{cube_dir} is a private cube (encrypted to its recipients); loading "
                         "it needs an identity: pass decrypt_with=KEY_FILE or set "
                         "CUBEPACK_IDENTITY.")
    settings = named.merged(in_force())  # this load's names, over the hook's
    with open_private(cube_dir, identity, public_lock=verified.lock) as opened:
        clear = replace(verified, lock=opened.lock, cube_dir=cube_dir)
        sealed = loaded_seal(cube_dir, opened.manifest, opened.public_lock,
                             signed_by=verified.signed_by, named=named.recipients)
        cube = _build(opened.folder, clear, policy, private=(sealed, settings.stores),
                      **options)
    cube.cubepack.cube_dir = cube_dir
    cube.cubepack.private_recipients = list(opened.manifest["recipients"])
    encryption = opened.public_lock.encryption
    cube.cubepack.private_hidden_names = encryption is not None and encryption.hidden_names
    return cube


#: The folder :func:`_build` (or a hooked cube load) has verified and is loading from, and
#: the lock it verified: MemOS's text and preference memory loads (hooked) read it without
#: verifying it again, and a preference memory loads its items by that lock (MemOS's own load
#: of them loads nothing).
_VERIFIED: contextvars.ContextVar[tuple[Path, Lock | None] | None] = contextvars.ContextVar(
    "cubepack_memos_verified", default=None)


def already_verified(folder: Path) -> bool:
    current = _VERIFIED.get()
    return current is not None and Path(folder).resolve() == current[0]


def verified_lock(folder: Path) -> Lock | None:
    """The lock verified for ``folder`` in the enclosing :func:`verified_folder` block, if any."""
    current = _VERIFIED.get()
    return current[1] if current is not None and Path(folder).resolve() == current[0] else None


@contextlib.contextmanager
def verified_folder(folder: Path, lock: Lock | None = None) -> Iterator[None]:
    """Within the block, ``folder`` counts as verified (see :func:`already_verified`), with
    ``lock``, the lock that verification read (see :func:`verified_lock`)."""
    token = _VERIFIED.set((Path(folder).resolve(), lock))
    try:
        yield
    finally:
        _VERIFIED.reset(token)


def _build(cube_dir: Path, verified: VerifyReport, policy: TrustPolicy, *,
           memory_types: list[str] | None, default_config: Any, endpoint: str | None,
           token: str | None, private: tuple[Any, tuple[str, ...]] | None = None,
           place: Any = None) -> Any:
    """Build the GeneralMemCube: only the memory types asked for (the others are not even
    constructed, as MemOS would construct every configured one), pinned models, the
    non-activation memories loaded by MemOS, the activations by cubepack. ``private``: (the
    seal, the stores named): a persistent store is refused before MemOS builds anything, and
    every memory is sealed before anything is loaded into it. ``place``: what places the
    activation memory in place of :func:`install_loaded` (its arguments; a load on first use,
    :mod:`._ondemand`)."""
    from memos.mem_cube.general import GeneralMemCube

    types = memory_types or list(MEMORY_TYPES)
    lock = verified.lock
    recorded, effective = _configs(cube_dir, lock, default_config,
                                   shown=Path(verified.cube_dir or cube_dir))
    report = HookReport(cube_dir=cube_dir, verified=True, signed_by=verified.signed_by,
                        signed=verified.signed)
    effective = _pin_models(recorded, effective, lock, report, endpoint=endpoint, token=token)
    seals = frozenset([private[0]]) if private is not None else frozenset()
    # What the config decides of the memories (an adapter's base) is refused before MemOS
    # builds anything; the rest once it built them.
    load_verified(LoadJob(cube_dir, lock, policy, {}, report, config=effective.model_dump(
        mode="json") if "para_mem" in types else {}, seals=seals, whole=True, built=False))
    config = _only(effective, types)
    if private is not None:
        refuse_persistent([(kind, store) for kind in types
                           if (store := memory_store(kind, getattr(config, kind, None)))],
                          private[1], private[0].source)
    cube = GeneralMemCube(config)
    if private is not None:
        for memory in cube_memories(cube):
            seal(memory, [private[0]])
    # MemOS loads the memories no kind loads itself (a text memory); the kinds the rest.
    others = [kind for kind in types if getattr(cube, kind, None) is not None
              and not memos_owned(lock, kind)]
    with verified_folder(cube_dir, lock):
        if others and (cube_dir / constants.MEMOS_CONFIG).is_file():
            cube.load(str(cube_dir), others)
        for kind in others if not (cube_dir / constants.MEMOS_CONFIG).is_file() else []:
            getattr(cube, kind).load(str(cube_dir))  # a cube without config.json: each memory
    # Every check of the memories against the models MemOS loaded is the kinds' (the hook
    # keeps none); what they hand back, the hook places.
    memories = {kind: memory for kind in types
                if (memory := getattr(cube, kind, None)) is not None}
    loaded = load_verified(LoadJob(cube_dir, lock, policy, memories, report, seals=seals,
                                   whole=True))
    if "act_mem" in memories:
        (place or install_loaded)(cube.act_mem, loaded, cube_dir, lock, report)
    cube.cubepack = report
    return cube


MEMORY_TYPES = ("text_mem", "act_mem", "para_mem", "pref_mem")


def _configs(cube_dir: Path, lock: Lock, default_config: Any, *,
             shown: Path) -> tuple[Any, Any]:
    """(the cube's own config, the effective one), merged as MemOS merges a default_config. A
    cube without config.json (a text-memory export, a lone memory's dump) takes the
    default_config, with the lock's cube id. ``shown``: the folder the user named (a private
    cube is read from a RAM folder that is gone when a message is read)."""
    from memos.configs.mem_cube import GeneralMemCubeConfig
    from memos.mem_cube.utils import merge_config_with_default

    if not (cube_dir / constants.MEMOS_CONFIG).is_file():
        if default_config is None:
            kind = ("an activation memory's own dump" if lock.activations else
                    "a text memory's own dump, or a text-memory export")
            raise UsageError(f"{shown} holds no MemOS config.json ({kind}); say how MemOS "
                             "should hold it: pass "
                             "default_config=a GeneralMemCubeConfig (its cube_id is taken from "
                             "the cube), or load it into a memory of yours (KVCacheMemory.load, "
                             "a text memory's load).")
        data = default_config.model_dump(mode="json")
        data["cube_id"] = lock.cube_id or data.get("cube_id")
        config = type(default_config).model_validate(data)
        return config, config
    refuse_code_settings(cube_dir)
    recorded = GeneralMemCubeConfig.from_json_file(str(cube_dir / constants.MEMOS_CONFIG))
    effective = merge_config_with_default(recorded, default_config) if default_config is not None \
        else recorded
    return recorded, effective


def refuse_code_settings(cube_dir: Path) -> None:
    """Refuse a cube folder whose ``config.json`` would make MemOS run code from a model's
    repository (``trust_remote_code``...) when it builds the cube's models: read as strictly as
    verify reads it, before MemOS reads it. A folder without config.json passes (MemOS then
    takes the caller's own default_config).

    Raises:
        UnsafeInputError: naming each setting by its JSON path, and the fix.
        FormatError: config.json is not strict JSON, so it cannot be checked.
    """
    path = cube_dir / constants.MEMOS_CONFIG
    if not path.is_file():
        return
    try:
        config = canonical.loads_strict(path.read_bytes())
    except ValueError as exc:
        raise FormatError(f"{path} is not valid JSON ({exc}), so cubepack cannot check it for "
                          "settings that run code; refusing the cube.") from exc
    settings = memos_layout.code_running_settings(config)
    if settings:
        raise UnsafeInputError(memos_layout.code_settings_message(
            settings, str(path), "load it again (a packed cube: pack it again)"))


def _only(config: Any, types: list[str]) -> Any:
    """``config`` with the memory types not asked for left uninitialised, so MemOS does not
    build them (it builds every configured memory, whatever ``memory_types`` says)."""
    data = config.model_dump(mode="json")
    for kind in MEMORY_TYPES:
        if kind not in types and isinstance(data.get(kind), dict):
            data[kind] = {"backend": "uninitialized"}
    return type(config).model_validate(data)


def _pin_models(recorded: Any, effective: Any, lock: Lock, report: HookReport, *,
                endpoint: str | None, token: str | None) -> Any:
    """Point each producer at its pinned snapshot, when the effective config still names the
    model the cube was packed with. A ``default_config`` that swapped the model keeps its own
    model: the identity check on each activation then applies the mismatch policy."""
    from huggingface_hub import snapshot_download

    recorded_dict = recorded.model_dump(mode="json")
    effective_dict = effective.model_dump(mode="json")
    for role, pin in lock.models.items():
        original = memos_layout.llm_config(recorded_dict, role)
        current = memos_layout.llm_config(effective_dict, role)
        if current is None or original is None:
            continue
        if current.get("model_name_or_path") != original.get("model_name_or_path"):
            logger.info("cubepack: default_config replaces the %s model %s with %s", role,
                        original.get("model_name_or_path"), current.get("model_name_or_path"))
            continue
        named = original.get("model_name_or_path")
        if pin.repo_id and named not in (pin.repo_id, pin.name):
            # The lock is a claim: it may pin the model config.json names, never choose another.
            raise IntegrityError(
                f"The lock pins the {role} model {pin.repo_id}@{pin.revision}, but "
                f"config.json names {named}: the pin would make MemOS run another model than the "
                "one the cube (and any default_config) names. Refusing the cube; re-pack it.")
        backend = memos_layout.role_backend(recorded_dict, role)
        if pin.where is not None and backend not in memos_layout.LOCAL_BACKENDS:
            # A server (vLLM...) holds these weights and MemOS sends it the name: a local
            # snapshot would be downloaded for nothing and the server sent a path it lacks.
            logger.info("cubepack: the %s model %s@%s is served by its %s backend; MemOS sends "
                        "the name, nothing is downloaded", role, pin.repo_id, pin.revision,
                        backend)
            report.models[role] = f"{pin.where} (served by {backend})"
            continue
        if pin.repo_id and pin.revision:
            try:
                folder = snapshot_download(pin.repo_id, revision=pin.revision,
                                           endpoint=endpoint, token=token)
            except Exception as exc:
                if not pin.strict:
                    # Only the activation producer must match bit for bit; a helper model
                    # (extractor, embedder) falls back to its name, and the user is told.
                    logger.warning("cubepack: the pinned %s model %s@%s cannot be downloaded "
                                   "(%s); MemOS will load %s by name", role, pin.repo_id,
                                   pin.revision, exc, original.get("model_name_or_path"))
                    continue
                raise CubepackError(f"The pinned {role} model {pin.where} "
                                    f"cannot be downloaded: {exc}. Use an endpoint that hosts "
                                    f"that commit (and a token that can read it), or put the "
                                    f"commit in the HF cache first.") from exc
            current["model_name_or_path"] = folder
            report.models[role] = folder
    return type(effective).model_validate(effective_dict)
