"""cubepack: pin, lock, verify and share LLM memory cubes (MemOS MemCubes and KV caches).

The public API is re-exported here lazily, so ``import cubepack`` (and ``cubepack --help``) does
not import torch or transformers until a function that needs them is called.
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import (CubepackError, FormatError, HubError, IdentityMismatch, IntegrityError,
                     Mismatch, ModelNotFoundError, RefusedError, SignatureError, UnsafeInputError,
                     UnsupportedError)
from .identity import ModelIdentity

__version__ = "0.1.0"

_LAZY = {
    "fingerprint": "cubepack.fingerprints",
    "save_kv_cache": "cubepack.kvfile",
    "load_kv_cache": "cubepack.kvfile",
    "read_kv_header": "cubepack.kvfile",
    "KVFileInfo": "cubepack.kvfile",
}

__all__ = [
    "CubepackError", "FormatError", "HubError", "IdentityMismatch", "IntegrityError", "Mismatch",
    "ModelIdentity", "ModelNotFoundError", "RefusedError", "SignatureError", "UnsafeInputError",
    "UnsupportedError", "__version__", *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cubepack' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
