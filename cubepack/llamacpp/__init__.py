"""llama.cpp state files under cubepack's identity and proofs.

- ``_layout``: llama.cpp's session file (``llama_state_save_file``), read and written without
  llama.cpp or torch;
- ``_convert``: session file -> KV file in transformers' layout (:func:`import_state`) and back
  (:func:`export_state`), pinned to the GGUF's sha256 and the Hugging Face model it was
  converted from; no model is run;
- ``_runtime``: llama-cpp-python itself, imported inside functions: :func:`load`,
  :func:`save_state`, :func:`load_state` (refuses another GGUF or producer before llama.cpp
  sees the state; another runtime's cache only once llama.cpp recomputes it).
"""

from ._convert import export_state
from ._runtime import import_state, load, load_state, save_state

__all__ = ["export_state", "import_state", "load", "load_state", "save_state"]
