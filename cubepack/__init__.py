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
    hub         push, pull, verify_remote, lineage (one client carrying endpoint and token)
    memos       the MemOS hook: init_from_remote_repo, install, pack_cube
    cli, demo   the command line and ``make demo``

No module imported here imports torch, transformers or huggingface_hub at import time (they are
imported inside the functions that need them), so ``import cubepack`` and ``cubepack --help``
stay fast.
"""

from ._version import __version__
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
from .kv import KVFileInfo, prefill, read_kv_header, save_kv_cache
from .ops import (
    MigrateResult,
    PackResult,
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

__all__ = [
    "CubepackError", "FormatError", "HubError", "IdentityMismatch", "IntegrityError", "KVFileInfo",
    "MigrateResult", "Mismatch", "ModelIdentity", "ModelNotFoundError", "PackResult", "PullResult",
    "PushResult", "RecomputationFailed", "RefusedError", "SignatureError", "TrustPolicy",
    "UnsafeInputError", "UnsupportedError", "UsageError", "VerificationFailed", "VerifyReport",
    "__version__", "diff", "encrypt", "fingerprint", "lineage", "load_adapter", "load_kv_cache", "migrate",
    "pack", "prefill", "pull", "push", "read_kv_header", "rekey", "save_kv_cache", "sign", "upgrade",
    "verify",
]
