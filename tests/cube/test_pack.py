"""Packing a MemOS-format cube: pins, conversion through the allowlist, lock, card."""

from __future__ import annotations

import contextlib
import json
import pickle
import shutil

import pytest
import torch

import cubepack
from cubepack import IdentityMismatch, UnsafeInputError
from cubepack._util import constants
from cubepack.kv import read_kv_header

from adversarial import _Canary, nested_payload
from helpers import all_equal, build_cache, continue_greedy, tree_bytes
from memos_format import write_cube

TEXTS = {"item-1": "The user is a Chinese man.", "item-2": "He likes green tea and long walks."}


@pytest.fixture
def caches(models):
    model = models["a"]
    return {"item-1": build_cache(model, torch.tensor([[5, 6, 7, 8, 9, 10]])),
            "item-2": build_cache(model, torch.tensor([[11, 12, 13, 14]]))}


@pytest.fixture
def cube(tmp_path, zoo, caches):
    return write_cube(tmp_path / "cube", str(zoo["a"]), caches, texts=TEXTS)


def test_pack_converts_the_pickle_and_caches_continue_identically(cube, caches, models):
    result = cubepack.pack(cube, legacy_pickle=True)
    assert sorted(result.converted) == ["item-1", "item-2"]
    names = sorted(p.relative_to(cube).as_posix() for p in cube.rglob("*") if p.is_file())
    assert names == ["README.md", "activations/item-1.kv.safetensors",
                     "activations/item-2.kv.safetensors", "config.json", "cubepack.lock",
                     "cubepack.yaml"]
    assert not any(name.endswith(".pickle") for name in names)
    for item_id, original in caches.items():
        path = cube / "activations" / f"{item_id}.kv.safetensors"
        assert read_kv_header(path).metadata["source_text"] == TEXTS[item_id]
        loaded = cubepack.load_kv_cache(path, models["a"])
        assert all_equal(continue_greedy(models["a"], original, 40, 4),
                         continue_greedy(models["a"], loaded, 40, 4))
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    assert lock["activations"]["item-1"]["token_count"] == 6
    assert lock["models"]["act_mem"]["identity"]["weights_digest"] == \
        cubepack.fingerprint(models["a"]).weights_digest
    assert cubepack.verify(cube, model=str(models["a"].name_or_path)).ok


def test_config_json_is_left_untouched(cube):
    before = (cube / "config.json").read_bytes()
    cubepack.pack(cube, legacy_pickle=True)
    assert (cube / "config.json").read_bytes() == before


def test_a_pickle_is_refused_without_legacy_pickle_and_nothing_changes(cube):
    before = tree_bytes(cube)
    with pytest.raises(UnsafeInputError, match="--legacy-pickle"):
        cubepack.pack(cube)
    assert tree_bytes(cube) == before
    assert [p.name for p in cube.parent.iterdir()] == ["cube"]  # no staging folder left


def test_early_2025_layout_converts(tmp_path, zoo, caches, models):
    cube = write_cube(tmp_path / "early", str(zoo["a"]), caches, early=True, texts=TEXTS)
    raw = (cube / "activation_memory.pickle").read_bytes()
    assert b"kv_cache_id" in raw and b"key_cache" in raw and b"layers" not in raw
    cubepack.pack(cube, legacy_pickle=True)
    for item_id, original in caches.items():
        loaded = cubepack.load_kv_cache(cube / "activations" / f"{item_id}.kv.safetensors",
                                        models["a"])
        for mine, theirs in zip(loaded.layers, original.layers):
            assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)


class _Eval:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (eval, (f"open({self.path!r}, 'w')",))


@pytest.mark.parametrize("kind", ["direct", "nested", "torch_load", "builtins_eval"])
def test_malicious_pickles_are_refused_and_run_nothing(cube, tmp_path, kind):
    canary = tmp_path / f"canary-{kind}"
    payloads = {
        "direct": lambda: pickle.dumps({"kv_cache_memories": {"x": _Canary(canary)}}),
        "nested": lambda: nested_payload(canary),
        "torch_load": lambda: pickle.dumps((torch.load, ("/dev/null",))),
        "builtins_eval": lambda: pickle.dumps({"kv_cache_memories": {"x": _Eval(canary)}}),
    }
    (cube / "activation_memory.pickle").write_bytes(payloads[kind]())
    before = tree_bytes(cube)
    with pytest.raises(UnsafeInputError) as caught:
        cubepack.pack(cube, legacy_pickle=True)
    assert "allowlist" in str(caught.value) or "forbidden global" in str(caught.value)
    assert not canary.exists()
    assert tree_bytes(cube) == before


def test_nested_payload_is_live(tmp_path):
    """The nested payload really runs code under a plain load: the refusal above is meaningful."""
    from memos_format import _as_memos_globals

    canary = tmp_path / "proof"
    payload = nested_payload(canary)
    with _as_memos_globals(False), contextlib.suppress(Exception):
        pickle.loads(payload)  # the rebuild fails after the nested load already ran the code
    assert canary.exists()


def test_activations_that_contradict_the_pinned_model_are_refused(cube, zoo):
    before = tree_bytes(cube)
    with pytest.raises(IdentityMismatch) as caught:
        cubepack.pack(cube, model=str(zoo["deep"]), legacy_pickle=True, assert_producer=True)
    assert "geometry.num_layers" in caught.value.fields
    assert "expected 3, found 2" in str(caught.value)
    assert tree_bytes(cube) == before


def test_packing_is_deterministic(tmp_path, zoo, caches):
    first = write_cube(tmp_path / "one", str(zoo["a"]), caches, texts=TEXTS)
    second = tmp_path / "two"
    shutil.copytree(first, second)
    cubepack.pack(first, legacy_pickle=True)
    cubepack.pack(second, legacy_pickle=True)
    lock = (first / constants.LOCK_FILENAME).read_bytes()
    assert lock == (second / constants.LOCK_FILENAME).read_bytes()
    again = cubepack.pack(first)
    assert again.changed is False
    assert (first / constants.LOCK_FILENAME).read_bytes() == lock


def test_card_parses_with_pinned_base_model(cube, hub_cached, monkeypatch):
    from huggingface_hub import DatasetCard

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = cubepack.pack(cube, model=hub_cached["repo_id"], legacy_pickle=True,
                           license="apache-2.0")
    assert result.models["act_mem"]["revision"] == hub_cached["commit"]
    card = DatasetCard.load(cube / "README.md")
    assert card.data.base_model == ["tiny-org/model-a"]
    assert {"memcube", "memos", "kv-cache"} <= set(card.data.tags)
    assert card.data.license == "apache-2.0"
    assert hub_cached["commit"] in card.text
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    assert lock["content_digest"] in card.text
    # the pinned revision is in the HF cache, so verify checks the model without being told
    report = cubepack.verify(cube)
    assert [(c.ok, c.basis) for c in report.checks if c.name == "model identity"] == [
        (True, "proved"), (True, "claimed")]  # the folder's dtype is the pin's word


def test_local_folder_pin_has_no_revision_and_the_card_says_so(cube):
    cubepack.pack(cube, legacy_pickle=True)
    config = (cube / "cubepack.yaml").read_text()
    assert "revision: null" in config
    assert "pinned by weights digest alone" in (cube / "README.md").read_text()


def test_cli_pack_and_verify(cube, zoo, capsys):
    from cubepack.cli import main

    assert main(["pack", str(cube), "--legacy-pickle", "--json"]) == 0
    packed = json.loads(capsys.readouterr().out)
    assert packed["changed"] is True and len(packed["activations"]) == 2
    assert main(["verify", str(cube), "--model", str(zoo["a"]), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and {c["check"] for c in report["checks"]} >= {"lock", "sha256", "kv header",
                                                                       "model identity"}
    assert main(["verify", str(cube), "--model", str(zoo["b"])]) == 1
    out = capsys.readouterr().out
    assert "FAIL model identity" in out and "weights_digest" in out


def test_text_memory_models_are_recorded_as_informational_pins(cube, zoo):
    config = json.loads((cube / "config.json").read_text())
    config["text_mem"] = {"backend": "general_text", "config": {
        "extractor_llm": {"backend": "huggingface", "config": {"model_name_or_path": str(zoo["b"])}},
        "embedder": {"backend": "ollama", "config": {"model_name_or_path": "nomic-embed-text"}}}}
    (cube / "config.json").write_text(json.dumps(config))
    cubepack.pack(cube, legacy_pickle=True)
    models = json.loads((cube / constants.LOCK_FILENAME).read_text())["models"]
    assert set(models) == {"act_mem", "text_mem.extractor_llm", "text_mem.embedder"}
    extractor = models["text_mem.extractor_llm"]
    assert extractor["strict"] is False
    assert extractor["identity"]["weights_digest"] == cubepack.fingerprint(zoo["b"]).weights_digest
    assert models["text_mem.embedder"]["identity"] is None
    assert "ollama" in models["text_mem.embedder"]["reason"]
    card = (cube / "README.md").read_text()
    assert "text_mem.embedder" in card and "not pinned" in card
    assert cubepack.verify(cube).ok


class _Reuse:
    """Pickles as ``torch.storage._load_from_bytes(payload)``; many instances share one payload,
    which pickle writes once and then references through its memo."""

    def __init__(self, payload):
        self.payload = payload

    def __reduce__(self):
        return (torch.storage._load_from_bytes, (self.payload,))


def test_a_memo_reused_payload_is_decoded_once(monkeypatch):
    import io

    from cubepack import FormatError
    from cubepack.memos_format._pickle import read_memos_pickle

    buffer = io.BytesIO()
    torch.save(torch.zeros(256 * 1024).untyped_storage(), buffer)  # 1 MiB
    payload = buffer.getvalue()
    data = pickle.dumps({"kv_cache_memories": [_Reuse(payload) for _ in range(500)]})
    assert len(data) < 2 * len(payload)  # 500 references, one copy: the bomb's shape
    decoded = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: decoded.append(1) or real_load(*a, **k))
    with pytest.raises(FormatError, match="has no id"):
        read_memos_pickle(data)
    assert decoded == []  # decoding waits for an item's tensors: the refusal costs no decode


def test_a_deflated_payload_that_would_inflate_is_refused_before_decoding(monkeypatch):
    import io
    import zipfile

    from cubepack.memos_format._pickle import read_memos_pickle

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data/0", bytes(200 * 1024 * 1024))  # 200 MiB of zeros
    bomb = buffer.getvalue()
    assert len(bomb) < 1024 * 1024
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("decoded the bomb"))
    with pytest.raises(UnsafeInputError, match="decompression bomb"):
        read_memos_pickle(pickle.dumps({"kv_cache_memories": {"x": _Reuse(bomb)}}))


def test_model_contradicting_config_json_is_refused_unless_asserted(cube, zoo, capsys):
    from cubepack.cli import main

    before = tree_bytes(cube)
    with pytest.raises(IdentityMismatch, match=r"--assert-producer") as caught:
        cubepack.pack(cube, model=str(zoo["b"]), legacy_pickle=True)
    assert caught.value.fields == ["producer"] and tree_bytes(cube) == before
    assert main(["pack", str(cube), "--legacy-pickle", "--model", str(zoo["b"]),
                 "--assert-producer"]) == 0
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    provenance = lock["activations"]["item-1"]["provenance"]
    assert provenance["kind"] == "asserted" and "--assert-producer" in provenance["detail"]
    assert "asserted" in (cube / "README.md").read_text()


def test_the_same_model_under_another_name_is_not_a_contradiction(cube, hub_cached, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cubepack.pack(cube, model=hub_cached["repo_id"], legacy_pickle=True)  # config names zoo a
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    assert lock["activations"]["item-1"]["provenance"]["kind"] == "asserted"


@pytest.mark.parametrize("where", ["2305", "2302"])
def test_memos_producer_records_are_read_and_enforced(tmp_path, zoo, caches, where):
    import pickle as pickle_module

    from memos_format import _as_memos_globals

    def with_record(name, layers=2):
        cube = write_cube(tmp_path / f"{where}-{layers}-{abs(hash(name))}", str(zoo["a"]), caches)
        path = cube / "activation_memory.pickle"
        with _as_memos_globals(False):
            document = pickle_module.loads(path.read_bytes())
            record = {"model_name_or_path": name, "num_hidden_layers": layers,
                      "torch_dtype": "float32"}
            if where == "2305":
                for item in document["kv_cache_memories"].values():
                    item.metadata["producer"] = record
            else:
                document["model_identity"] = {"model_name_or_path": name}
            path.write_bytes(pickle_module.dumps(document))
        return cube

    good = with_record(str(zoo["a"]))
    cubepack.pack(good, legacy_pickle=True)
    lock = json.loads((good / constants.LOCK_FILENAME).read_text())
    assert lock["activations"]["item-1"]["provenance"]["kind"] == "recorded"
    assert f"#{where}" in lock["activations"]["item-1"]["provenance"]["detail"]
    bad = with_record("someone/other-model", layers=3)
    with pytest.raises(IdentityMismatch, match="record.model_name_or_path") as caught:
        cubepack.pack(bad, legacy_pickle=True)
    if where == "2305":
        assert "record.num_hidden_layers" in caught.value.fields


def test_a_plain_bundle_repacks_without_being_told_its_id_or_model_again(tmp_path, zoo, models,
                                                                          prompt_ids):
    """A re-pack keeps the cube id and the folder pin its last pack was given: the folder is
    fingerprinted again (the pin is never the old lock's word); a folder gone is asked for."""
    bundle = tmp_path / "bundle"
    (bundle / "activations").mkdir(parents=True)
    cubepack.save_kv_cache(cubepack.prefill(models["a"], prompt_ids),
                           bundle / "activations" / "x.kv.safetensors", producer=models["a"],
                           token_ids=prompt_ids)
    first = cubepack.pack(bundle, cube_id="me/bundle", model=str(zoo["a"]))
    again = cubepack.pack(bundle)
    assert again.changed is False and again.digest == first.digest
    lock = json.loads((bundle / constants.LOCK_FILENAME).read_text())
    assert lock["cube_id"] == "me/bundle"
    assert lock["models"]["act_mem"]["name"] == str(zoo["a"])


def test_migrating_only_the_embedder_keeps_a_folder_pin(tmp_path, zoo, models, prompt_ids):
    from cubepack.testing.embeddings import build_encoder

    bundle = tmp_path / "bundle"
    (bundle / "activations").mkdir(parents=True)
    cubepack.save_kv_cache(cubepack.prefill(models["a"], prompt_ids),
                           bundle / "activations" / "x.kv.safetensors", producer=models["a"],
                           token_ids=prompt_ids)
    cubepack.pack(bundle, cube_id="me/bundle", model=str(zoo["a"]))
    result = cubepack.migrate(bundle, out=tmp_path / "out",
                              embedder=str(build_encoder(tmp_path / "enc", seed=1)))
    old = json.loads((bundle / constants.LOCK_FILENAME).read_text())["models"]["act_mem"]
    new = json.loads((result.cube_dir / constants.LOCK_FILENAME).read_text())["models"]["act_mem"]
    assert new["identity"] == old["identity"] and result.lineage["changes"]["models"] == {}


@pytest.mark.parametrize("bad", ["bad id/ünï", "a/b/c", "/abs", "-flag", "x" * 97, ""])
def test_a_cube_id_outside_the_rule_is_refused_naming_the_pattern(tmp_path, bad, packed):
    from cubepack.cli import main
    from cubepack.format._lock import CUBE_ID_PATTERN

    from helpers import tree_bytes

    bundle = tmp_path / "bundle"
    shutil.copytree(packed, bundle)
    (bundle / "config.json").unlink()
    before = tree_bytes(bundle)
    with pytest.raises(cubepack.UsageError) as caught:
        cubepack.pack(bundle, cube_id=bad)
    assert f"{bad!r} is not a cube id" in str(caught.value)
    assert CUBE_ID_PATTERN in str(caught.value)
    assert main(["pack", str(bundle), "--cube-id", bad]) == 2
    assert tree_bytes(bundle) == before


def test_a_model_folder_is_not_taken_for_a_cube_with_a_config_to_edit(tmp_path, zoo):
    """A transformers model folder holds a config.json too: pack says it is not MemOS's config
    (and what to point pack at), never to add a cube_id to the model's config."""
    folder = tmp_path / "model"
    shutil.copytree(zoo["a"], folder)
    with pytest.raises(cubepack.UsageError) as caught:
        cubepack.pack(folder)
    message = str(caught.value)
    assert message.startswith(f"{folder / 'config.json'} is not a MemOS cube config")
    assert "looks like a model's config: model_type" in message and "--model" in message
    assert "Add \"cube_id\"" not in message
    assert not (folder / "cubepack.lock").exists()
