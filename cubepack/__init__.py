"""cubepack: pin, lock, verify and share LLM memory cubes (MemOS MemCubes and KV caches).

No module imported here imports torch or transformers at import time (they are imported inside
the functions that need them), so ``import cubepack`` and ``cubepack --help`` stay fast.
"""

from __future__ import annotations

from ._version import __version__
from .diff import diff
from .errors import (CubepackError, FormatError, HubError, IdentityMismatch, IntegrityError,
                     Mismatch, ModelNotFoundError, RecomputationFailed, RefusedError,
                     SignatureError, UnsafeInputError, UnsupportedError, UsageError,
                     VerificationFailed)
from .fingerprints import fingerprint
from .hub import PullResult, PushResult, pull, push
from .identity import ModelIdentity
from .kvfile import KVFileInfo, load_kv_cache, read_kv_header, save_kv_cache
from .pack import PackResult, pack
from .verify import VerifyReport, verify

__all__ = [
    "CubepackError", "FormatError", "HubError", "IdentityMismatch", "IntegrityError", "KVFileInfo",
    "Mismatch", "ModelIdentity", "ModelNotFoundError", "PackResult", "PullResult", "PushResult",
    "RecomputationFailed", "RefusedError", "UsageError",
    "SignatureError", "UnsafeInputError", "UnsupportedError", "VerificationFailed", "VerifyReport",
    "__version__", "diff", "fingerprint", "load_kv_cache", "pack", "pull", "push",
    "read_kv_header", "save_kv_cache", "verify",
]
