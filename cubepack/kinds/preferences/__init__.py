"""Preferences: MemOS's preference memory (``pref_mem``), its items' dense vectors pinned to
the embedder that made them (the lock's ``preferences`` section), proved by re-embedding,
re-embedded by migrate, loaded by the MemOS hook item by item (never through MemOS's own load,
which swallows its validation error and loads nothing).

- ``_kind``: the kind's phases (:class:`Preferences`);
- ``_dump``: MemOS's dump read strictly; sparse vectors refused; the file-name collision with
  the text memory;
- ``_check``: the file against its lock entry, and the re-embedding check;
- ``_memos``: the load of the items into a live preference memory (its ``load_memos``).
"""

from ._kind import Preferences, preference_file

KIND = Preferences()

__all__ = ["KIND", "Preferences", "preference_file"]
