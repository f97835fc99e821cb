"""The KV file: one KV cache per safetensors file, carrying its producer's identity.

- ``_format``: the format, read and validated without torch (:func:`read_kv_header`,
  :func:`check_kv_file`);
- ``_torch``: a transformers cache to tensors and back, zero-copy (:func:`save_kv_cache`,
  :func:`prefill`);
- ``_recompute``: proof by recomputation, the live model's prefill against the stored tensors,
  in whichever runtime loads the cache;
- ``_load``: the checked load, the producer check, then (for another runtime's cache, or when
  asked) a recomputation, then the cache; ``cubepack.load_kv_cache`` applies a trust policy
  to it (``cubepack.ops``).
"""

from ._format import KVFileInfo, check_kv_file, read_kv_header
from ._torch import prefill, save_kv_cache

__all__ = ["KVFileInfo", "check_kv_file", "prefill", "read_kv_header", "save_kv_cache"]
