"""cubepack: pin, lock, verify and share LLM memory cubes (MemOS MemCubes and KV caches).

The face of the package: the names most users need. The parts, each a subpackage with its own
face, layered one way (each imports only those above it in this list)::

    errors      the one error tree (it decides the CLI's exit codes)
    _util       canonical JSON, atomic writes, paths, hashing, revisions, settings (private)
    identity    ModelIdentity, compare, fingerprint          localhub  cubepack hub serve
    kv          the KV file: format (torch-free), torch side, recomputation
    format      the cube's files: the file-set rule, the lock's section registry,
                cubepack.yaml, the card, what a cube may hold, envelopes, diff
    memos_format  MemOS's config.json, its pickles (allow-list), its producer records
    memory      adapters, vectors and embedders, re-prefill   mlx, llamacpp  other runtimes
    trust       evidence (proved / signed / claimed), TrustPolicy, the report, keys,
                signatures, attestations, lineage
    ops         pack, verify, sign, migrate, upgrade, load_adapter: orchestration only
    hub         push, pull, verify_remote, lineage, open (one client: endpoint and token)
    memos       the MemOS hook: init_from_remote_repo, install, pack_cube
    cli, demo   the command line and ``make demo``

``import cubepack`` imports only the error tree; each other name imports its part when first
used (and no part imports torch, transformers or huggingface_hub at import time: they are
imported inside the functions that need them), so ``import cubepack`` and ``cubepack --help``
stay fast.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from ._version import __version__
from .errors import (
                     CubepackError,
                     FormatError,
                     HubError,
                     IdentityMismatch,
                     IntegrityError,
                     Mismatch,
                     ModelNotFoundError,
                     PartialCube,
                     PushConflict,
                     RecomputationFailed,
                     RefusedError,
                     SignatureError,
                     UnsafeInputError,
                     UnsupportedError,
                     UsageError,
                     VerificationFailed,
)

#: The part each other public name comes from, imported when first used (PEP 562): importing
#: the parts takes a second or more, and the command line must be running (its Ctrl-C handled,
#: ``--help`` answered) before that. ``from cubepack import pull`` works as ever.
_PARTS = {
    "hub": ("PullOptions", "PullResult", "PushOptions", "PushResult", "RemoteCube", "lineage",
            "open_cube", "pull", "push"),
    "identity": ("ModelIdentity", "fingerprint"),
    "kv": ("KVFileInfo", "prefill", "read_kv_header", "save_kv_cache"),
    "ops": ("CompactResult", "EncryptOptions", "MigrateOptions", "MigrateResult", "PackOptions",
            "PackResult", "RekeyOptions", "compact", "diff", "encrypt", "load_adapter",
            "load_kv_cache", "migrate", "pack", "rekey", "sign", "upgrade", "verify"),
    "trust": ("TrustPolicy", "VerifyReport"),
}
_PART_OF = {name: part for part, names in _PARTS.items() for name in names}


#: ``cubepack.open("owner/cube@REV")``: the hub's ``open_cube`` (the builtin's name only here).
_ALIASES = {"open": "open_cube"}


def __getattr__(name: str) -> object:
    if name in _ALIASES:
        value = __getattr__(_ALIASES[name])
        globals()[name] = value
        return value
    part = _PART_OF.get(name)
    if part is None:
        raise AttributeError(f"module 'cubepack' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{part}", __name__), name)
    globals()[name] = value  # once: later uses are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PART_OF) | set(_ALIASES))


if _TYPE_CHECKING:  # what type checkers and documentation tools read
    from .hub import (PullOptions, PullResult, PushOptions, PushResult, RemoteCube, lineage,
                      open_cube, pull, push)
    open = open_cube  # noqa: A001 - cubepack.open
    from .identity import ModelIdentity, fingerprint
    from .kv import KVFileInfo, prefill, read_kv_header, save_kv_cache
    from .ops import (
        CompactResult,
        EncryptOptions,
        MigrateOptions,
        MigrateResult,
        PackOptions,
        PackResult,
        RekeyOptions,
        compact,
        diff,
        encrypt,
        load_adapter,
        load_kv_cache,
        migrate,
        pack,
        rekey,
        sign,
        upgrade,
        verify,
    )
    from .trust import TrustPolicy, VerifyReport

#: ``cubepack.open`` is no name of ``__all__``: ``from cubepack import *`` must not shadow the
#: builtin; ``open_cube`` is the same function.
__all__ = [
    "CompactResult", "CubepackError", "EncryptOptions", "FormatError", "HubError",
    "IdentityMismatch", "IntegrityError", "KVFileInfo", "MigrateOptions", "MigrateResult",
    "Mismatch", "ModelIdentity", "ModelNotFoundError", "PackOptions", "PackResult",
    "PartialCube", "PullOptions", "PullResult", "PushConflict", "PushOptions", "PushResult",
    "RecomputationFailed", "RefusedError", "RekeyOptions", "RemoteCube", "SignatureError",
    "TrustPolicy", "UnsafeInputError", "UnsupportedError", "UsageError", "VerificationFailed",
    "VerifyReport", "__version__", "compact", "diff", "encrypt", "fingerprint", "lineage",
    "load_adapter", "load_kv_cache", "migrate", "open_cube", "pack", "prefill", "pull", "push",
    "read_kv_header", "rekey", "save_kv_cache", "sign", "upgrade", "verify",
]
