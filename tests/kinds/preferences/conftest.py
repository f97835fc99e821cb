"""Fixtures for the preference kind's tests: tiny encoders, loopback embedding servers, and
cube folders written by MemOS's own dump (see ``preferences_memos.py``)."""

from __future__ import annotations

import pytest

from cubepack.testing.embeddings import EmbeddingServer, build_encoder

from preferences_memos import dump_cube, memos_or_skip, naive_text_mem


@pytest.fixture(scope="session")
def pref_encoders(tmp_path_factory):
    root = tmp_path_factory.mktemp("pref-encoders")
    return {"e": build_encoder(root / "e", seed=0), "other": build_encoder(root / "o", seed=1)}


@pytest.fixture(scope="session")
def pref_server(pref_encoders):
    with EmbeddingServer(pref_encoders["e"]) as server:
        yield server


@pytest.fixture(scope="session")
def other_server(pref_encoders):
    with EmbeddingServer(pref_encoders["other"], model_name="other-embedder") as server:
        yield server


@pytest.fixture
def default_dump(tmp_path, pref_server):
    """A preference cube dumped by MemOS at its default configuration: its preferences in
    ``textual_memory.json`` (MemOS's default name)."""
    memos_or_skip()
    return dump_cube(tmp_path / "cube", pref_server)


@pytest.fixture
def named_dump(tmp_path, pref_server):
    """A cube holding a text memory and a preference memory, the preference memory's file named
    apart (the fix a collision's refusal gives)."""
    memos_or_skip()
    return dump_cube(tmp_path / "cube", pref_server, memory_filename="preference_memory.json",
                     text_mem=naive_text_mem())


@pytest.fixture
def installed():
    """The hook installed (no pin required) for one test, and removed after it."""
    import cubepack.memos as hook

    hook.uninstall()
    yield hook.install(require_pin=False)
    hook.uninstall()
