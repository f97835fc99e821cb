"""A plain cache bundle, as a user without MemOS meets it (the README's second quick start):
caches saved with ``cubepack.save_kv_cache``, packed with ``--cube-id`` (no config.json), pushed
to the local endpoint, pulled with ``--verify --recompute``, loaded into their producer and
refused for another model. The producer pin is a fingerprint: the model given, or the Hub model
the headers name, found in the HF cache; a header alone never pins."""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml

import cubepack
from cubepack._util import constants

from envs import chain_once
from helpers import build_cache, cli_in_process

pytestmark = chain_once

DOCS = {"handbook": [1, 17, 42, 7, 99, 5], "faq": [3, 4, 5, 6, 200]}


@pytest.fixture
def cli(hub, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_CACHE=os.environ["HF_HUB_CACHE"],
               HF_HUB_DISABLE_PROGRESS_BARS="1")

    def run(*args):  # in this process: the flow is the subject, not a process's start-up
        done = cli_in_process([*args, "--json"], env=env, cwd=work)
        data = json.loads(done.stdout)
        assert data["ok"] == (done.returncode == 0), done.stderr
        return done.returncode, data
    run.work = work
    return run


def bundle(folder, model, producer):
    """A folder of KV files and their sources, as a cache-augmented-generation team ships."""
    (folder / "activations").mkdir(parents=True)
    (folder / "sources").mkdir()
    for name, ids in DOCS.items():
        cache = build_cache(model, torch.tensor([ids]))
        cubepack.save_kv_cache(cache, folder / "activations" / f"{name}.kv.safetensors",
                               producer=producer, token_ids=ids,
                               metadata={"source": f"sources/{name}.txt"})
        (folder / "sources" / f"{name}.txt").write_text(f"the {name} text\n")
    (folder / "prompts.jsonl").write_text(
        "".join(json.dumps({"id": name, "prompt": f"the {name} text"}) + "\n" for name in DOCS))
    return folder


def test_pack_push_pull_verify_load_and_refuse(cli, zoo, models, tmp_path):
    docs = bundle(cli.work / "docs", models["a"], models["a"])
    code, packed = cli("pack", docs, "--cube-id", "me/docs", "--model", zoo["a"])
    assert code == 0, packed
    assert sorted(packed["activations"]) == sorted(DOCS)
    assert not (docs / "config.json").exists()  # a plain bundle stays one: no MemOS config
    card = (docs / constants.CARD_FILENAME).read_text()
    assert "A bundle of KV caches" in card and "MemOS users" not in card
    assert "memcube" not in card.split("---")[1]
    config = yaml.safe_load((docs / constants.CONFIG_FILENAME).read_text())
    assert sorted(config["memories"]["source"]) == ["prompts.jsonl", "sources/faq.txt",
                                                     "sources/handbook.txt"]
    code, report = cli("verify", docs, "--model", zoo["a"], "--recompute")
    assert code == 0, report
    # The bundle's caches are the model's within the dtype's noise (another kernel made them),
    # not its prefill: `recomputed` is not established by that (an answer is not bound)...
    code, near = cli("verify", docs, "--model", zoo["a"], "--recompute",
                     "--require-provenance", "recomputed")
    assert code == 1 and "--model MODEL --recompute`" in json.dumps(near)
    assert "load with recompute=True" in json.dumps(near)
    # ...until pack --recompute writes the prefill itself.
    code, packed = cli("pack", docs, "--cube-id", "me/docs", "--model", zoo["a"], "--recompute")
    assert code == 0, packed
    code, pushed = cli("push", docs, "me/docs", "--tag", "v1")
    assert code == 0, pushed
    code, pulled = cli("pull", "me/docs@v1", "--local-dir", tmp_path / "copy", "--model",
                       zoo["a"], "--recompute", "--require-provenance", "recomputed")
    assert code == 0, pulled
    assert {c["check"] for c in pulled["report"]["checks"] if c["ok"]} >= {"recompute",
                                                                          "model identity"}
    cache = cubepack.load_kv_cache(tmp_path / "copy/activations/handbook.kv.safetensors",
                                   models["a"])
    assert cache.get_seq_length() == len(DOCS["handbook"])
    with pytest.raises(cubepack.IdentityMismatch, match="weights_digest"):
        cubepack.load_kv_cache(tmp_path / "copy/activations/handbook.kv.safetensors", models["b"])
    code, refused = cli("pull", "me/docs@v1", "--local-dir", tmp_path / "other", "--model",
                        zoo["b"])
    assert code == 1 and "weights_digest" in refused["error"]["message"]
    assert not (tmp_path / "other").exists()


def test_the_pin_is_the_model_given_never_the_header(cli, zoo, models):
    """A header that claims A over B's tensors: --model A packs nothing of B's, --model B is
    refused for A's header, and without --model a local-folder header names nothing to find."""
    docs = bundle(cli.work / "docs", models["a"], models["a"])
    code, refused = cli("pack", docs, "--cube-id", "me/docs")
    assert code == 2 and "--model" in refused["error"]["message"]
    code, refused = cli("pack", docs, "--cube-id", "me/docs", "--model", zoo["b"])
    assert code == 1 and "weights_digest" in refused["error"]["message"]
    assert not (docs / constants.LOCK_FILENAME).exists()  # nothing half-written
    forged = bundle(cli.work / "forged", models["b"], models["a"])  # B's values, A's header
    code, _ = cli("pack", forged, "--cube-id", "me/forged", "--model", zoo["a"])
    assert code == 0  # a header is a claim: only recomputation shows the values are B's
    code, refused = cli("verify", forged, "--model", zoo["a"], "--recompute")
    assert code == 1 and "recompute" in json.dumps(refused["report"])


def test_without_model_the_producer_is_found_in_the_hf_cache(cli, hub_cached, models):
    """Headers naming a Hub model at a commit: pack finds it in the HF cache (never
    downloading) and pins its fingerprint there, in the dtype the caches ran in."""
    snapshot = cubepack.fingerprint(str(hub_cached["snapshot"]))
    assert snapshot.model_id == hub_cached["repo_id"]
    docs = bundle(cli.work / "docs", models["a"], snapshot)
    code, packed = cli("pack", docs, "--cube-id", "me/docs")
    assert code == 0, packed
    pin = packed["models"]["act_mem"]
    assert (pin["repo_id"], pin["revision"]) == (hub_cached["repo_id"], hub_cached["commit"])
    assert pin["name"] == hub_cached["repo_id"]  # no local path in the lock
    bf16 = bundle(cli.work / "bf16", models["a_as_bf16"],
                  cubepack.fingerprint(str(hub_cached["snapshot"]), dtype="bfloat16"))
    code, packed = cli("pack", bf16, "--cube-id", "me/bf16")
    assert code == 0, packed
    lock = json.loads((bf16 / constants.LOCK_FILENAME).read_text())
    assert lock["models"]["act_mem"]["identity"]["dtype"] == "bfloat16"


def test_a_bundle_of_two_dtypes_or_a_bad_jsonl_is_refused(cli, zoo, models):
    docs = bundle(cli.work / "docs", models["a"], models["a"])
    cache = build_cache(models["a_as_bf16"], torch.tensor([[5, 6, 7]]))
    cubepack.save_kv_cache(cache, docs / "activations/bf16.kv.safetensors",
                           producer=models["a_as_bf16"], token_ids=[5, 6, 7])
    code, refused = cli("pack", docs, "--cube-id", "me/docs", "--model", zoo["a"])
    assert code == 2 and "several dtypes" in refused["error"]["message"]
    (docs / "activations/bf16.kv.safetensors").unlink()
    (docs / "prompts.jsonl").write_text('{"id": 1}\n{"id": \n')
    code, refused = cli("pack", docs, "--cube-id", "me/docs", "--model", zoo["a"])
    assert code == 1 and "line 2" in refused["error"]["message"]
