"""Adversary #39: ``migrate --embedder`` of a preference cube states in its lineage that the
vectors came from an embedder "unnamed (config.json names no embedder)", while the parent's
lock pins the preference memory's embedder by name (``pref_mem.embedder``: ``tiny-embedder``).

Promise (docs/how-to/share-memos-cube.md, preference memories): ``migrate --embedder E``
re-embeds every item; a migration's lineage states what changed (the embedder, from and to),
and an attestation signs that statement. Principle 4: a claim never gains strength, and a
statement cubepack writes must be true.

What happened: the lineage's ``embedder`` change is the text memory's (vectors kind: the
``text_mem.embedder`` pin, absent here), and the preference kind only adds its count.
"""

from __future__ import annotations

import pytest

import cubepack
from cubepack._util import constants
from cubepack.format import _lock as lockfile

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")


def test_the_lineage_names_the_preference_embedder_it_replaced(default_dump, tmp_path,
                                                               pref_server, other_server):
    cubepack.pack(default_dump)
    parent = lockfile.parse((default_dump / constants.LOCK_FILENAME).read_bytes())
    assert parent.models["pref_mem.embedder"].name == pref_server.model_name
    cubepack.migrate(default_dump, out=tmp_path / "moved", embedder=other_server.spec)
    moved = lockfile.parse((tmp_path / "moved" / constants.LOCK_FILENAME).read_bytes())
    change = moved.lineage.to_dict()["changes"]["embedder"]
    assert change["from"] == pref_server.model_name, change
    assert change["to"] == other_server.spec
