"""What the MemOS hook uses of the kinds beyond their face (``cubepack.kinds``) and the
``Kind`` protocol: the one declared seam into the kinds' folders from ``memos/``.

A cube's memories reach MemOS through every kind's ``load_memos`` phase; what is left here is
what the hook does with KV caches outside a cube's load, all of it the activations kind's
rules: a lockless folder's caches checked as a cube's are (:class:`Checking`), the checked
caches and prompts it places (:class:`LoadedCache`, :class:`LoadedPrompt`), a prompts file's
items checked for the served model (:func:`prompt_file_items`), a cache's use by a model
MemOS runs (:func:`use_problems`) and its rebuild for another (:func:`reprefill`), and the
names a dump writes. ``tests/kinds/test_memos_names_no_kind.py`` fails on any other import of a kind's
folder from ``memos/``.
"""

from .activations._memos import (
    UNKNOWN,
    UNKNOWN_FINDING,
    USE_ADVICE,
    USE_FINDING,
    Checking,
    LoadedCache,
    LoadedPrompt,
    note_unchecked,
    prompt_file_items,
    served_model,
    use_problems,
)
from .activations._pack import activation_filename, write_prompts
from .activations._reprefill import reprefill

__all__ = ["UNKNOWN", "UNKNOWN_FINDING", "USE_ADVICE", "USE_FINDING", "Checking",
           "LoadedCache", "LoadedPrompt", "activation_filename", "note_unchecked",
           "prompt_file_items", "reprefill", "served_model", "use_problems", "write_prompts"]
