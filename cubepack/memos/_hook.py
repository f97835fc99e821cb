"""``install()`` / ``uninstall()``: cubepack's path under MemOS's own calls.

Patched: the class attributes ``GeneralMemCube.init_from_remote_repo`` / ``init_from_dir`` (so
``MOSCore.register_mem_cube`` is covered), and the leaves: the ``load`` of MemOS's activation
memories (``KVCacheMemory``, ``VLLMKVCacheMemory``), the only MemOS code that unpickles. So every
entry point (``GeneralMemCube.load``, ``NaiveMemCube.load``, ``MOSCore.load``, the scheduler)
verifies a packed folder and reads an unpacked one through the allowlist reader. The parametric
memory's ``LoRAMemory.load`` too: a packed folder's LoRA adapters are checked against the base
that memory's config names (MemOS 2.0.33's own load reads nothing: see ``_parametric``).
Settings only get stricter once installed.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._util import atomic, constants
from .._util.checks import Catalogue
from .._util.paths import managed_cube_folder, scan_cube
from .._util.quiet import quietly
from .._util.revision import check_ref_name, is_commit
from ..errors import HubError, RefusedError, SignatureError, UnsafeInputError, UsageError
from ..hub._client import parse_repo_spec
from ..kinds import LoadJob, memos_owner
from ..kv._torch import PRIVATE_CACHE_CHECKS
from ..ops import verify
from ..ops._seam import is_private, load_verified, open_private
from ..trust._age import identity_path
from ..trust._policy import TrustPolicy
from ._activations import HookReport, load_activations, load_unpacked
from ._dump import dump_activations, dump_cube, dump_private, plan_dump
from ._load import (
    already_verified,
    init_from_dir,
    init_from_remote_repo,
    refuse_code_settings,
    verified_folder,
    verified_lock,
)
from ._privacy import (
    SEAL_LISTENERS,
    PrivacySettings,
    clear_allowed,
    in_force,
    installed_settings,
    instance_store,
    loaded_seal,
    record_store,
    refuse_clear_into_private,
    refuse_persistent,
    seal,
    seals_of,
    set_installed,
)
from ._use import (
    cache_seals,
    checked_add,
    checked_parts,
    cube_seals,
    guarded_use,
    memory_seals,
    merged,
    record_build,
    record_extraction,
)

logger = logging.getLogger("cubepack.memos")


DEFAULT_BASE_URL = "https://huggingface.co/datasets"
#: The MemOS call the user made, for messages (MOS.register_mem_cube loads cubes for them).
_CALLER: contextvars.ContextVar[str] = contextvars.ContextVar(
    "cubepack_memos_caller", default="GeneralMemCube.init_from_remote_repo")


#: What the hook enforces before :func:`install` says more: a remote cube is named at a commit.
DEFAULT = TrustPolicy(require_pin=True)

_STATE: dict[str, Any] = {"settings": None, "originals": {}, "replacements": {}}


def _from_environment() -> TrustPolicy:
    """The policy servers set for the ``memos.plugins`` install: ``CUBEPACK_MEMOS_ON_MISMATCH``,
    ``CUBEPACK_MEMOS_TRUSTED_KEYS`` (paths joined by ``os.pathsep``),
    ``CUBEPACK_MEMOS_REQUIRE_SIGNATURE=1``, ``CUBEPACK_MEMOS_RECOMPUTE=1`` and
    ``CUBEPACK_MEMOS_REQUIRE_LINEAGE=1``, over :data:`DEFAULT`."""
    keys = tuple(k for k in os.environ.get("CUBEPACK_MEMOS_TRUSTED_KEYS", "").split(os.pathsep) if k)
    return replace(DEFAULT, on_mismatch=os.environ.get("CUBEPACK_MEMOS_ON_MISMATCH") or "error",
                   trusted_keys=keys,
                   require_signature=constants.env_flag("CUBEPACK_MEMOS_REQUIRE_SIGNATURE"),
                   recompute=constants.env_flag("CUBEPACK_MEMOS_RECOMPUTE"),
                   require_lineage=constants.env_flag("CUBEPACK_MEMOS_REQUIRE_LINEAGE"))


def install(require_pin: bool | None = None, *, policy: TrustPolicy | None = None,
            recipients: Any = None, stores: Any = None, **options: Any) -> TrustPolicy:
    """Route MemOS's cube loading through cubepack (see the module docstring); return the
    :class:`~cubepack.trust.TrustPolicy` now in force: the hook's settings are that policy,
    applied whole by every hooked load (the fields the hook cannot honour, ``model`` and
    ``embedder``, are refused: it checks the model and embedder MemOS loads).

    The first call sets it: ``policy`` and the fields given as ``options`` (``trusted_keys``,
    ``require_signature``, ``on_mismatch``, ``recompute``, ``require_lineage``,
    ``require_provenance``, ``strict_models``...), else the environment (for servers that
    install through the ``memos.plugins`` entry point), over :data:`DEFAULT`
    (``require_pin=True``, no keys, ``on_mismatch="error"``). A later call, such as MemOS's
    plugin discovery running again, only makes it stricter
    (:meth:`~cubepack.trust.TrustPolicy.tightened`): it can require a pin, a signature,
    lineage or recomputation, add keys when none were set, or move the mismatch policy towards
    ``"error"``, never the reverse. Call :func:`uninstall` first to loosen it.

    ``recompute=True`` proves every cache MemOS loads with the model it loaded (a prefill of
    its token ids, every position), packed or not: a folder without a lock can only claim its
    producer, and this is what proves it.

    Private cubes (:mod:`._privacy`): ``recipients`` (age or SSH public keys, or files of
    them) are who every dump of a private cube's memories is encrypted to, whatever cube they
    came from (without them, only a manifest a trusted key signed names the readers of a dump;
    any other dump is refused); ``stores`` names persistent databases (``qdrant:/abs/folder``,
    as a refusal prints them) a private cube's text and preference memories may be loaded
    into. Set by the first call (else ``CUBEPACK_MEMOS_RECIPIENTS`` / ``CUBEPACK_MEMOS_STORES``);
    a later call cannot change them (``uninstall()`` first).

    Raises:
        UsageError: a value the policy refuses, or a field the hook cannot honour; a recipient
            that does not parse; other recipients or stores than the installed ones.
    """
    if require_pin is not None:
        options["require_pin"] = require_pin
    given = TrustPolicy.build(policy, **options)  # refuse a bad value before changing anything
    given.require_honoured("the MemOS hook")
    named = PrivacySettings.build(recipients, stores)
    installed_privacy = installed_settings()
    if installed_privacy is not None and (recipients is not None or stores is not None) \
            and named != installed_privacy:
        raise UsageError("The hook is installed with other recipients or stores for private "
                         "cubes; they are set once: call cubepack.memos.uninstall() first.")
    if installed_privacy is None:  # each field named, else the environment's
        set_installed(named.over(PrivacySettings.from_environment(),
                                 (recipients is not None, stores is not None)))
    current: TrustPolicy | None = _STATE["settings"]
    # What the call says: the fields it sets, or gives explicitly even at their default.
    said = set(given.asked()) | {name for name, value in options.items() if value is not None}
    if current is None:  # over the environment's and the hook's defaults
        updated = given.said_over(_from_environment(), said)
    else:
        updated = current.tightened(given, said)
    _STATE["settings"] = updated
    _patch()
    if _sealed_cache not in PRIVATE_CACHE_CHECKS:  # cubepack's own KV writer asks it too
        PRIVATE_CACHE_CHECKS.append(_sealed_cache)
    return updated


def _sealed_cache(cache: Any) -> str | None:
    """Why ``cache`` is a private cube's memory for the hook (it carries a seal), or None.
    Registered with the KV writer (``save_kv_cache``) by the first install, and kept after
    :func:`uninstall` (a sealed cache stays sealed)."""
    if isinstance(cache, str) or not cache_seals([cache]):
        return None
    return "it carries the seal of a private cube loaded into MemOS"


def settings() -> TrustPolicy | None:
    """The policy the installed hook enforces, or None when it is not installed."""
    return _STATE["settings"]


def installed() -> bool:
    return _STATE["settings"] is not None


def uninstall() -> None:
    """Restore MemOS's own methods and forget the settings. A method someone patched again
    after :func:`install` keeps their patch (restoring MemOS's would silently drop it).

    A memory that holds a private cube's memories stays sealed: MemOS's writers come back
    behind a guard (:func:`_residue`) that refuses to dump a sealed memory (MemOS's own dump
    would write it in clear) and seals a memory a private cache is added to; everything else
    runs as MemOS's own code."""
    for (owner, name), original in _STATE["originals"].items():
        if owner.__dict__.get(name) is _STATE["replacements"].get((owner, name)):
            residue = _residue(owner, name, original)
            setattr(owner, name, residue if residue is not None else original)
        else:
            logger.warning("cubepack: %s.%s was replaced after cubepack.memos.install(); "
                           "leaving that replacement in place", owner.__name__, name)
    _STATE["originals"].clear()
    _STATE["replacements"].clear()
    _STATE["settings"] = None
    set_installed(None)


def _patch() -> None:
    from memos.graph_dbs.factory import GraphStoreFactory
    from memos.llms.hf import HFLLM
    from memos.mem_cube.general import GeneralMemCube
    from memos.mem_cube.navie import NaiveMemCube
    from memos.mem_os.core import MOSCore
    from memos.mem_scheduler.memory_manage_modules.activation_memory_manager import (
        ActivationMemoryManager,
    )
    from memos.memories.activation.kv import KVCacheMemory
    from memos.memories.activation.vllmkv import VLLMKVCacheMemory
    from memos.memories.parametric.lora import LoRAMemory
    from memos.memories.textual.general import GeneralTextMemory
    from memos.memories.textual.naive import NaiveTextMemory
    from memos.memories.textual.preference import PreferenceTextMemory
    from memos.memories.textual.tree import TreeTextMemory
    from memos.vec_dbs.factory import VecDBFactory

    targets = {(GeneralMemCube, "init_from_remote_repo"): staticmethod(_hooked_remote),
               (GeneralMemCube, "init_from_dir"): staticmethod(_hooked_dir),
               (GeneralMemCube, "dump"): _cube_dump(GeneralMemCube),
               (GeneralMemCube, "load"): _cube_load(GeneralMemCube),
               (NaiveMemCube, "load"): _cube_load(NaiveMemCube),
               (NaiveMemCube, "dump"): _cube_dump(NaiveMemCube),
               (KVCacheMemory, "load"): _own(_guarded_act_load),
               (VLLMKVCacheMemory, "load"): _own(_guarded_act_load),
               (LoRAMemory, "load"): _guarded_para_load,
               (KVCacheMemory, "extract"): _recorded_extract,
               (KVCacheMemory, "from_textual_memory"): _recorded_from_textual_memory,
               (KVCacheMemory, "_concat_caches"): _recorded_concat,
               (KVCacheMemory, "dump"): _own(_portable_act_dump),
               (VLLMKVCacheMemory, "dump"): _own(_portable_act_dump),
               (HFLLM, "build_kv_cache"): _recorded_build,
               (KVCacheMemory, "add"): _checked_add,
               (HFLLM, "_generate_with_cache"): guarded_use(
                   HFLLM.__dict__["_generate_with_cache"], HFLLM._generate_full, _hook_settings),
               (HFLLM, "_generate_with_cache_stream"): guarded_use(
                   HFLLM.__dict__["_generate_with_cache_stream"], HFLLM._generate_full_stream,
                   _hook_settings, stream=True),
               (MOSCore, "register_mem_cube"): _register_mem_cube,
               (ActivationMemoryManager, "update_activation_memory"): _sealed_update}
    for owner in (NaiveTextMemory, GeneralTextMemory, TreeTextMemory, PreferenceTextMemory):
        targets[owner, "dump"] = _text_dump(owner)
        targets[owner, "load"] = _text_load(owner)
    for factory, kind in ((VecDBFactory, "vector_db"), (GraphStoreFactory, "graph_db")):
        targets[factory, "from_config"] = _named_store(factory, kind)
    for (owner, name), replacement in targets.items():
        if (owner, name) not in _STATE["originals"]:
            current = owner.__dict__[name]
            original = getattr(current, RESIDUE_OF, current)  # MemOS's, under a residue
            _STATE["originals"][(owner, name)] = original
            if isinstance(replacement, types.FunctionType):  # inspect.unwrap finds MemOS's
                replacement.__wrapped__ = original
            _STATE["replacements"][(owner, name)] = replacement
            setattr(owner, name, replacement)


#: The attribute a residue guard keeps MemOS's own method in.
RESIDUE_OF = "_cubepack_residue_of"


def _residue(owner: Any, name: str, original: Any) -> Any:
    """What stays of the hook after :func:`uninstall` at ``owner.name``, or None (MemOS's own
    method comes back): a sealed memory (or cube holding one) is never dumped by MemOS's own
    dump, which would write it in clear; a memory a private cache is added to is sealed; the
    scheduler's update seals the activation memory it fills from a sealed cube. For anything
    that holds no private cube's memories, MemOS's own method runs as it is."""
    from memos.mem_scheduler.memory_manage_modules.activation_memory_manager import (
        ActivationMemoryManager,
    )
    from memos.memories.activation.kv import KVCacheMemory

    cube = owner in (_general_cube(), _naive_cube())
    if name == "add" and owner is KVCacheMemory:
        def guard(self: Any, memories: list[Any]) -> Any:
            seal(self, cache_seals([getattr(m, "memory", None) for m in memories
                                    if not isinstance(getattr(m, "memory", None), str)]))
            return original(self, memories)
    elif name == "update_activation_memory" and owner is ActivationMemoryManager:
        def guard(self: Any, *args: Any, **kwargs: Any) -> Any:
            mem_cube = kwargs.get("mem_cube", args[4] if len(args) > 4 else None)
            seal(getattr(mem_cube, "_act_mem", None), cube_seals(mem_cube))
            return original(self, *args, **kwargs)
    elif name == "dump":
        def guard(self: Any, dir: str, *args: Any, **kwargs: Any) -> Any:
            if cube:
                kinds = (args[0] if args else kwargs.get("memory_types")) or MEMORY_KINDS
                seals = frozenset().union(*(memory_seals(getattr(self, f"_{kind}", None))
                                            for kind in kinds))
            else:
                seals = memory_seals(self)
            if seals:
                raise UsageError(
                    f"{owner.__name__}.dump to {dir}: this memory holds a private cube's "
                    "memories, and the cubepack hook is not installed, so MemOS's own dump "
                    "would write them in clear. Install the hook "
                    "(cubepack.memos.install(recipients=[...])) to dump them as a private "
                    "cube. Nothing was written.")
            return original(self, dir, *args, **kwargs)
    else:
        return None
    functools.update_wrapper(guard, original)
    setattr(guard, RESIDUE_OF, original)
    return guard


def _guard_sealed() -> None:
    """Something was sealed: unless the hook is installed (its writers then seal), MemOS's
    writers get the guard :func:`uninstall` leaves (:func:`_residue`), so a sealed memory
    loaded by ``init_from_dir`` in a process that never installed the hook is never dumped in
    clear by MemOS's own dump."""
    if installed():
        return
    for owner, name in _guarded_writers():
        current = owner.__dict__.get(name)
        if current is None or hasattr(current, RESIDUE_OF):
            continue
        residue = _residue(owner, name, current)
        if residue is not None:
            setattr(owner, name, residue)


def _guarded_writers() -> list[tuple[Any, str]]:
    """The MemOS methods a residue guards (see :func:`_residue`)."""
    from memos.mem_cube.navie import NaiveMemCube
    from memos.mem_scheduler.memory_manage_modules.activation_memory_manager import (
        ActivationMemoryManager,
    )
    from memos.memories.activation.kv import KVCacheMemory
    from memos.memories.activation.vllmkv import VLLMKVCacheMemory
    from memos.memories.textual.general import GeneralTextMemory
    from memos.memories.textual.naive import NaiveTextMemory
    from memos.memories.textual.preference import PreferenceTextMemory
    from memos.memories.textual.tree import TreeTextMemory

    return [*((owner, "dump") for owner in (
        _general_cube(), NaiveMemCube, KVCacheMemory, VLLMKVCacheMemory, NaiveTextMemory,
        GeneralTextMemory, TreeTextMemory, PreferenceTextMemory)),
        (KVCacheMemory, "add"), (ActivationMemoryManager, "update_activation_memory")]


SEAL_LISTENERS.append(_guard_sealed)


def _own(function: Any) -> Any:
    """A distinct function object per patched attribute, so each one's ``__wrapped__`` names
    the MemOS method it replaced."""

    @functools.wraps(function)
    def replacement(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    return replacement


def _original(owner: Any, name: str) -> Any:
    return _STATE["originals"][owner, name]


def _hook_settings() -> TrustPolicy:
    return _STATE["settings"] or DEFAULT


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


@quietly(import_first=("memos",))
def _hooked_remote(cube_id: str, base_url: str = DEFAULT_BASE_URL,
                   memory_types: list[str] | None = None, default_config: Any = None) -> Any:
    current = _hook_settings()
    kind, where, repo_type = _remote_kind(base_url)
    # Exactly owner/name, before anything runs: the id is joined to the base URL, so
    # "owner/../x" would clone outside it. MemOS servers take ids from requests.
    repo, revision = parse_repo_spec(cube_id)
    revision = revision or ""
    what = ("a Hub commit (printed by `cubepack push` and `cubepack pull`)" if kind == "hub"
            else "a git commit (`git rev-parse HEAD` in that repository)")
    current.require_pinned(revision, f"unpinned cube id {cube_id!r}", f"Pin it to {what}: "
                           f"{_CALLER.get()}('{repo}@<40-hex commit>', ...), or call "
                           "cubepack.memos.install(require_pin=False) on a fresh install.")
    if kind == "hub":
        return _placeholder(init_from_remote_repo(
            cube_id, endpoint=where, repo_type=repo_type, memory_types=memory_types,
            default_config=default_config, policy=current))
    if revision and not is_commit(revision):
        check_ref_name(revision)  # a branch or tag, never an option such as "--orphan"
    folder = git_checkout(f"{where}/{repo}", revision or None)
    return _hooked_dir(str(folder), memory_types, default_config)


def git_checkout(url: str, revision: str | None) -> Path:
    """Clone ``url`` and check out ``revision`` (a commit; the default branch when None), as
    MemOS's own remotes work, but at the commit asked for, into the managed folder
    ``$CUBEPACK_CACHE/cubes/git/<url digest>/<commit>`` (replaced by a later load of the same
    commit; nothing is left in a temporary folder).

    Raises:
        UnsafeInputError: a symlink (or someone else's folder) on the managed folder's path
            (see :func:`~cubepack._util.paths.managed_folder`), before anything is cloned; or
            the checked-out tree holds a symlink (git writes them as links, to anywhere), a
            special file or a name the path rule refuses; the clone is removed before MemOS or
            cubepack reads any of it.
    """
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    root = managed_cube_folder("git", digest)
    if revision and is_commit(revision):  # its folder is known: checked before cloning
        managed_cube_folder("git", digest, revision, create_last=False)
    with atomic.placing(root, elsewhere="set CUBEPACK_CACHE to a writable folder"):
        staging = atomic.staging_dir(root / (revision or "HEAD"), "clone")
        folder = staging / "cube"
        try:
            head = _clone(url, revision, folder)
            _, problems = scan_cube(folder)
            if problems:
                where, what = problems[0]
                raise UnsafeInputError(f"The clone of {url} is refused: "
                                       + (f"{where} {what}." if where else f"{what}"))
            target = managed_cube_folder("git", digest, head, create_last=False)
            atomic.replace_dir(folder, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _clone(url: str, revision: str | None, folder: Path) -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
        if done.returncode:
            raise HubError(f"git {args[0]} of {url} failed: "
                           f"{(done.stderr.strip().splitlines() or ['no message'])[-1]}")
        return done.stdout.strip()

    git("clone", "--quiet", "--no-checkout", "--", url, str(folder))
    git("-C", str(folder), "-c", "advice.detachedHead=false", "checkout", "--quiet",
        revision or "HEAD")
    head = git("-C", str(folder), "rev-parse", "HEAD")
    if revision and head != revision:
        raise HubError(f"git checked out {head} for {url}@{revision}; refusing another commit.")
    shutil.rmtree(folder / ".git")  # the cube is the working tree; git's own files are not in it
    return head


@quietly(import_first=("memos",))
def _hooked_dir(dir: str, memory_types: list[str] | None = None,
                default_config: Any = None) -> Any:
    current = _hook_settings()
    state = _lock_state(Path(dir))
    if state == "file":
        return _placeholder(init_from_dir(dir, memory_types=memory_types,
                                          default_config=default_config, policy=current))
    _refuse_unpacked(Path(dir), state, current)
    refuse_code_settings(Path(dir))  # before MemOS builds any model from it
    original = _STATE["originals"][_general_cube(), "init_from_dir"].__func__
    return _placeholder(original(dir, memory_types, default_config))  # act load guarded too


@quietly(import_first=("memos",))
def _guarded_act_load(self: Any, dir: str) -> None:
    """``KVCacheMemory.load`` / ``VLLMKVCacheMemory.load`` under the hook: a folder with a lock
    is verified and its KV files loaded, each checked against the live model; a folder without
    one is read through the allowlist reader. MemOS's ``pickle.load`` is never called."""
    current = _hook_settings()
    folder = Path(dir)
    state = _lock_state(folder)
    report = HookReport(cube_dir=folder)
    if state == "file":
        identity = identity_path(None)
        verified = verify(folder, current.for_folder(), decrypt_with=identity)
        report.verified, report.signed_by = True, verified.signed_by
        report.signed = verified.signed
        if is_private(verified.lock):  # decrypted in memory (CUBEPACK_IDENTITY), as init does
            if identity is None:
                raise UsageError(f"{folder} is a private cube; loading it needs an identity: "
                                 "set CUBEPACK_IDENTITY to a key file it is encrypted to.")
            with open_private(folder, identity, public_lock=verified.lock) as opened:
                sealed = loaded_seal(folder, opened.manifest, opened.public_lock,
                                     signed_by=verified.signed_by)
                load_activations(self, opened.folder, opened.lock, report, current,
                                 seals_of(self) | {sealed})
            # Once loaded (a refused load leaves the memory as it was, unsealed too).
            seal(self, [sealed])
        else:  # a sealed memory's caches carry its seals (GeneralMemCube.load of a private
            # cube seals the memory, then reaches here with the clear cube in a RAM folder)
            load_activations(self, folder, verified.lock, report, current, seals_of(self))
    else:
        _refuse_unpacked(folder, state, current)
        load_unpacked(self, folder, report, current)
    self.cubepack = report


def _cube_load(owner: Any) -> Any:
    """``GeneralMemCube.load`` / ``NaiveMemCube.load`` under the hook (see
    :func:`_guarded_cube_load`)."""

    def load(self: Any, dir: str, memory_types: Any = None) -> None:
        return _guarded_cube_load(owner, self, dir, memory_types)

    load.__doc__ = _guarded_cube_load.__doc__
    return load


@quietly(import_first=("memos",))
def _guarded_cube_load(owner: Any, self: Any, dir: str, memory_types: Any = None) -> None:
    """A cube's load under the hook (``MOSCore.load`` calls ``GeneralMemCube.load``): MemOS's
    own load, whose memory loads are hooked; a private cube (which MemOS alone cannot read:
    its config.json is a ciphertext) is opened in memory first, its persistent stores refused
    unless named, and every memory it loads into sealed before anything is loaded."""
    folder = Path(dir)
    original = _original(owner, "load")
    if _lock_state(folder) != "file" or already_verified(folder):
        return original(self, dir, memory_types)
    current = _hook_settings()
    identity = identity_path(None)
    verified = verify(folder, current.for_folder(), decrypt_with=identity)
    if not is_private(verified.lock):
        with verified_folder(folder, verified.lock):
            return original(self, dir, memory_types)
    if identity is None:
        raise UsageError(f"{folder} is a private cube; loading it needs an identity: set "
                         "CUBEPACK_IDENTITY to a key file it is encrypted to.")
    kinds = list(memory_types or MEMORY_KINDS)
    memories = [(kind, getattr(self, f"_{kind}", None)) for kind in kinds]
    refuse_persistent([(kind, store) for kind, memory in memories
                       if (store := instance_store(memory)) is not None],
                      in_force().stores, folder)
    with open_private(folder, identity, public_lock=verified.lock) as opened:
        sealed = loaded_seal(folder, opened.manifest, opened.public_lock,
                             signed_by=verified.signed_by)
        for _, memory in memories:
            seal(memory, [sealed])
        with verified_folder(opened.folder, opened.lock):
            return original(self, str(opened.folder), memory_types)


@quietly(import_first=("memos",))
def _guarded_para_load(self: Any, dir: str) -> None:
    """``LoRAMemory.load`` under the hook: a folder with a lock is verified and each of its
    adapters checked against the model this memory's config names (its base), then MemOS's own
    load runs (in 2.0.33 it reads nothing: the parametric memory is a placeholder)."""
    from memos.memories.parametric.lora import LoRAMemory

    current = _hook_settings()
    folder = Path(dir)
    if _lock_state(folder) == "file":
        verified = verify(folder, current.for_folder())
        report = HookReport(cube_dir=folder, verified=True, signed_by=verified.signed_by,
                            signed=verified.signed)
        load_verified(LoadJob(folder, verified.lock, current, {"para_mem": self}, report,
                              config={"para_mem": {"backend": "lora", "config":
                                                   self.config.model_dump(mode="json")}},
                              built=False))  # before MemOS's own load
        self.cubepack = report
    return _original(LoRAMemory, "load")(self, dir)


def _recorded_extract(self: Any, text: Any) -> Any:
    """MemOS's ``KVCacheMemory.extract``, with the new cache's producer registered."""
    return record_extraction(self, _original(_kv_memory(), "extract")(self, text), text)


def _recorded_from_textual_memory(self: Any, mem: Any) -> Any:
    """MemOS's ``KVCacheMemory.from_textual_memory``, with the new cache registered."""
    item = _original(_kv_memory(), "from_textual_memory")(self, mem)
    return record_extraction(self, item, getattr(mem, "memory", None))


def _recorded_concat(self: Any, caches: list[Any]) -> Any:
    """MemOS's ``KVCacheMemory._concat_caches`` (``get_cache``'s merge): a part of unknown
    origin is handled by the policy first; the merge carries its parts' common producer, and
    parts of different producers are refused."""
    kept = checked_parts(caches, _hook_settings().mismatch_action())
    if not kept:
        return None
    return merged(kept, _original(_kv_memory(), "_concat_caches")(self, kept))


def _recorded_build(self: Any, messages: Any) -> Any:
    """MemOS's ``HFLLM.build_kv_cache``, with the new cache's producer registered."""
    from memos.llms.hf import HFLLM

    return record_build(self, messages, _original(HFLLM, "build_kv_cache")(self, messages))


def _checked_add(self: Any, memories: list[Any]) -> None:
    """MemOS's ``KVCacheMemory.add``, of the items whose cache's producer is this memory's
    model (the others handled by the policy)."""
    return _original(_kv_memory(), "add")(self, checked_add(self, list(memories),
                                                             _hook_settings().mismatch_action()))


def _portable_act_dump(self: Any, dir: str) -> None:
    """``KVCacheMemory.dump`` under the hook: KV files, a cache of unknown origin handled by
    the policy in force (never attributed to the memory's model); a memory holding a private
    cube's caches writes a private cube (:func:`~._dump.dump_private`) or refuses."""
    writer = f"{type(self).__name__}.dump"
    on_mismatch = _hook_settings().mismatch_action()
    seals, target = memory_seals(self), Path(dir)
    if not seals or clear_allowed(target):
        if not seals:
            refuse_clear_into_private(target, writer)
        dump_activations(self, dir, on_mismatch=on_mismatch)
        return
    local = hasattr(self.llm, "model")
    planned = plan_dump(self, on_mismatch) if local else None  # refused before any work
    served = getattr(getattr(self.llm, "config", None), "model_name_or_path", None)
    dump_private(lambda clear: dump_activations(self, str(clear), on_mismatch=on_mismatch,
                                                planned=planned),
                 target, seals, writer, named=in_force().recipients,
                 pack_model=self.llm.model if local else served)


def _cube_dump(owner: Any) -> Any:
    """``GeneralMemCube.dump`` / ``NaiveMemCube.dump`` under the hook (see :func:`_portable_dump`)."""

    def replacement(self: Any, dir: str, memory_types: Any = None) -> None:
        return _portable_dump(owner, self, dir, memory_types)

    replacement.__qualname__ = replacement.__name__ = "dump"
    replacement.__doc__ = _portable_dump.__doc__
    return replacement


def _portable_dump(owner: Any, self: Any, dir: str, memory_types: Any = None) -> None:
    """A cube's dump under the hook: MemOS dumps (its activation memory writing KV files, not a
    pickle), then config.json names each model by its Hub id rather than the local snapshot
    path the hook loaded it from, and the folder is packed, so it loads anywhere through
    cubepack and verifies. A dump that holds a private cube's memories (any of the memories it
    writes carries a seal) is written whole as a private cube, to trusted recipients, or
    refused (:func:`~._dump.dump_private`)."""
    writer = f"{owner.__name__}.dump"
    original = _original(owner, "dump")
    types = list(memory_types or MEMORY_KINDS)
    seals = frozenset().union(*(memory_seals(getattr(self, f"_{kind}", None)) for kind in types))
    sealed = bool(seals) and not clear_allowed(Path(dir))
    if os.path.exists(dir) and os.listdir(dir):  # MemOS's own rule, before any work
        return original(self, dir, memory_types)
    act = getattr(self, "_act_mem", None) if "act_mem" in types else None
    if owner is not _general_cube() or (
            act is not None and getattr(type(act), "dump", None) not in _dump_replacements()):
        # Not the hook's layout (a NaiveMemCube, an activation memory with a dump of its own):
        # MemOS's dump, made in a RAM folder and encrypted there when it is private.
        if sealed:
            return dump_private(lambda clear: original(self, str(clear), memory_types),
                                Path(dir), seals, writer, named=in_force().recipients)
        return original(self, dir, memory_types)
    on_mismatch = _hook_settings().mismatch_action()
    if sealed:
        return dump_private(lambda clear: dump_cube(self, clear, memory_types,
                                                    on_mismatch=on_mismatch),
                            Path(dir), seals, writer, named=in_force().recipients)
    dump_cube(self, Path(dir), memory_types, on_mismatch=on_mismatch)
    return None


MEMORY_KINDS = ("text_mem", "act_mem", "para_mem", "pref_mem")


def _text_dump(owner: Any) -> Any:
    """``owner.dump`` (a text or preference memory) under the hook: MemOS's own dump, unless
    the memory holds a private cube's memories (a seal on it, or on the database it reads them
    back from): then a private cube of its file, or a refusal."""

    def dump(self: Any, dir: str, *args: Any, **kwargs: Any) -> Any:
        original, writer, target = _original(owner, "dump"), f"{owner.__name__}.dump", Path(dir)
        seals = seals_of(self)
        if not seals or clear_allowed(target):
            if not seals:
                refuse_clear_into_private(target, writer)
            return original(self, dir, *args, **kwargs)
        return dump_private(lambda clear: original(self, str(clear), *args, **kwargs),
                            target, seals, writer, named=in_force().recipients)

    dump.__doc__ = _text_dump.__doc__
    return dump


def _text_load(owner: Any) -> Any:
    """``owner.load`` (a text or preference memory) under the hook: a folder without a lock is
    MemOS's to read, as before; a packed one is verified first; a private one is opened in
    memory (``CUBEPACK_IDENTITY``), its store checked (a persistent database must be named),
    and the memory sealed before anything is loaded into it, so every later dump of it (or of
    its database) is private."""

    @quietly(import_first=("memos",))
    def load(self: Any, dir: str, *args: Any, **kwargs: Any) -> Any:
        original, folder = _original(owner, "load"), Path(dir)
        state = _lock_state(folder)
        if state == "other":
            _refuse_unpacked(folder, state, _hook_settings())
        name = owner.__name__  # a kind may load a cube's memories of this class itself
        if state == "file" and already_verified(folder):
            # A cube load (GeneralMemCube.load, MOSCore.load) verified the folder: its
            # preferences are still the kind's to load, by the lock it verified (MemOS's own
            # load of them loads nothing and says nothing).
            lock = verified_lock(folder)
            if lock is not None and _kind_loads(self, name, folder, lock, _hook_settings()):
                return None
            return original(self, dir, *args, **kwargs)
        if state != "file":
            return original(self, dir, *args, **kwargs)
        current = _hook_settings()
        identity = identity_path(None)
        verified = verify(folder, current.for_folder(), decrypt_with=identity)
        if not is_private(verified.lock):
            if _kind_loads(self, name, folder, verified.lock, current):
                return None
            return original(self, dir, *args, **kwargs)
        if identity is None:
            raise UsageError(f"{folder} is a private cube; loading it needs an identity: set "
                             "CUBEPACK_IDENTITY to a key file it is encrypted to.")
        store = instance_store(self)
        if store is not None:
            refuse_persistent([(owner.__name__, store)], in_force().stores, folder)
        with open_private(folder, identity, public_lock=verified.lock) as opened:
            seal(self, [loaded_seal(folder, opened.manifest, opened.public_lock,
                                    signed_by=verified.signed_by)])
            if _kind_loads(self, name, opened.folder, opened.lock, current,
                           shown=folder):
                return None
            return original(self, str(opened.folder), *args, **kwargs)

    load.__doc__ = _text_load.__doc__
    return load


def _kind_loads(memory: Any, name: str, folder: Path, lock: Any, policy: Any, *,
                shown: Path | None = None) -> bool:
    """Load ``memory`` (of the MemOS class ``name``) by the kind that replaces that class's own
    load for this cube (``kinds.memos_owner``), checked by it; False: none does, MemOS's own
    load runs."""
    kind = memos_owner(lock, name)
    if kind is None:
        return False
    memory.cubepack = HookReport(cube_dir=shown or folder, verified=True)
    load_verified(LoadJob(folder, lock, policy, {kind.memos_memory: memory}, memory.cubepack,
                          seals=seals_of(memory)))
    return True


def _named_store(owner: Any, kind: str) -> Any:
    """``VecDBFactory.from_config`` / ``GraphStoreFactory.from_config`` under the hook: the
    database client MemOS makes is named with its store as it is now (a relative path names
    the folder it opens now), so a seal on that store finds it however its memory's config
    spells the path later."""

    def from_config(cls: Any, config_factory: Any) -> Any:
        return record_store(_original(owner, "from_config").__func__(cls, config_factory),
                            config_factory, kind)

    from_config.__doc__ = _named_store.__doc__
    return classmethod(from_config)


def _sealed_update(self: Any, new_memories: Any, label: Any, user_id: Any, mem_cube_id: Any,
                   mem_cube: Any) -> Any:
    """The scheduler's ``update_activation_memory`` under the hook: it extracts caches from the
    cube's text memories into its activation memory and dumps that, so the activation memory
    is sealed with what seals the cube's memories first (its dump is then private)."""
    from memos.mem_scheduler.memory_manage_modules.activation_memory_manager import (
        ActivationMemoryManager,
    )

    seal(getattr(mem_cube, "_act_mem", None), cube_seals(mem_cube))
    return _original(ActivationMemoryManager, "update_activation_memory")(
        self, new_memories, label, user_id, mem_cube_id, mem_cube)


@quietly(import_first=("memos",))
def _register_mem_cube(self: Any, mem_cube_name_or_path: Any, mem_cube_id: str | None = None,
                       user_id: str | None = None) -> None:
    """``MOSCore.register_mem_cube`` under the hook: MemOS's own method (its user check, its
    "already registered" skip, its exists/remote choice and the path it records), with loads
    named after this call in messages. MemOS 2.0.33 reads ``text_mem.config`` of every cube it
    registers, so a cube without a text memory (activations only) crashed with ``'NoneType'
    object has no attribute 'config'``; such a cube gets a placeholder text memory (falsy, so
    MemOS's own ``if cube.text_mem`` checks skip it) for the call."""
    token, flag = (_CALLER.set(f"{type(self).__name__}.register_mem_cube"),
                   _REGISTERING.set(True))
    for cube in [mem_cube_name_or_path, *self.mem_cubes.values()]:
        _placeholder(cube)  # a cube MemOS already holds is read again (re-register, new user)
    try:
        return _original(_mos_core(), "register_mem_cube")(self, mem_cube_name_or_path,
                                                            mem_cube_id, user_id)
    finally:
        _CALLER.reset(token)
        _REGISTERING.reset(flag)
        for cube in [mem_cube_name_or_path, *self.mem_cubes.values()]:
            if isinstance(getattr(cube, "_text_mem", None), _NoTextMemory):
                cube._text_mem = None


_REGISTERING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "cubepack_memos_registering", default=False)


def _placeholder(cube: Any) -> Any:
    if _REGISTERING.get() and hasattr(cube, "_text_mem") and cube._text_mem is None:
        cube._text_mem = _NoTextMemory()
    return cube


class _NoTextMemory:
    """Stands in for an absent text memory while MemOS registers a cube (see above)."""

    config = None

    def __bool__(self) -> bool:
        return False


def _lock_state(folder: Path) -> str:
    lock = folder / constants.LOCK_FILENAME
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        return "other"
    return "file" if lock.is_file() else "absent"


def _refuse_unpacked(folder: Path, state: str, current: TrustPolicy) -> None:
    """An unpacked folder (no lock) can satisfy none of what a lock carries: the policy is
    honoured whole, so each such requirement refuses it (recomputation, which the loaded model
    runs, is the one proof it can get)."""
    if state == "other":
        raise UnsafeInputError(f"{folder / constants.LOCK_FILENAME} is not a regular file; "
                               "refusing the cube (a packed cube's lock is a plain file).")
    if current.asks(Catalogue.SIGNATURE) or current.asks(Catalogue.LINEAGE):
        raise SignatureError(f"{folder} holds no cubepack.lock, so it cannot carry a trusted "
                             "signature or attestation, and the hook requires one; pack and "
                             "sign it (cubepack pack --sign-key) or load it with another install.")
    # Recomputing proves what a lock would have: `recomputed` only when every position is
    # (a sampled check, recompute_tokens, proves `recorded`, as it does for a packed cube).
    unmet = [name for name, asked in (
        ("strict_models", current.asks(Catalogue.MODEL_IDENTITY)),
        ("require_provenance", current.asks(Catalogue.PROVENANCE)
         and not current.proves_by_recomputing())) if asked]
    if unmet:
        raise RefusedError(f"{folder} holds no cubepack.lock, so it pins no model and records no "
                           f"provenance, and the hook requires {' and '.join(unmet)}; pack it "
                           "(cubepack pack) first, or install the hook with recompute=True to "
                           "prove its caches with the model MemOS loads.")


def _dump_replacements() -> list[Any]:
    return [replacement for (_, name), replacement in _STATE["replacements"].items()
            if name == "dump"]


def _general_cube() -> Any:
    from memos.mem_cube.general import GeneralMemCube

    return GeneralMemCube


def _kv_memory() -> Any:
    from memos.memories.activation.kv import KVCacheMemory

    return KVCacheMemory


def _naive_cube() -> Any:
    from memos.mem_cube.navie import NaiveMemCube

    return NaiveMemCube


def _mos_core() -> Any:
    from memos.mem_os.core import MOSCore

    return MOSCore

