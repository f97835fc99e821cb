"""``cubepack search --model M``: the cubes on an endpoint whose pins match M, found through the
Hub's list API with the real huggingface_hub client over loopback. The card's tag is a hint;
a match is decided by the lock read at the listed commit (and its signature, with a trusted
key). Requests are counted, and pages are small, so pagination is followed."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

import cubepack
from cubepack import HubError, UsageError
from cubepack.cli import main
from cubepack.format._card import weights_tag
from cubepack.hub import push, search
from cubepack.testing.hub import InstrumentedHub, upload_folder

from helpers import build_cache, copy_of, make_key, point_hub_client_at
from memos_format import write_cube

TOKEN = "writer-token"
MODEL_REPO = "tiny-org/model-a"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An endpoint paging lists two repos at a time, as the Hub (HF_ENDPOINT set before
    huggingface_hub derives its constants), and a fresh HF cache."""
    with InstrumentedHub(tmp_path / "hub-root", tokens=[TOKEN], list_page_size=2) as server:
        point_hub_client_at(monkeypatch, server.url, tmp_path / "hf-cache")
        yield server


@pytest.fixture(scope="module")
def cube_a(packed_cube_factory):
    return packed_cube_factory()


@pytest.fixture(scope="module")
def cube_b(tmp_path_factory, zoo, models):
    """A cube model B made (same shapes as A, other weights)."""
    caches = {"item-1": build_cache(models["b"], torch.tensor([[5, 6, 7, 8]]))}
    cube = write_cube(tmp_path_factory.mktemp("cube-b") / "cube", str(zoo["b"]), caches)
    cubepack.pack(cube, legacy_pickle=True)
    return cube


def publish(hub, cube, repo, **kwargs):
    return push(cube, repo, endpoint=hub.url, token=TOKEN, allow_local_paths=True, **kwargs)


def digest_of(zoo, name="a"):
    return cubepack.fingerprint(str(zoo[name])).weights_digest


def lists(hub):
    return sum(n for key, n in hub.stats.requests.items() if key.startswith("GET /api/datasets")
               or key.startswith("GET /api/models?") or key == "GET /api/models")


def file_requests(hub):
    """Requests for the cubes' files (a Hub model's small files are M's fingerprint's)."""
    return Counter({key: n for key, n in hub.stats.requests.items()
                    if "/resolve/" in key and "/ns/" in key})


@pytest.mark.parametrize("kind", ["digest", "folder", "hub"])
def test_every_kind_of_model_finds_the_cube_its_pins_match(hub, cube_a, cube_b, zoo, kind):
    publish(hub, cube_a, "ns/cube-a")
    publish(hub, cube_b, "ns/cube-b")
    spec = {"digest": digest_of(zoo), "folder": str(zoo["a"]), "hub": MODEL_REPO}[kind]
    if kind == "hub":
        upload_folder(hub.url, MODEL_REPO, zoo["a"], token=TOKEN)
    hub.stats.reset()
    result = search(spec, token=TOKEN)
    assert [c.repo_id for c in result.matches] == ["ns/cube-a"]
    assert result.others == []  # B's card names B's weights: never listed for A
    match = result.matches[0]
    assert len(match.revision) == 40 and match.memory_count == 2
    assert match.signature == "unsigned"
    assert [row["match"] for row in match.roles] == [True]
    assert result.model["weights_digest"] == digest_of(zoo)
    assert result.hint == weights_tag(digest_of(zoo))
    # One list per repo type (one page each), and the candidate's lock: a HEAD and a GET.
    assert lists(hub) == 2
    assert sum(file_requests(hub).values()) == 2


def test_a_sharded_cube_counts_the_memories_its_shards_hold(hub, cube_a, zoo, tmp_path):
    """A sharded cube's memories are in its shards' indexes, not its lock's activations: the
    lock's shard entries count them (no index is fetched)."""
    cube = copy_of(cube_a, tmp_path)
    cubepack.pack(cube, shards=True)
    publish(hub, cube, "ns/sharded")
    hub.stats.reset()
    [match] = search(digest_of(zoo), repo_type="dataset").matches
    assert match.memories == {"activations": 2} and match.memory_count == 2
    assert sum(file_requests(hub).values()) == 2  # the lock: a HEAD and a GET, no index


def test_a_card_that_lies_about_its_pins_is_listed_as_not_matching(hub, cube_a, cube_b, zoo):
    publish(hub, cube_a, "ns/cube-a")
    publish(hub, cube_b, "ns/liar")
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.url, token=TOKEN)
    card = api.hf_hub_download("ns/liar", "README.md", repo_type="dataset")
    text = open(card, encoding="utf-8").read()
    lie = text.replace(weights_tag(digest_of(zoo, "b")), weights_tag(digest_of(zoo)))
    assert lie != text
    api.upload_file(path_or_fileobj=lie.encode(), path_in_repo="README.md", repo_id="ns/liar",
                    repo_type="dataset")
    result = search(str(zoo["a"]), repo_type="dataset", token=TOKEN)
    assert [c.repo_id for c in result.matches] == ["ns/cube-a"]
    [liar] = result.others
    assert liar.repo_id == "ns/liar" and not liar.match
    assert liar.roles[0]["differences"][0]["field"] == "weights_digest"
    assert liar.roles[0]["differences"][0]["expected"] == digest_of(zoo, "b")
    assert "no pin matches the model" in liar.reason


def test_pages_are_followed_and_the_limit_bounds_the_locks_read(hub, cube_a, zoo):
    for index in range(5):
        publish(hub, cube_a, f"ns/cube-{index}")
    hub.stats.reset()
    result = search(digest_of(zoo), repo_type="dataset", limit=10)
    assert sorted(c.repo_id for c in result.matches) == [f"ns/cube-{i}" for i in range(5)]
    assert lists(hub) == 3  # five repos, two a page
    assert sum(file_requests(hub).values()) == 10  # each lock: HEAD and GET
    hub.stats.reset()
    bounded = search(digest_of(zoo), repo_type="dataset", limit=2)
    assert bounded.read == 2 and bounded.truncated and bounded.listed == 3
    assert lists(hub) == 2  # the client stops paging once it holds limit + 1
    assert sum(file_requests(hub).values()) == 0  # locks at a commit: from the HF cache


def test_private_cubes_are_found_only_with_a_token_that_reads_them(hub, cube_a, zoo):
    publish(hub, cube_a, "ns/secret", private=True)
    publish(hub, cube_a, "ns/open")
    assert [c.repo_id for c in search(digest_of(zoo), token=False).matches] == ["ns/open"]
    assert [c.repo_id for c in search(digest_of(zoo), token="not-a-token").matches] == [
        "ns/open"]
    found = sorted(c.repo_id for c in search(digest_of(zoo), token=TOKEN).matches)
    assert found == ["ns/open", "ns/secret"]


def test_dataset_and_model_repos_both_and_the_repo_type_narrows(hub, cube_a, zoo):
    publish(hub, cube_a, "ns/as-dataset")
    publish(hub, cube_a, "ns/as-model", repo_type="model")
    both = search(digest_of(zoo), token=TOKEN)
    assert [(c.repo_id, c.repo_type) for c in both.matches] == [
        ("ns/as-dataset", "dataset"), ("ns/as-model", "model")]
    only = search(digest_of(zoo), repo_type="model", token=TOKEN)
    assert [c.repo_id for c in only.matches] == ["ns/as-model"]


def test_a_trusted_key_makes_a_signature_over_the_lock_a_condition(hub, cube_a, zoo, tmp_path):
    private, public = make_key(tmp_path, "signer")
    _, stranger = make_key(tmp_path, "stranger")
    signed = copy_of(cube_a, tmp_path)
    cubepack.sign(signed, private)
    publish(hub, signed, "ns/signed")
    publish(hub, cube_a, "ns/unsigned")
    plain = search(digest_of(zoo), repo_type="dataset")
    assert {c.repo_id: c.signature for c in plain.matches} == {
        "ns/signed": "signed (not checked: no --trusted-key)", "ns/unsigned": "unsigned"}
    hub.stats.reset()
    trusted = search(digest_of(zoo), repo_type="dataset", trusted_keys=[public])
    assert [(c.repo_id, c.signed_by) for c in trusted.matches] == [("ns/signed", str(public))]
    assert [(c.repo_id, c.reason) for c in trusted.others] == [
        ("ns/unsigned", "unsigned, and a trusted key was asked for")]
    # The locks read by the first search are in the HF cache at their commits; the signed
    # one's attestation and signature are fetched (a HEAD and a GET each).
    assert sum(file_requests(hub).values()) == 4
    other = search(digest_of(zoo), repo_type="dataset", trusted_keys=[stranger])
    assert other.matches == []
    assert {c.repo_id: c.signature for c in other.others}["ns/signed"] == \
        "signed by an untrusted key"


def test_a_signature_over_another_lock_is_no_match(hub, cube_a, models, zoo, tmp_path):
    """The signed cube's lock replaced by another (re-sealed) lock of the same model: the
    signature no longer covers it."""
    private, public = make_key(tmp_path, "signer")
    first = copy_of(cube_a, tmp_path / "first")
    cubepack.sign(first, private)
    publish(hub, first, "ns/swapped")
    second = copy_of(cube_a, tmp_path / "second")
    cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([[30, 31, 32]])),
                           second / "activations" / "item-1.kv.safetensors",
                           producer=models["a"], metadata={"id": "item-1"})
    cubepack.pack(second)
    from huggingface_hub import HfApi

    HfApi(endpoint=hub.url, token=TOKEN).upload_file(
        path_or_fileobj=(second / "cubepack.lock").read_bytes(), path_in_repo="cubepack.lock",
        repo_id="ns/swapped", repo_type="dataset")
    result = search(digest_of(zoo), repo_type="dataset", trusted_keys=[public])
    [swapped] = result.others
    assert swapped.signature == "signature does not verify over this lock"
    assert "does not cover this lock" in swapped.reason


def test_every_cube_reads_cubes_whose_card_names_no_weights(hub, cube_a, zoo):
    publish(hub, cube_a, "ns/cube-a")
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.url, token=TOKEN)
    text = open(api.hf_hub_download("ns/cube-a", "README.md", repo_type="dataset"),
                encoding="utf-8").read()
    api.upload_file(path_or_fileobj=text.replace(weights_tag(digest_of(zoo)), "other").encode(),
                    path_in_repo="README.md", repo_id="ns/cube-a", repo_type="dataset")
    assert search(digest_of(zoo)).matches == []  # an older card: no weights tag
    found = search(digest_of(zoo), every_cube=True)
    assert found.hint == "cubepack" and [c.repo_id for c in found.matches] == ["ns/cube-a"]


def test_offline_is_a_clear_refusal(hub, zoo, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.stats.reset()
    with pytest.raises(HubError, match="offline"):
        search(digest_of(zoo))
    assert sum(hub.stats.requests.values()) == 0


@pytest.mark.parametrize("spec", ["sha256:abc", "no/such/folder", "./missing", "a b/c"])
def test_a_model_that_is_none_of_the_three_is_a_usage_error(hub, spec):
    with pytest.raises(UsageError, match="--model"):
        search(spec)


def test_an_unknown_hub_model_names_it(hub):
    with pytest.raises(HubError, match="tiny-org/nothing"):
        search("tiny-org/nothing")


def test_an_unreachable_endpoint_is_a_hub_error(zoo, monkeypatch):
    with pytest.raises(HubError, match="Cannot reach"):
        search(digest_of(zoo), endpoint="http://127.0.0.1:9")


def test_the_cli_prints_json_for_a_match_and_for_an_error(hub, cube_a, zoo, capsys):
    publish(hub, cube_a, "ns/cube-a")
    assert main(["search", "--model", str(zoo["a"]), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and [c["repo_id"] for c in data["matches"]] == ["ns/cube-a"]
    assert data["matches"][0]["roles"][0]["match"] is True
    assert main(["search", "--model", str(zoo["a"])]) == 0
    text = capsys.readouterr().out
    assert "match ns/cube-a@" in text and "llm: matches" in text.replace("  ", " ") or \
        "matches" in text
    assert main(["search", "--model", "sha256:abc", "--json"]) == 2
    error = json.loads(capsys.readouterr().out)
    assert error["ok"] is False and error["error"]["type"] == "UsageError"


def test_no_match_is_said_and_exits_0(hub, cube_a, zoo, capsys):
    publish(hub, cube_a, "ns/cube-a")
    assert main(["search", "--model", str(zoo["b"])]) == 0
    assert "no cube matches" in capsys.readouterr().out


def test_an_endpoint_without_the_list_api_is_named(hub, zoo):
    hub.add_fault("404", path="^/api/datasets$", method="GET")
    with pytest.raises(HubError, match=r"did not answer the Hub's list API \(GET /api/datasets, "
                                       r"404"):
        search(digest_of(zoo), repo_type="dataset")


def test_hf_token_from_the_environment_reads_private_cubes(hub, cube_a, zoo, monkeypatch):
    publish(hub, cube_a, "ns/secret", private=True)
    assert search(digest_of(zoo)).matches == []
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert [c.repo_id for c in search(digest_of(zoo)).matches] == ["ns/secret"]
