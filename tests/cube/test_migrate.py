"""``cubepack migrate``: a new packed cube for a new model and/or embedder, built from what the
old cube proves, with its lineage. Real tiny models A and B, a real encoder pair, real peft."""

from __future__ import annotations

import base64
import json
import math
import shutil
import uuid

import pytest
import torch

import cubepack
from cubepack._util import constants
from cubepack.format import _lock as lockfile
from cubepack.kinds.activations._reprefill import NO_IDS, OTHER_TOKENIZER
from cubepack.kinds.vectors import _migrate
from cubepack.testing.embeddings import EmbeddingServer, build_encoder

from helpers import build_cache, reseal_lock, tree_bytes
from memos_format import memos_config, write_cube

WITH_IDS = [5, 6, 7, 8, 9, 10, 11]


def add_kv_item(cube, model, item_id, ids, source_text=None):
    """An activation saved with its token ids (and, optionally, its source text)."""
    metadata = {"id": item_id, **({"source_text": source_text} if source_text else {})}
    cubepack.save_kv_cache(build_cache(model, torch.tensor([ids])),
                           cube / "activations" / f"{item_id}.kv.safetensors", producer=model,
                           token_ids=ids, metadata=metadata)


@pytest.fixture
def cube(tmp_path, zoo, models):
    """Model A's cube: one activation converted from MemOS's pickle (no token ids, a source
    text) and one saved with its token ids."""
    folder = write_cube(tmp_path / "cube", str(zoo["a"]),
                        {"no-ids": build_cache(models["a"], torch.tensor([[5, 6, 7, 8]]))},
                        texts={"no-ids": "The user likes green tea."})
    add_kv_item(folder, models["a"], "with-ids", WITH_IDS)
    cubepack.pack(folder, legacy_pickle=True)
    return folder


def lock_of(cube):
    return lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes()).to_dict()


def test_migrate_a_to_b_verifies_by_recomputation_against_b_and_leaves_a_untouched(
        cube, zoo, tmp_path):
    before = tree_bytes(cube)
    result = cubepack.migrate(cube, model=str(zoo["b"]), out=tmp_path / "new")
    assert tree_bytes(cube) == before
    new = result.cube_dir
    assert cubepack.verify(new, model=str(zoo["b"]), recompute=True).ok
    with pytest.raises(cubepack.VerificationFailed, match="weights_digest"):
        cubepack.verify(new, model=str(zoo["a"]))
    # the stored ids are prefilled as they are; the item without them re-tokenised, and said so
    assert result.activations["with-ids"] == {"tokens": len(WITH_IDS), "retokenized": None}
    assert result.activations["no-ids"]["retokenized"] == NO_IDS
    assert result.retokenized == ["no-ids"]
    assert cubepack.read_kv_header(new / "activations/with-ids.kv.safetensors").token_ids == WITH_IDS
    lock, b_weights = lock_of(new), cubepack.fingerprint(zoo["b"]).weights_digest
    for entry in lock["activations"].values():
        assert entry["provenance"]["kind"] == "recomputed"
        assert "recomputed by construction" in entry["provenance"]["detail"]
        assert b_weights in entry["provenance"]["detail"]
    assert "re-tokenised" in lock["activations"]["no-ids"]["provenance"]["detail"]
    config = json.loads((new / "config.json").read_text())
    assert config["act_mem"]["config"]["extractor_llm"]["config"]["model_name_or_path"] == \
        str(zoo["b"])
    parent = lock_of(cube)
    assert lock["lineage"]["parent"] == {
        "lock_digest": parent["digest"], "content_digest": parent["content_digest"],
        "cube_id": "u1/tiny_cube", "repo_id": None, "revision": None}
    change = lock["lineage"]["changes"]
    assert change["models"]["act_mem"] == {
        "from": str(zoo["a"]), "to": str(zoo["b"]),
        "from_weights": cubepack.fingerprint(zoo["a"]).weights_digest, "to_weights": b_weights}
    assert (change["retokenized"], change["reembedded"], change["adapters_dropped"]) == \
        (["no-ids"], 0, [])
    assert "embedder" not in change and lock["lineage"]["tool"] == "cubepack migrate"
    card = (new / "README.md").read_text()
    assert "## Derived from" in card and parent["digest"] in card
    assert f"act_mem: {zoo['a']} -> {zoo['b']}" in card
    assert "re-tokenised from their source text: 1" in card
    assert "## Derived from" not in (cube / "README.md").read_text()


def test_the_reprefilled_cache_is_bs_own_prefill(cube, zoo, models, tmp_path):
    new = cubepack.migrate(cube, model=str(zoo["b"]), out=tmp_path / "new").cube_dir
    loaded = cubepack.load_kv_cache(new / "activations/with-ids.kv.safetensors", models["b"])
    fresh = build_cache(models["b"], torch.tensor([WITH_IDS]))
    for mine, theirs in zip(loaded.layers, fresh.layers):
        assert torch.allclose(mine.keys, theirs.keys, atol=1e-5)
        assert torch.allclose(mine.values, theirs.values, atol=1e-5)


def test_pack_of_a_derived_cube_keeps_its_lineage(cube, zoo, tmp_path):
    new = cubepack.migrate(cube, model=str(zoo["b"]), out=tmp_path / "new").cube_dir
    recorded = lock_of(new)["lineage"]
    cubepack.pack(new)  # a re-pack, to sign it say: the lineage stays exactly as it was
    assert lock_of(new)["lineage"] == recorded and cubepack.verify(new).ok


def test_an_upgrade_of_a_derived_cube_keeps_its_lineage(cube, zoo, tmp_path):
    """upgrade re-packs the cube from a staging folder: it keeps what a re-pack keeps."""
    from adversarial import relock_file
    from helpers import as_format_2

    new = cubepack.migrate(cube, model=str(zoo["b"]), out=tmp_path / "new").cube_dir
    recorded = lock_of(new)["lineage"]
    for path in sorted((new / "activations").iterdir()):
        as_format_2(path, path)
        relock_file(new, path.relative_to(new).as_posix())
    assert cubepack.upgrade(new, zoo["b"]).upgraded
    assert lock_of(new)["lineage"] == recorded and cubepack.verify(new).ok


@pytest.mark.parametrize("change, says", [
    (lambda l: l["parent"].update(lock_digest="ab" * 31), "parent.lock_digest"),
    (lambda l: l["parent"].update(content_digest="A" * 64), "parent.content_digest"),
    (lambda l: l["parent"].update(repo_id="ns/cube", revision="main"), "parent.revision"),
    (lambda l: l["parent"].update(repo_id="ns/cube"), "given together"),
    (lambda l: l["parent"].update(extra=1), "parent must hold the keys"),
    (lambda l: l.update(signed=True), "must hold the keys"),
    (lambda l: l["changes"].update(reembedded=True), "reembedded"),
    (lambda l: l["changes"].update(reembedded=-1), "reembedded"),
    (lambda l: l["changes"].update(retokenized=["x", "x"]), "retokenized"),
    (lambda l: l["changes"].update(adapters_dropped="lora"), "adapters_dropped"),
    (lambda l: l["changes"].update(embedder={"from": "x"}), "changes.embedder"),
    (lambda l: l["changes"]["models"]["act_mem"].update(to=7), "changes.models.act_mem.to"),
    (lambda l: l["changes"].pop("models"), "changes must hold the keys"),
    (lambda l: l.update(tool=""), "tool"),
])
def test_a_malformed_lineage_is_refused_by_name(cube, zoo, tmp_path, change, says):
    new = cubepack.migrate(cube, model=str(zoo["b"]), out=tmp_path / "new").cube_dir
    reseal_lock(new, lambda lock: change(lock["lineage"]))
    with pytest.raises(cubepack.FormatError, match=says):
        lock_of(new)
    assert not cubepack.verify(new, raise_on_failure=False).ok


def test_the_lineage_is_covered_by_the_content_digest(cube, zoo, tmp_path):
    new = cubepack.migrate(cube, model=str(zoo["b"]), out=tmp_path / "new").cube_dir
    path = new / constants.LOCK_FILENAME
    lock = json.loads(path.read_text())
    lock["lineage"]["changes"]["retokenized"] = []
    body = {key: value for key, value in lock.items() if key != "digest"}
    from cubepack._util import canonical

    lock["digest"] = canonical.digest(body)  # the outer digest resealed, not the content's
    path.write_text(lockfile.dumps(lock))
    with pytest.raises(cubepack.FormatError, match="content_digest mismatch"):
        lock_of(new)


# --- refusals leave everything unchanged --------------------------------------------------------

def test_migrate_needs_a_model_or_an_embedder(cube, tmp_path):
    with pytest.raises(cubepack.UsageError, match="--model M and/or --embedder E"):
        cubepack.migrate(cube, out=tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_an_existing_out_is_refused_unless_empty(cube, zoo, tmp_path):
    out = tmp_path / "new"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = tree_bytes(cube), tree_bytes(out)
    with pytest.raises(cubepack.UsageError, match="not empty"):
        cubepack.migrate(cube, model=str(zoo["b"]), out=out)
    assert (tree_bytes(cube), tree_bytes(out)) == before
    with pytest.raises(cubepack.UsageError, match="inside the cube"):
        cubepack.migrate(cube, model=str(zoo["b"]), out=cube / "new")
    (out / "notes.txt").unlink()  # an empty folder is fine
    assert cubepack.migrate(cube, model=str(zoo["b"]), out=out).cube_dir == out
    assert cubepack.verify(out).ok


def test_a_cube_that_does_not_verify_is_refused_and_nothing_is_written(cube, zoo, tmp_path):
    kv = cube / "activations/with-ids.kv.safetensors"
    data = bytearray(kv.read_bytes())
    data[-1] ^= 1
    kv.write_bytes(bytes(data))
    before = tree_bytes(cube)
    with pytest.raises(cubepack.VerificationFailed, match="sha256"):
        cubepack.migrate(cube, model=str(zoo["b"]), out=tmp_path / "new")
    assert tree_bytes(cube) == before and sorted(p.name for p in tmp_path.iterdir()) == ["cube"]


def test_ids_another_tokenizer_cannot_reproduce_are_refused(tmp_path, zoo, models):
    """Stored ids mean nothing to a model with another tokenizer: without a source text to
    re-tokenise there is nothing it can rebuild the activation from."""
    cube = tmp_path / "cube"
    (cube / "activations").mkdir(parents=True)
    (cube / "config.json").write_text(json.dumps(memos_config(str(zoo["a"]))))
    add_kv_item(cube, models["a"], "ids-only", WITH_IDS)
    cubepack.pack(cube)
    before = tree_bytes(cube)
    with pytest.raises(cubepack.RecomputationFailed, match="tokenizer_digest") as caught:
        cubepack.migrate(cube, model=str(zoo["other_tok"]), out=tmp_path / "new")
    assert "records no source_text" in str(caught.value)
    assert tree_bytes(cube) == before and sorted(p.name for p in tmp_path.iterdir()) == ["cube"]


def test_another_tokenizer_re_tokenises_the_source_text_and_says_why(tmp_path, zoo, models):
    cube = tmp_path / "cube"
    (cube / "activations").mkdir(parents=True)
    (cube / "config.json").write_text(json.dumps(memos_config(str(zoo["a"]))))
    add_kv_item(cube, models["a"], "tea", WITH_IDS, source_text="The user likes green tea.")
    cubepack.pack(cube)
    result = cubepack.migrate(cube, model=str(zoo["other_tok"]), out=tmp_path / "new")
    assert result.activations["tea"]["retokenized"] == OTHER_TOKENIZER
    assert cubepack.verify(result.cube_dir, model=str(zoo["other_tok"]), recompute=True).ok


# --- adapters -----------------------------------------------------------------------------------

@pytest.fixture
def cube_with_adapter(cube, zoo, tmp_path):
    from peft import LoraConfig, get_peft_model

    from cubepack.testing import tiny

    peft_model = get_peft_model(tiny.load(zoo["a"]), LoraConfig(r=2, target_modules=["q_proj"]))
    peft_model.save_pretrained(cube / "parametric" / "tea")
    cubepack.pack(cube, adapter_base=str(zoo["a"]))
    return cube


def test_adapters_are_left_out_and_listed_when_the_model_changes(cube_with_adapter, zoo,
                                                                 tmp_path):
    result = cubepack.migrate(cube_with_adapter, model=str(zoo["b"]), out=tmp_path / "new")
    new = result.cube_dir
    assert result.adapters_dropped == {"tea": ["parametric/tea/README.md",  # saved by PEFT
                                               "parametric/tea/adapter_config.json",
                                               "parametric/tea/adapter_model.safetensors"]}
    assert not (new / "parametric").exists()
    assert "adapters" not in lock_of(new) and "adapter.tea" not in lock_of(new)["models"]
    assert lock_of(new)["lineage"]["changes"]["adapters_dropped"] == ["tea"]
    assert cubepack.verify(new).ok
    from cubepack.cli import _render_migrate

    assert "adapter tea: NOT migrated" in _render_migrate(result.to_dict())


def test_adapters_stay_when_only_the_embedder_changes(text_cube, encoders, zoo, tmp_path):
    from peft import LoraConfig, get_peft_model

    from cubepack.testing import tiny

    peft_model = get_peft_model(tiny.load(zoo["a"]), LoraConfig(r=2, target_modules=["q_proj"]))
    peft_model.save_pretrained(text_cube / "parametric" / "tea")
    cubepack.pack(text_cube, adapter_base=str(zoo["a"]))
    result = cubepack.migrate(text_cube, embedder=str(encoders["other"]), out=tmp_path / "new")
    assert result.adapters_dropped == {}
    assert (result.cube_dir / "parametric/tea/adapter_model.safetensors").is_file()
    kept, before = (lock_of(folder)["adapters"]["tea"] for folder in (result.cube_dir, text_cube))
    assert kept["digest"] == before["digest"] and kept["modules"] == before["modules"]


# --- the embedder ---------------------------------------------------------------------------------

TEXTS = [f"The user {verb} {thing}." for verb in ("likes", "drinks", "avoids", "mentions", "buys")
         for thing in ("green tea", "coffee", "long walks", "Paris", "the Eiffel Tower")]
QUERIES = ["What does the user drink?", "Where does the user travel?", "tea", "walking"]


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoders")
    return {"e": build_encoder(root / "e", seed=0), "other": build_encoder(root / "o", seed=1),
            "wide": build_encoder(root / "w", seed=2, hidden=48)}


@pytest.fixture
def text_cube(tmp_path, encoders, zoo):
    """A cube whose general text memory holds vectors the encoder ``e`` made."""
    from cubepack.kinds.vectors._embedder import embed

    cube = tmp_path / "text-cube"
    cube.mkdir()
    vectors = embed(str(encoders["e"]), TEXTS)
    memories = [{"id": str(uuid.UUID(int=i + 1)), "vector": vector, "payload": {"memory": text}}
                for i, (text, vector) in enumerate(zip(TEXTS, vectors))]
    (cube / "textual_memory.json").write_text(json.dumps(memories))
    config = memos_config(str(zoo["a"]))
    config["act_mem"] = {"backend": "uninitialized", "config": {}}
    config["text_mem"] = {"backend": "general_text", "config": {
        "memory_filename": "textual_memory.json",
        "embedder": {"backend": "universal_api", "config": {
            "provider": "openai", "base_url": "http://old", "model_name_or_path": "tiny-e"}}}}
    (cube / "config.json").write_text(json.dumps(config))
    cubepack.pack(cube)
    return cube


def top_k(query, texts_and_vectors, k=5):
    def cosine(a, b):
        return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) *
                                                            sum(y * y for y in b))
    ranked = sorted(texts_and_vectors, key=lambda tv: -cosine(query, tv[1]))
    return [text for text, _ in ranked[:k]]


def test_a_migrated_embedder_retrieves_what_embedding_from_scratch_retrieves(
        text_cube, encoders, tmp_path, monkeypatch):
    from cubepack.kinds.vectors._embedder import embed
    from cubepack.kinds.vectors._vectors import memory_vectors

    monkeypatch.setattr(_migrate, "BATCH", 7)  # 25 memories: four batches
    before = tree_bytes(text_cube)
    with EmbeddingServer(encoders["other"]) as server:
        result = cubepack.migrate(text_cube, embedder=server.spec, out=tmp_path / "new")
        assert server.calls == 4 + 2  # the batches; pack's check of a sample and the probes
        new = result.cube_dir
        assert cubepack.verify(new, embedder=server.spec, embedder_sample=0).ok
    assert tree_bytes(text_cube) == before and result.reembedded == len(TEXTS)
    stored = [(text, vector) for _, text, vector in memory_vectors(new / "textual_memory.json")]
    scratch = list(zip(TEXTS, embed(str(encoders["other"]), TEXTS)))
    for query in embed(str(encoders["other"]), QUERIES):
        assert top_k(query, stored) == top_k(query, scratch)
    with pytest.raises(cubepack.VerificationFailed, match="another embedder"):
        cubepack.verify(new, embedder=str(encoders["e"]))
    lock = lock_of(new)
    assert lock["models"]["text_mem.embedder"]["vectors"]["probes"]  # E is pinned by its probes
    change = lock["lineage"]["changes"]
    assert change["embedder"] == {"from": "tiny-e", "to": server.spec}
    assert (change["models"], change["reembedded"]) == ({}, len(TEXTS))
    embedder = json.loads((new / "config.json").read_text())["text_mem"]["config"]["embedder"]
    assert embedder["config"]["model_name_or_path"] == server.model_name
    assert embedder["config"]["base_url"] == server.url


def test_a_new_embedder_of_another_dimension_is_migrated_too(text_cube, encoders, tmp_path):
    new = cubepack.migrate(text_cube, embedder=str(encoders["wide"]), out=tmp_path / "new").cube_dir
    record = lock_of(new)["models"]["text_mem.embedder"]["vectors"]
    assert record["dimension"] == 48 and record["count"] == len(TEXTS)
    assert cubepack.verify(new, embedder=str(encoders["wide"])).ok


def test_the_progress_bar_shows_only_when_asked_or_on_a_terminal(text_cube, encoders, tmp_path,
                                                                 capsys):
    cubepack.migrate(text_cube, embedder=str(encoders["other"]), out=tmp_path / "quiet")
    assert "re-embedding" not in capsys.readouterr().err  # not a terminal: no bar
    cubepack.migrate(text_cube, embedder=str(encoders["other"]), out=tmp_path / "shown",
                     progress=True)
    assert "re-embedding textual_memory.json" in capsys.readouterr().err


def test_model_and_embedder_at_once(cube, text_cube, encoders, zoo, tmp_path):
    shutil.copytree(cube / "activations", text_cube / "activations")
    config = json.loads((text_cube / "config.json").read_text())
    config["act_mem"] = json.loads((cube / "config.json").read_text())["act_mem"]
    (text_cube / "config.json").write_text(json.dumps(config))
    cubepack.pack(text_cube)
    result = cubepack.migrate(text_cube, model=str(zoo["b"]), embedder=str(encoders["other"]),
                              out=tmp_path / "new")
    change = lock_of(result.cube_dir)["lineage"]["changes"]
    assert set(change["models"]) == {"act_mem"} and change["reembedded"] == len(TEXTS)
    assert cubepack.verify(result.cube_dir, model=str(zoo["b"]), recompute=True,
                           embedder=str(encoders["other"])).ok


# --- attestations of the ancestors ---------------------------------------------------------------

def test_the_parents_attestations_are_copied_parent_first(cube, zoo, tmp_path):
    """Two migrations of signed cubes, each signed by the migrate that made it: each child
    carries its ancestors' envelopes, parent first, in a listed file; its chain verifies up to
    the trusted key; signed afterwards by ``sign`` instead, its lineage is a claim; an
    ancestor's attestation that is not one is refused."""
    from helpers import make_key

    key, public = make_key(tmp_path, "signer")
    cubepack.sign(cube, key)
    parent_envelope = json.loads((cube / constants.ATTESTATION_FILENAME).read_text())
    child = cubepack.migrate(cube, model=str(zoo["b"]), out=tmp_path / "child", sign_key=key,
                             trusted_keys=[public], require_lineage=True).cube_dir
    assert json.loads((child / constants.ANCESTORS_FILENAME).read_text()) == \
        {"envelopes": [parent_envelope]}
    assert constants.ANCESTORS_FILENAME in lock_of(child)["files"]
    child_envelope = json.loads((child / constants.ATTESTATION_FILENAME).read_text())
    grandchild = cubepack.migrate(child, model=str(zoo["a"]), out=tmp_path / "grand",
                                  sign_key=key).cube_dir
    assert json.loads((grandchild / constants.ANCESTORS_FILENAME).read_text()) == \
        {"envelopes": [child_envelope, parent_envelope]}
    report = cubepack.verify(grandchild, trusted_keys=[public], require_lineage=True)
    assert [c.ok for c in report.checks if c.name == "lineage"] == [True, True]
    # the lineage migrate derived is stated as proved; everything pack made, too
    predicate = json.loads(base64.b64decode(json.loads(
        (grandchild / constants.ATTESTATION_FILENAME).read_text())["payload"]))["predicate"]
    assert predicate["signer"]["step"] == "migrate"
    assert predicate["proved"]["lineage"]["parent"]["lock_digest"] == lock_of(child)["digest"]
    assert set(predicate["proved"]["provenance"]) == set(lock_of(grandchild)["activations"])
    # the same cube signed again by `sign`: its lineage becomes the claim it is for that signer
    cubepack.sign(grandchild, key)
    with pytest.raises(cubepack.VerificationFailed, match="as a claim"):
        cubepack.verify(grandchild, trusted_keys=[public], require_lineage=True)
    # an unsigned derived cube has no chain to follow
    unsigned = cubepack.migrate(child, model=str(zoo["a"]), out=tmp_path / "unsigned").cube_dir
    with pytest.raises(cubepack.VerificationFailed, match="attestation"):
        cubepack.verify(unsigned, trusted_keys=[public], require_lineage=True)
    (child / constants.ATTESTATION_FILENAME).write_text("[1, 2]")
    with pytest.raises(cubepack.VerificationFailed, match="attestation"):
        cubepack.migrate(child, model=str(zoo["a"]), out=tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_the_old_signature_is_not_carried_over(cube, zoo, tmp_path):
    """It signs the old lock; the new cube is unsigned until its publisher signs it."""
    from helpers import make_key

    key, public = make_key(tmp_path, "signer")
    cubepack.sign(cube, key)
    new = cubepack.migrate(cube, model=str(zoo["b"]), out=tmp_path / "new").cube_dir
    assert not (new / constants.SIGNATURE_FILENAME).exists()
    with pytest.raises(cubepack.VerificationFailed, match="unsigned|signature"):
        cubepack.verify(new, trusted_keys=[public])
