"""Adversary #39: the hook's re-embedding check of a cube's preferences zips the live
embedder's answer with the items it drew, so an answer short of them checks fewer items, and
an empty one checks none: the load passes as checked.

Promise (docs/how-to/share-memos-cube.md, "Loaded by the hook, item by item"): the items are
"counted against the lock, their vectors re-embedded by the embedder MemOS built
(``on_mismatch`` decides...)".

Attack: the embedder MemOS built answers one vector fewer than it was asked for (a proxy that
drops the last item of a batch), or none. What happened: the check compared what came back,
found no mismatch, and the hook loaded every preference, those never re-embedded included.
"""

from __future__ import annotations

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

from preferences_memos import cube_config, dump_cube, memos_or_skip  # noqa: E402

import cubepack  # noqa: E402
import cubepack.memos as hook  # noqa: E402
from cubepack.testing.embeddings import EmbeddingServer, build_encoder  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with EmbeddingServer(build_encoder(tmp_path_factory.mktemp("enc") / "e", seed=0)) as running:
        yield running


@pytest.mark.parametrize("kept", [-1, 0], ids=["one short", "empty"])
def test_a_short_answer_of_the_live_embedder_is_refused(tmp_path, server, monkeypatch, kept):
    memos_or_skip()
    from memos.embedders.universal_api import UniversalAPIEmbedder

    folder = dump_cube(tmp_path / "cube", server)
    cubepack.pack(folder)
    embed = UniversalAPIEmbedder.embed
    monkeypatch.setattr(UniversalAPIEmbedder, "embed",
                        lambda self, texts: embed(self, texts)[:kept])
    with pytest.raises(cubepack.CubepackError, match="answered"):
        hook.init_from_dir(folder, default_config=cube_config(tmp_path / "s.db", server))
