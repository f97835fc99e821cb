"""MLX-LM prompt caches under cubepack's identity and proofs.

- ``_layout``: mlx_lm's prompt cache file (``save_prompt_cache``), read and written without
  MLX or torch;
- ``_convert``: prompt cache -> KV file (:func:`import_prompt_cache`) and back
  (:func:`export_prompt_cache`), with the producer's identity (the folder MLX loaded, the
  dtype it ran in, the runtime); no model is run;
- ``_runtime``: MLX itself, imported inside functions: :func:`load` (recording the folder),
  :func:`prefill`, :func:`save_prompt_cache`, :func:`load_prompt_cache` (refuses another
  producer before MLX reads a tensor; another runtime's cache only once MLX recomputes it).
"""

from ._convert import export_prompt_cache
from ._runtime import (
    import_prompt_cache,
    load,
    load_prompt_cache,
    model_identity,
    prefill,
    save_prompt_cache,
)

__all__ = ["export_prompt_cache", "import_prompt_cache", "load", "load_prompt_cache",
           "model_identity", "prefill", "save_prompt_cache"]
