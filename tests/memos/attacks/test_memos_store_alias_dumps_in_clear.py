"""Adversary #37 item 1: a named persistent store is sealed by its name, not by what it is.

Promise (docs/how-to/private-cubes.md "Private in MemOS", Databases): "A named database is
sealed for the process: another memory reading it dumps private too."

Attack: name a Qdrant folder (``stores=["qdrant:/abs/qdrant"]``), load a private cube's text
memories into it (readers named, so its dumps are private), close it, then open the SAME
folder from another ``GeneralTextMemory`` whose config spells its path another way, and dump
that memory: ``/abs/sub/../qdrant``, a symlink to the folder, and a relative path
``qdrant`` read after a ``chdir`` (MemOS opens the client where the memory was built; the
store's name is taken from the current folder at each check).

What happened: ``_privacy.store_of`` names a store by ``Path(path).expanduser().absolute()``
(no ``..`` resolved, no symlink followed, the cwd of the moment), so each alias is another
"store", unsealed: ``GeneralTextMemory.dump`` reads the private memories back from the named
database and writes ``textual_memory.json`` in clear. (Servers have the same aliases:
``url`` against ``host``/``port``, ``localhost`` against ``127.0.0.1``.) Trailing and double
slashes held.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
pytest.importorskip("pyrage")
pytest.importorskip("qdrant_client")

from private_keys import age_keys  # noqa: E402
from private_memos_adv import OTHER, SECRET, clear_files, private_copy, unique  # noqa: E402

import cubepack.memos as hook  # noqa: E402
from cubepack import CubepackError  # noqa: E402
from cubepack.memos._privacy import private_folder  # noqa: E402


def _general_text(model, server, path):
    from memos_live import llm

    return {"backend": "general_text", "config": {
        "extractor_llm": llm(model),
        "embedder": {"backend": "universal_api", "config": {
            "provider": "openai", "api_key": "x", "base_url": server.url,
            "model_name_or_path": server.model_name}},
        "vector_db": {"backend": "qdrant", "config": {
            "collection_name": "private_texts", "vector_dimension": 32,
            "distance_metric": "cosine", "path": path}}}}


def test_another_spelling_of_a_named_store_is_the_same_sealed_store(zoo, tmp_path,
                                                                     monkeypatch):
    from memos.mem_cube.general import GeneralMemCube
    from memos.memories.textual.item import TextualMemoryItem

    from cubepack.testing.embeddings import EmbeddingServer, build_encoder

    from memos_live import cube_config

    keys = age_keys(tmp_path, "alice")
    monkeypatch.setenv("CUBEPACK_IDENTITY", str(keys["alice"][0]))
    store = tmp_path / "qdrant"
    (tmp_path / "sub").mkdir()
    os.symlink(store, tmp_path / "link")
    with EmbeddingServer(build_encoder(tmp_path / "encoder", seed=0)) as server:
        def cube_on(path):
            return GeneralMemCube(cube_config(zoo["a"], text_mem=_general_text(
                zoo["a"], server, path)))

        hook.uninstall()
        cube = cube_on(":memory:")
        cube.text_mem.add([TextualMemoryItem(memory=unique(text)) for text in (SECRET, OTHER)])
        clear = hook.pack_cube(cube, tmp_path / "clear")
        private = private_copy(clear, tmp_path / "private", [keys["alice"][1]])
        hook.install(require_pin=False, recipients=[keys["alice"][1]],
                     stores=[f"qdrant:{store.absolute()}"])
        try:
            named = cube_on(str(store)).text_mem
            named.load(str(private))
            assert len(named.get_all()) == 2
            named.vector_db.client.close()  # Qdrant's local mode locks its folder
            leaked = {}
            for name in ("sub/..", "symlink", "relative, then chdir"):
                monkeypatch.chdir(tmp_path)
                other = cube_on({"sub/..": str(tmp_path / "sub" / ".." / "qdrant"),
                                 "symlink": str(tmp_path / "link")}.get(name, "qdrant")).text_mem
                monkeypatch.chdir(tmp_path / "sub")
                assert len(other.get_all()) == 2  # the same database, the private memories
                target = tmp_path / ("dump-" + name.replace("/", "").replace(" ", ""))
                try:
                    other.dump(str(target))
                except CubepackError:
                    pass
                finally:
                    other.vector_db.client.close()
                if clear_files(target) or (target.exists() and not private_folder(target)):
                    leaked[name] = sorted(p.name for p in target.iterdir())
            assert leaked == {}, "the named store, spelled another way, dumped in clear"
        finally:
            hook.uninstall()
