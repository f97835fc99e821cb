"""The memory kinds a cube holds, one folder each, behind one declared interface
(:class:`Kind`, in ``_kind``) that the verbs in ``ops`` iterate, in :data:`KINDS`' order.

- ``activations``: KV caches (``activations/*.kv.safetensors``), pinned to their producer,
  proved by recomputation, re-prefilled by migrate, loaded by ``load_kv_cache``;
- ``adapters``: parametric memory, LoRA adapters in PEFT's layout, checked against PEFT's
  own rules (an allow-list, bounded), pinned to their base's weight shapes, loaded by
  ``load_adapter``;
- ``vectors``: a text memory's vectors and the embedder that makes them, proved by
  re-embedding, re-embedded by migrate;
- ``preferences``: MemOS's preference memory, its vectors pinned to their embedder as the
  text memory's are, its items loaded by the MemOS hook itself;
- ``_kind``: the :class:`Kind` protocol (its phases), the jobs its phases are handed
  (:class:`PackJob`, :class:`MigrateJob`) and pack's options (``PackOptions``);
- ``_results``: what ``pack`` and ``migrate`` return (each kind fills its fields).

A kind's rules are its own; what a verb does with them (the order of the phases: bytes
checked before anything is parsed, trust decided before anything is decrypted or loaded) is
``ops``'s. Adding a kind: ``docs/how-to/add-a-memory-kind.md``.
"""

from collections.abc import Mapping

from ..format.sections import Lock

from ._kind import Kind, LoadJob, MigrateJob, MigrateOptions, PackJob, PackOptions, made_pin
from ._results import MigrateResult, PackResult
from .activations import KIND as _ACTIVATIONS
from .adapters import KIND as _ADAPTERS
from .preferences import KIND as _PREFERENCES
from .vectors import KIND as _VECTORS

#: Every memory kind, in the order the verbs run their phases (and a report lists checks).
KINDS: tuple[Kind, ...] = (_ACTIVATIONS, _ADAPTERS, _VECTORS, _PREFERENCES)


def counted(files: int, counts: Mapping[str, int]) -> str:
    """``"N files, M KV caches"``: a private cube's files and each named kind's memories, as
    its public card and a report say them (``counts``: the kinds' ``counts``)."""
    return ", ".join([f"{files} files"] + [f"{counts.get(kind.section, 0)} {kind.noun}"
                                          for kind in KINDS if kind.noun and kind.section])


def memos_owned(lock: Lock, memory: str) -> bool:
    """Does a kind load the MemOS memory ``memory`` (``pref_mem``...) of a cube locked by
    ``lock`` itself, so that MemOS's own load of it is never called?"""
    return any(kind.memos_memory == memory and kind.memos_own(lock) for kind in KINDS)


def memos_owner(lock: Lock, memory_class: str) -> Kind | None:
    """The kind whose ``load_memos`` replaces the MemOS memory class ``memory_class``'s own
    load for the cube locked by ``lock`` (``PreferenceTextMemory``, for a cube holding
    preferences), or None: MemOS's own load runs."""
    return next((kind for kind in KINDS if memory_class in kind.memos_classes
                 and kind.memos_own(lock)), None)


def serving(verb: str) -> Kind:
    """The kind whose own load the public verb ``verb`` ends with."""
    return next(kind for kind in KINDS if kind.serves == verb)


__all__ = ["KINDS", "Kind", "LoadJob", "MigrateJob", "MigrateOptions", "MigrateResult", "PackJob",
           "PackOptions",
           "PackResult", "counted", "made_pin", "memos_owned", "memos_owner", "serving"]
