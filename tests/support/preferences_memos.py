"""Preference cubes written by MemOS's own dump (memos environment), generated per test
(the fixtures are in ``tests/kinds/preferences/conftest.py``).

MemOS 2.0.x's preference memory (``pref_mem``, backend ``pref_text``) runs only on Milvus:
it calls ``vector_db.add(collection, items)`` and ``get_all(collection)`` over the list of
collections its config names, which MemOS's Qdrant store neither takes (one collection, a
string) nor answers (``get_all(scroll_limit)``). Milvus Lite (``pymilvus`` with
``milvus-lite``, a file URI) is the Milvus that needs no server, so the cubes here are made
by the real stack: MemOS's ``GeneralMemCube`` at its own preference configuration
(``APIConfig.get_preference_memory_config()``: Milvus with the two collections, the naive
extractor, adder and retriever, ``memory_filename`` left at MemOS's default), MemOS's
``universal_api`` embedder on a loopback server running a tiny deterministic encoder
(``cubepack.testing.embeddings``), items added through MemOS's own adder, and the folder
written by ``GeneralMemCube.dump``.

One concession: MemOS's preference extractor builds a chunker on the ``gpt2`` tokenizer,
fetched from the Hub when the memory is constructed; the tests have no network, so its default
tokenizer is the ``character`` counter. The chunker only splits conversations for extraction
(an LLM's job, not run here); the dump and load paths never touch it.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from pathlib import Path

import pytest


PREFERENCES = [
    ("explicit_preference", "The user likes green tea in the morning.", "green tea"),
    ("explicit_preference", "The user wants every answer in French.", "answers in French"),
    ("implicit_preference", "The user seems to prefer short answers.", "short answers"),
    ("implicit_preference", "The user often asks about trains, not planes.", "trains"),
]
DIMENSION = 32



def memos_or_skip():
    pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
    pytest.importorskip("pymilvus", reason="MemOS's preference memory runs on Milvus")
    pytest.importorskip("milvus_lite", reason="Milvus Lite is the Milvus that needs no server")
    from memos.memories.textual.prefer_text_memory import spliter

    defaults = list(spliter.Splitter.__init__.__defaults__)
    defaults[4] = "character"  # see the module docstring: gpt2 would be fetched from the Hub
    spliter.Splitter.__init__.__defaults__ = tuple(defaults)


def pref_mem_config(milvus_uri: Path, server, *, memory_filename: str | None = None) -> dict:
    """MemOS's own preference memory configuration (``APIConfig.get_preference_memory_config``),
    with Milvus Lite at ``milvus_uri`` and the loopback embedder; ``memory_filename`` left at
    MemOS's default unless given."""
    config = {
        "extractor_llm": {"backend": "openai", "config": {
            "model_name_or_path": "unused", "api_key": "x", "api_base": "http://127.0.0.1:9/v1"}},
        "vector_db": {"backend": "milvus", "config": {
            "collection_name": ["explicit_preference", "implicit_preference"],
            "vector_dimension": DIMENSION, "distance_metric": "cosine",
            "uri": str(milvus_uri)}},
        "embedder": {"backend": "universal_api", "config": {
            "provider": "openai", "api_key": "x", "base_url": server.url,
            "model_name_or_path": server.model_name}},
        "extractor": {"backend": "naive", "config": {}},
        "adder": {"backend": "naive", "config": {}},
        "retriever": {"backend": "naive", "config": {}},
    }
    if memory_filename is not None:
        config["memory_filename"] = memory_filename
    return config


def cube_config(milvus_uri: Path, server, *, memory_filename: str | None = None,
                text_mem: dict | None = None, cube_id: str = "u/pref_cube"):
    memos_or_skip()
    from memos.configs.mem_cube import GeneralMemCubeConfig

    return GeneralMemCubeConfig.model_validate({
        "user_id": "u", "cube_id": cube_id,
        "text_mem": text_mem or {"backend": "uninitialized"},
        "pref_mem": {"backend": "pref_text", "config": pref_mem_config(
            milvus_uri, server, memory_filename=memory_filename)}})


def add_preferences(pref_mem, preferences=PREFERENCES) -> list[str]:
    """Add preferences through MemOS's own adder, each item made as MemOS's extractor makes it
    (``NaiveExtractor._process_single_chunk_*``: its metadata, the embedder's vector of its
    context summary)."""
    from memos.memories.textual.item import PreferenceTextualMemoryMetadata, TextualMemoryItem

    items = []
    for kind, summary, preference in preferences:
        metadata = PreferenceTextualMemoryMetadata(
            type="chat", preference_type=kind, dialog_id=str(uuid.uuid4()),
            original_text=f"user: {summary}\nassistant: Noted.",
            embedding=pref_mem.embedder.embed([summary])[0], preference=preference,
            created_at=datetime.now().isoformat(), user_id="u", session_id="s",
            mem_cube_id="u/pref_cube")
        items.append(TextualMemoryItem(id=str(uuid.uuid4()), memory=summary, metadata=metadata))
    added = pref_mem.add(items)
    assert len(added) == len(items), "MemOS's adder dropped a preference"
    return added


def dump_cube(folder: Path, server, *, memory_filename: str | None = None,
              text_mem: dict | None = None, preferences=PREFERENCES) -> Path:
    """A cube folder written by ``GeneralMemCube.dump``, its preferences added by MemOS."""
    memos_or_skip()
    from memos.mem_cube.general import GeneralMemCube

    cube = GeneralMemCube(cube_config(folder.parent / f"{folder.name}-milvus.db", server,
                                      memory_filename=memory_filename, text_mem=text_mem))
    add_preferences(cube.pref_mem, preferences)
    cube.dump(str(folder))
    return folder



def naive_text_mem() -> dict:
    """A text memory that needs no store (MemOS's naive_text: a list in its JSON file)."""
    return {"backend": "naive_text", "config": {"extractor_llm": {"backend": "openai", "config": {
        "model_name_or_path": "unused", "api_key": "x", "api_base": "http://127.0.0.1:9/v1"}}}}


def read_dump(folder: Path, name: str = "textual_memory.json") -> dict:
    return json.loads((folder / name).read_text())
