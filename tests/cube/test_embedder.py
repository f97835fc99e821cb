"""The embedder is pinned for textual memories that hold vectors: a live embedder must
reproduce a sample of the cube's own vectors. Real components: a tiny transformers encoder,
an OpenAI-compatible server on loopback running it, MemOS's own ``universal_api`` backend (in
the memos environment), and MemOS's example cube with its 768-dim vectors."""

from __future__ import annotations

import json
import shutil
import uuid

import pytest

import cubepack
from cubepack._util import constants
from cubepack.testing.embeddings import EmbeddingServer, build_encoder

TEXTS = ["The user loves the Eiffel Tower.", "The user drinks green tea every morning.",
         "The user's sister lives in Lyon."]
from data import EXAMPLES


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoders")
    return {"e": build_encoder(root / "e", seed=0), "other": build_encoder(root / "o", seed=1),
            "wide": build_encoder(root / "w", seed=0, hidden=48)}


def embed_with_memos_or_server(server, texts):
    """Vectors as MemOS makes them: through its own universal_api backend when MemoryOS is
    installed, else through the same OpenAI-compatible protocol."""
    try:
        from memos.configs.embedder import EmbedderConfigFactory
        from memos.embedders.factory import EmbedderFactory
    except ImportError:
        from cubepack.kinds.vectors._embedder import embed

        return embed(server.spec, texts)
    embedder = EmbedderFactory.from_config(EmbedderConfigFactory.model_validate({
        "backend": "universal_api", "config": {"provider": "openai", "api_key": "x",
                                               "base_url": server.url,
                                               "model_name_or_path": server.model_name}}))
    return embedder.embed(texts)


@pytest.fixture
def cube(tmp_path, encoders, zoo):
    """A cube whose general-text memory holds vectors the encoder ``e`` made."""
    from memos_format import memos_config

    cube = tmp_path / "cube"
    cube.mkdir()
    with EmbeddingServer(encoders["e"]) as server:
        vectors = embed_with_memos_or_server(server, TEXTS)
    memories = [{"id": str(uuid.UUID(int=i + 1)), "vector": vector, "payload": {"memory": text}}
                for i, (text, vector) in enumerate(zip(TEXTS, vectors))]
    (cube / "textual_memory.json").write_text(json.dumps(memories))
    config = memos_config(str(zoo["a"]))
    config["text_mem"] = {"backend": "general_text", "config": {
        "memory_filename": "textual_memory.json",
        "embedder": {"backend": "universal_api", "config": {"model_name_or_path": "tiny"}}}}
    (cube / "config.json").write_text(json.dumps(config))
    cubepack.pack(cube)
    return cube


def test_pack_records_the_vectors_and_the_embedder_that_made_them_passes(cube, encoders):
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    record = lock["models"]["text_mem.embedder"]["vectors"]
    assert (record["dimension"], record["count"], len(record["sample"])) == (32, 3, 3)
    assert "32 dimensions" in (cube / "README.md").read_text()
    with EmbeddingServer(encoders["e"]) as server:
        report = cubepack.verify(cube, embedder=server.spec)
        assert server.calls == 1  # the whole sample in one batched call
    checks = [c for c in report.checks if c.name == "embedder"]
    assert len(checks) == 3 and all(c.ok for c in checks)
    assert cubepack.verify(cube, embedder=str(encoders["e"])).ok  # a local folder, too


def test_pack_with_the_embedder_records_its_probe_fingerprint(cube, encoders):
    with EmbeddingServer(encoders["e"]) as server:
        cubepack.pack(cube, embedder=server.spec)
        lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
        assert len(lock["models"]["text_mem.embedder"]["vectors"]["probes"]) == 4
        server.calls = 0
        report = cubepack.verify(cube, embedder=server.spec)
        assert server.calls == 2  # the sample and the probes: two batched calls, no more
    assert sum(1 for c in report.checks if c.name == "embedder" and c.ok) == 3 + 4
    with EmbeddingServer(encoders["other"]) as other:
        with pytest.raises(cubepack.IdentityMismatch, match="--embedder did not make"):
            cubepack.pack(cube, embedder=other.spec)


def test_another_embedder_of_the_same_dimension_is_refused(cube, encoders):
    with EmbeddingServer(encoders["other"]) as server:
        with pytest.raises(cubepack.VerificationFailed, match="another embedder made these"):
            cubepack.verify(cube, embedder=server.spec)


def test_an_embedder_of_another_dimension_is_refused_naming_both(cube, encoders):
    with pytest.raises(cubepack.VerificationFailed) as caught:
        cubepack.verify(cube, embedder=str(encoders["wide"]))
    failure = caught.value.failures[0]
    assert (failure.expected, failure.found) == (32, 48) and "48-dimensional" in failure.detail


@pytest.mark.skipif(not (EXAMPLES / "mem_cube_2").is_dir(), reason="no MemOS example cubes")
def test_mem_cube_2s_768_dim_vectors_refuse_a_stand_in_embedder(tmp_path, qwen3_snapshot,
                                                                 monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # its models resolve through the HF cache only
    cube = tmp_path / "mem_cube_2"
    shutil.copytree(EXAMPLES / "mem_cube_2", cube)
    (cube / "activation_memory.pickle").unlink()  # the text memory is what this test is about
    cubepack.pack(cube)
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    record = lock["models"]["text_mem.embedder"]["vectors"]
    assert (record["dimension"], record["count"]) == (768, 2)
    stand_in = build_encoder(tmp_path / "stand-in", seed=3, hidden=768)
    with pytest.raises(cubepack.VerificationFailed, match="cosine"):
        cubepack.verify(cube, embedder=str(stand_in))


# --- the MemOS hook: the embedder MemOS loads must reproduce the vectors --------------------

@pytest.fixture
def text_cube(tmp_path, encoders, zoo):
    """A real MemOS general-text cube (Qdrant in local mode, MemOS's universal_api embedder on a
    loopback server running encoder ``e``), dumped by MemOS and packed."""
    pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")
    pytest.importorskip("qdrant_client", reason="MemOS's general text memory needs Qdrant")
    from memos.mem_cube.general import GeneralMemCube

    server = EmbeddingServer(encoders["e"]).__enter__()
    cube = GeneralMemCube(text_config(tmp_path / "qdrant-source", server, zoo))
    cube.text_mem.add([{"memory": text, "metadata": {}} for text in TEXTS])
    cube.dump(str(tmp_path / "cube"))
    cubepack.pack(tmp_path / "cube")
    yield tmp_path / "cube", server
    server.__exit__(None, None, None)


def text_config(qdrant_path, server, zoo):
    from memos.configs.mem_cube import GeneralMemCubeConfig

    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(zoo["a"])}}
    return GeneralMemCubeConfig.model_validate({
        "user_id": "u", "cube_id": "u/text_cube", "act_mem": {"backend": "uninitialized"},
        "text_mem": {"backend": "general_text", "config": {
            "extractor_llm": llm,
            "vector_db": {"backend": "qdrant", "config": {
                "collection_name": "text_cube", "vector_dimension": 32,
                "distance_metric": "cosine", "path": str(qdrant_path)}},
            "embedder": {"backend": "universal_api", "config": {
                "provider": "openai", "api_key": "x", "base_url": server.url,
                "model_name_or_path": server.model_name}}}}})


@pytest.mark.parametrize("policy", ["error", "drop", "rebuild"])
def test_the_hook_checks_the_loaded_embedder_and_applies_the_policy(text_cube, encoders, zoo,
                                                                    tmp_path, policy):
    import cubepack.memos as hook

    cube_dir, server = text_cube
    same = hook.init_from_dir(cube_dir, memory_types=["text_mem"],
                              default_config=text_config(tmp_path / "q1", server, zoo))
    assert same.cubepack.embedder_verified and len(same.text_mem.get_all()) == 3
    with EmbeddingServer(encoders["other"]) as other:
        swapped = text_config(tmp_path / f"q-{policy}", other, zoo)
        if policy == "error":
            with pytest.raises(cubepack.IdentityMismatch, match=r"vectors\[.*\]\.cosine"):
                hook.init_from_dir(cube_dir, memory_types=["text_mem"], default_config=swapped)
            return
        loaded = hook.init_from_dir(cube_dir, memory_types=["text_mem"], default_config=swapped,
                                    on_mismatch=policy)
        if policy == "drop":
            assert loaded.text_mem.get_all() == [] and "text_mem.embedder" in loaded.cubepack.dropped
            return
        assert "text_mem.embedder" in loaded.cubepack.rebuilt
        from cubepack.kinds.vectors._vectors import cosine

        [vector] = loaded.text_mem.embedder.embed([TEXTS[0]])
        stored = {item.payload["memory"]: item.vector
                  for item in loaded.text_mem.vector_db.get_all()}
        assert cosine(stored[TEXTS[0]], vector) > 0.999  # re-embedded: now in the live space


# --- the check reads the memory itself: attacks on the record -------------------------------------

def _memories(cube):
    return json.loads((cube / "textual_memory.json").read_text())


def _rewrite_memories(cube, memories, *, record=None):
    """Replace the text memory (and, as an attacker with write access, re-seal the lock over it
    with a record of the attacker's choice)."""
    from cubepack._util import hashing

    from helpers import reseal_lock

    path = cube / "textual_memory.json"
    path.write_text(json.dumps(memories))
    digest, size = hashing.sha256_file(path), path.stat().st_size

    def change(lock):
        lock["files"]["textual_memory.json"] = {"sha256": digest, "size": size}
        pin = lock["models"]["text_mem.embedder"]
        if record is None:
            pin["vectors"].update(count=len(memories))
        elif record == "remove":
            del pin["vectors"]
        else:
            pin["vectors"] = record(pin["vectors"])
    reseal_lock(cube, change)


def test_honest_memories_first_in_sorted_order_cannot_hide_foreign_ones(cube, encoders):
    """The sample is the verifier's own draw, not the first ids in sorted order: 3 honest
    memories with the smallest ids and 40 made by another embedder are refused."""
    honest = _memories(cube)
    texts = [f"Foreign memory number {i}." for i in range(40)]
    with EmbeddingServer(encoders["other"]) as other:
        foreign = [{"id": f"zz-{i:03d}", "vector": vector, "payload": {"memory": text}}
                   for i, (text, vector) in enumerate(zip(texts, embed_with_memos_or_server(
                       other, texts)))]
    _rewrite_memories(cube, honest + foreign)
    with EmbeddingServer(encoders["e"]) as server:
        report = cubepack.verify(cube, embedder=server.spec, raise_on_failure=False)
    assert not report.ok
    bad = [c for c in report.checks if c.name == "embedder" and c.ok is False]
    assert bad and all("zz-" in c.subject for c in bad)
    assert "drawn at random (seed" in bad[0].detail


@pytest.mark.parametrize("attack", ["remove the record", "point it at a decoy",
                                    "point it outside", "point it at a FIFO", "duplicate ids",
                                    "change the count"])
def test_the_record_cannot_steer_or_skip_the_check(cube, encoders, tmp_path, attack):
    import os
    import subprocess
    import sys

    memories = _memories(cube)
    if attack == "duplicate ids":
        memories = memories + [dict(memories[0], vector=[0.0] * 31 + [1.0])]
        _rewrite_memories(cube, memories)
    elif attack == "remove the record":
        _rewrite_memories(cube, memories, record="remove")
    elif attack == "change the count":
        _rewrite_memories(cube, memories, record=lambda r: dict(r, count=1))
    else:
        target = {"point it at a decoy": "README.md", "point it outside": "../../etc/passwd",
                  "point it at a FIFO": str(tmp_path / "fifo")}[attack]
        if attack == "point it at a FIFO":
            os.mkfifo(target)
        _rewrite_memories(cube, memories, record=lambda r: dict(r, file=target))
    # In a subprocess with a generous deadline, so a check that blocks on a FIFO fails the
    # test instead of hanging it.
    with EmbeddingServer(encoders["e"]) as server:
        done = subprocess.run([sys.executable, "-m", "cubepack", "verify", str(cube),
                               "--embedder", server.spec, "--json"], capture_output=True,
                              text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    if attack == "point it outside":
        assert "'..' segment" in report["error"]["message"] or not report["ok"]
        return
    failed = [c for c in report["report"]["checks"] if c["ok"] is False]
    assert failed, report


def test_probe_vectors_are_a_claim_and_a_cube_without_vectors_refuses_an_embedder(
        cube, encoders, tmp_path):
    with EmbeddingServer(encoders["e"]) as server:
        cubepack.pack(cube, embedder=server.spec)
        report = cubepack.verify(cube, embedder=server.spec)
    probes = [c for c in report.checks if c.name == "embedder" and c.subject.startswith("probe")]
    memories = [c for c in report.checks if c.name == "embedder" and c not in probes]
    assert {c.basis for c in probes} == {"claimed"} and {c.basis for c in memories} == {"proved"}
    # Spoofed probes (another embedder's) say nothing about the memories: they are refused.
    with EmbeddingServer(encoders["other"]) as other:
        spoofed = [[round(x, 6) for x in v] for v in embed_with_memos_or_server(
            other, ["The user likes green tea.", "Paris is the capital of France.",
                    "def add(a, b): return a + b", "Numbers: 3.14159, 2024, -7."])]
    _rewrite_memories(cube, _memories(cube), record=lambda r: dict(r, probes=spoofed))
    with EmbeddingServer(encoders["e"]) as server:
        with pytest.raises(cubepack.VerificationFailed, match="probe"):
            cubepack.verify(cube, embedder=server.spec)
    plain = tmp_path / "plain"
    shutil.copytree(cube, plain)
    (plain / "textual_memory.json").write_text("[]")
    cfg = json.loads((plain / "config.json").read_text())
    (plain / "config.json").write_text(json.dumps(cfg))
    cubepack.pack(plain)
    with pytest.raises(cubepack.VerificationFailed, match="holds no vectors") as refused:
        cubepack.verify(plain, embedder=str(encoders["e"]))
    # the fix is the check's own (drop --embedder), not another pull of intact bytes
    assert "drop --embedder" in str(refused.value)
    assert "pull or pack it again" not in str(refused.value)
    assert cubepack.verify(plain).ok


def test_another_spelling_of_the_memory_file_cannot_hide_its_vectors(cube, encoders):
    """config.json naming './textual_memory.json' opens the same file in MemOS: its vectors
    are that file's, so a removed record is still refused (whatever the spelling)."""
    from cubepack._util import hashing
    from cubepack.kinds.vectors._embedder import vector_sources

    from helpers import reseal_lock

    config = json.loads((cube / "config.json").read_text())
    config["text_mem"]["config"]["memory_filename"] = "./textual_memory.json"
    (cube / "config.json").write_text(json.dumps(config))
    digest, size = hashing.sha256_file(cube / "config.json"), (cube / "config.json").stat().st_size

    def change(lock):
        lock["files"]["config.json"] = {"sha256": digest, "size": size}
        del lock["models"]["text_mem.embedder"]["vectors"]
    reseal_lock(cube, change)
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    with pytest.raises(cubepack.IntegrityError, match="the lock records no embedder"):
        vector_sources(cube, config, list(lock["files"]), None)
    with pytest.raises(cubepack.VerificationFailed, match="records no embedder"):
        cubepack.verify(cube, embedder=str(encoders["e"]))


def test_every_memory_can_be_re_embedded_so_a_few_foreign_vectors_cannot_hide(cube, encoders):
    honest = _memories(cube)
    many = [dict(honest[i % 3], id=f"m-{i:03d}") for i in range(60)]
    with EmbeddingServer(encoders["other"]) as other:
        [foreign] = embed_with_memos_or_server(other, [TEXTS[0]])
    many[37] = dict(many[37], vector=foreign)
    _rewrite_memories(cube, many)
    with EmbeddingServer(encoders["e"]) as server:
        report = cubepack.verify(cube, embedder=server.spec, embedder_sample=0,
                                 raise_on_failure=False)
    bad = [c.subject for c in report.checks if c.name == "embedder" and c.ok is False]
    assert bad == ["textual_memory.json (m-037)"]
    assert "all 60 memories" in next(c.detail for c in report.checks if c.name == "embedder")


def test_a_text_memory_export_without_config_json_packs_with_a_cube_id_and_loads(
        text_cube, zoo, tmp_path, encoders):
    """Only the memory file and a cube id: pack records its vectors; the hook needs to be told
    how MemOS holds it (default_config), checks the vectors against that embedder, loads."""
    import cubepack.memos as hook

    cube_dir, server = text_cube
    export = tmp_path / "export"
    export.mkdir()
    shutil.copy(cube_dir / "textual_memory.json", export / "textual_memory.json")
    cubepack.pack(export, cube_id="u/exported")
    lock = json.loads((export / constants.LOCK_FILENAME).read_text())
    assert lock["cube_id"] == "u/exported" and lock["models"]["text_mem.embedder"]["vectors"]
    with pytest.raises(cubepack.UsageError, match="default_config"):
        hook.init_from_dir(export)
    loaded = hook.init_from_dir(export, default_config=text_config(tmp_path / "q", server, zoo))
    assert loaded.config.cube_id == "u/exported" and loaded.cubepack.embedder_verified
    assert sorted(m.memory for m in loaded.text_mem.get_all()) == sorted(TEXTS)
    with EmbeddingServer(encoders["other"]) as other:
        with pytest.raises(cubepack.IdentityMismatch, match="cosine"):
            hook.init_from_dir(export, default_config=text_config(tmp_path / "q2", other, zoo))
