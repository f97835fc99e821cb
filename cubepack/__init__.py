"""cubepack: pin, lock, verify and share LLM memory cubes (MemOS MemCubes and KV caches).

The face of the package: the names most users need. The parts, each a subpackage with its own
face, layered one way (each imports only those above it in this list)::

    errors      the one error tree (it decides the CLI's exit codes)
    _util       canonical JSON, atomic writes, paths, hashing, revisions, settings (private)
    identity    ModelIdentity, compare, fingerprint          localhub  cubepack hub serve
    kv          the KV file: format (torch-free), torch side, recomputation
    cube        pack, verify, diff, upgrade, sign, migrate, load_adapter, the lock, the card,
                the trust policy
    hub         push, pull, verify_remote, lineage (one client carrying endpoint and token)
    memos       the MemOS hook: init_from_remote_repo, install, pack_cube
    cli, demo   the command line and ``make demo``

No module imported here imports torch, transformers or huggingface_hub at import time (they are
imported inside the functions that need them), so ``import cubepack`` and ``cubepack --help``
stay fast.
"""

from ._version import __version__
from .cube import (
    MigrateResult,
    PackResult,
    TrustPolicy,
    VerifyReport,
    diff,
    load_adapter,
    migrate,
    pack,
    sign,
    upgrade,
    verify,
)
from .errors import (
                     CubepackError,
                     FormatError,
                     HubError,
                     IdentityMismatch,
                     IntegrityError,
                     Mismatch,
                     ModelNotFoundError,
                     RecomputationFailed,
                     RefusedError,
                     SignatureError,
                     UnsafeInputError,
                     UnsupportedError,
                     UsageError,
                     VerificationFailed,
)
from .hub import PullResult, PushResult, lineage, pull, push
from .identity import ModelIdentity, fingerprint
from .kv import KVFileInfo, load_kv_cache, prefill, read_kv_header, save_kv_cache

__all__ = [
    "CubepackError", "FormatError", "HubError", "IdentityMismatch", "IntegrityError", "KVFileInfo",
    "MigrateResult", "Mismatch", "ModelIdentity", "ModelNotFoundError", "PackResult", "PullResult",
    "PushResult", "RecomputationFailed", "RefusedError", "SignatureError", "TrustPolicy",
    "UnsafeInputError", "UnsupportedError", "UsageError", "VerificationFailed", "VerifyReport",
    "__version__", "diff", "fingerprint", "lineage", "load_adapter", "load_kv_cache", "migrate",
    "pack", "prefill", "pull", "push", "read_kv_header", "save_kv_cache", "sign", "upgrade",
    "verify",
]
