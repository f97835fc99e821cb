"""The Hub's list API on the local endpoint, through the real client's ``list_models(...)`` and
``list_datasets(...)`` (0.36 and 2.x): filters on the tags a card's front matter gives, search,
author, sort, expand, full and cardData, keyset pages linked by ``Link: rel="next"`` (the
client follows them; requests counted), private repos only to a token that reads them, and a
400 for what the Hub refuses."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from huggingface_hub import HfApi
from huggingface_hub import constants as hub_constants
from huggingface_hub.errors import HfHubHTTPError

from cubepack.localhub._listing import card_tags
from cubepack.testing.hub import InstrumentedHub

TOKEN = "writer"
CARD = b"""---
tags: [cubepack, kv-cache]
license: mit
language: [en, fr]
base_model: org/base
datasets: org/data
task_categories: text-generation
---
# a card
"""


@pytest.fixture
def hub(tmp_path):
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN], list_page_size=2) as server:
        yield server


@pytest.fixture
def api(hub, monkeypatch):
    monkeypatch.setattr(hub_constants, "HF_HUB_DISABLE_XET", True)
    import huggingface_hub

    if huggingface_hub.__version__.startswith("0."):
        monkeypatch.setattr(hub_constants, "ENDPOINT", hub.url)
    return HfApi(endpoint=hub.url, token=TOKEN)


def listing(hub):
    return sum(n for key, n in hub.stats.requests.items()
               if key.split("?")[0] in ("GET /api/datasets", "GET /api/models"))


def make(api, repo_id, repo_type="dataset", card=None, private=False):
    api.create_repo(repo_id, repo_type=repo_type, private=private)
    if card is not None:
        api.upload_file(path_or_fileobj=card, path_in_repo="README.md", repo_id=repo_id,
                        repo_type=repo_type)


@pytest.mark.parametrize("kind", ["dataset", "model"])
def test_every_repo_is_listed_across_pages_the_client_follows(hub, api, kind):
    for index in range(5):
        make(api, f"ns/repo-{index}", kind)
    lister = api.list_datasets if kind == "dataset" else api.list_models
    hub.stats.reset()
    assert [r.id for r in lister()] == [f"ns/repo-{i}" for i in range(5)]
    assert listing(hub) == 3  # two a page
    hub.stats.reset()
    assert len(list(lister(limit=3))) == 3
    assert listing(hub) == 2  # the client stops following once it holds its limit


def test_a_repo_made_between_two_pages_shifts_nothing(hub, api):
    for index in (0, 2, 4):
        make(api, f"ns/repo-{index}")
    pages = api.list_datasets()
    seen = [next(pages).id, next(pages).id]  # the first page read
    make(api, "ns/repo-1")  # before the cursor: not listed twice, nothing skipped
    seen += [r.id for r in pages]
    assert seen == ["ns/repo-0", "ns/repo-2", "ns/repo-4"]


@pytest.mark.parametrize("kind", ["dataset", "model"])
def test_tags_come_from_the_card_as_the_hub_derives_them(hub, api, kind):
    make(api, "ns/carded", kind, card=CARD)
    make(api, "ns/bare", kind)
    lister = api.list_datasets if kind == "dataset" else api.list_models
    [carded] = [r for r in lister(full=True) if r.id == "ns/carded"]
    expected = ["cubepack", "kv-cache", "license:mit", "language:en", "language:fr"] + (
        ["base_model:org/base", "dataset:org/data"] if kind == "model"
        else ["task_categories:text-generation"])
    assert carded.tags == expected
    assert carded.card_data is not None and carded.card_data["license"] == "mit"
    for tag in expected:
        assert [r.id for r in lister(filter=tag)] == ["ns/carded"]
    assert [r.id for r in lister(filter=["cubepack", "license:mit"])] == ["ns/carded"]
    assert list(lister(filter=["cubepack", "license:apache-2.0"])) == []
    info = api.repo_info("ns/carded", repo_type=kind)
    assert info.tags == expected  # repo info says the same


def test_the_client_s_own_filter_arguments_reach_the_tags(hub, api):
    make(api, "ns/carded", card=CARD)
    assert [r.id for r in api.list_datasets(language="fr")] == ["ns/carded"]
    assert [r.id for r in api.list_datasets(task_categories="text-generation")] == ["ns/carded"]
    assert list(api.list_datasets(language="de")) == []


def test_search_and_author_and_sort(hub, api):
    make(api, "alice/Cube-One")
    make(api, "bob/cube-two")
    make(api, "alice/other", card=CARD)  # changed last
    assert [r.id for r in api.list_datasets(search="CUBE")] == ["alice/Cube-One", "bob/cube-two"]
    assert [r.id for r in api.list_datasets(author="alice")] == ["alice/Cube-One", "alice/other"]
    assert [r.id for r in api.list_datasets(author="alice", search="one")] == ["alice/Cube-One"]
    newest = next(iter(api.list_datasets(sort="last_modified")))
    assert newest.id == "alice/other"


def test_expand_returns_what_it_names(hub, api):
    make(api, "ns/carded", card=CARD)
    [entry] = api.list_datasets(expand=["sha", "siblings", "private"])
    assert len(entry.sha) == 40 and entry.private is False
    assert sorted(s.rfilename for s in entry.siblings) == [".gitattributes", "README.md"]
    assert entry.tags is None  # not asked for
    assert api.repo_info("ns/carded", repo_type="dataset").sha == entry.sha


@pytest.mark.parametrize("query", ["expand=foo", "sort=size", "limit=0", "limit=x",
                                   "direction=2", "cursor=%%%", "cursor=bm90LWpzb24",
                                   "expand=sha&full=true"])
def test_what_the_hub_refuses_is_a_400(hub, api, query):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{hub.url}/api/datasets?{query}")
    assert refused.value.code == 400


def test_the_client_raises_its_error_for_an_unknown_expand(hub, api):
    with pytest.raises(HfHubHTTPError) as refused:
        list(api.list_models(expand=["foo"]))
    assert refused.value.response.status_code == 400


def test_a_private_repo_is_listed_only_to_a_token_that_reads_it(hub, api):
    make(api, "ns/secret", private=True)
    make(api, "ns/open")
    assert [r.id for r in api.list_datasets()] == ["ns/open", "ns/secret"]
    assert [r.id for r in HfApi(endpoint=hub.url, token=False).list_datasets()] == ["ns/open"]
    assert [r.id for r in HfApi(endpoint=hub.url, token="other").list_datasets()] == ["ns/open"]


def test_the_link_header_is_an_absolute_url_with_the_query_and_a_cursor(hub, api):
    for index in range(3):
        make(api, f"ns/repo-{index}")
    with urllib.request.urlopen(f"{hub.url}/api/datasets?search=repo&limit=50") as answer:
        link = answer.headers["Link"]
        assert len(json.loads(answer.read())) == 2
    assert link.startswith(f"<{hub.url}/api/datasets?search=repo&limit=50&cursor=")
    assert link.endswith('>; rel="next"')
    with urllib.request.urlopen(link[1:link.index(">")]) as answer:
        assert [r["id"] for r in json.loads(answer.read())] == ["ns/repo-2"]
        assert answer.headers["Link"] is None


@pytest.mark.parametrize("card", [b"no front matter", b"---\n[unclosed\n---\n",
                                  b"---\n- a list\n---\n", b"---\na: &x [1]\nb: *x\n---\n",
                                  b"---\ntags: 5\nlicense: [1, 2]\n---\n",
                                  b"---\n" + b"[" * 200 + b"]" * 200 + b"\n---\n"])
def test_a_card_without_usable_front_matter_lists_without_tags(hub, api, card):
    make(api, "ns/odd", card=card)
    [entry] = api.list_datasets(full=True)
    assert entry.id == "ns/odd" and entry.tags == []


def test_card_tags_sweep_every_key_each_kind_turns_into_a_tag():
    from cubepack.localhub._listing import _PLAIN, _PREFIX, _PREFIXED

    for kind in ("models", "datasets"):
        for key in _PREFIXED[kind]:
            assert card_tags(kind, {key: ["x", "y"]}) == [
                f"{_PREFIX.get(key, key)}:x", f"{_PREFIX.get(key, key)}:y"]
            assert card_tags(kind, {key: "x"}) == [f"{_PREFIX.get(key, key)}:x"]
            assert card_tags(kind, {key: 5}) == []
        for key in _PLAIN[kind]:
            assert card_tags(kind, {key: "x"}) == ["x"]
    assert card_tags("datasets", {"base_model": "org/m"}) == []  # a dataset's: not a tag
    assert card_tags("models", {"tags": ["a", "a"], "license": "a"}) == ["a", "license:a"]


def test_sorts_by_date_and_id_largest_first_unless_direction_is_1(hub, api):
    make(api, "ns/b")
    make(api, "ns/a")
    api.upload_file(path_or_fileobj=CARD, path_in_repo="README.md", repo_id="ns/b",
                    repo_type="dataset")

    def ids(query):
        with urllib.request.urlopen(f"{hub.url}/api/datasets?{query}") as answer:
            return [r["id"] for r in json.loads(answer.read())]

    assert ids("sort=id") == ["ns/b", "ns/a"]
    assert ids("sort=id&direction=1") == ["ns/a", "ns/b"]
    assert ids("sort=lastModified")[0] == "ns/b"  # changed last
    assert ids("sort=createdAt&direction=1")[0] in ("ns/b", "ns/a")
    assert [r.id for r in api.list_datasets(sort="created_at", expand=["createdAt"])] == \
        ids("sort=createdAt")
    assert [r.downloads for r in api.list_datasets(sort="downloads")] == [0, 0]


def test_an_official_property_without_a_value_here_is_left_out(hub, api):
    make(api, "ns/model", "model")
    [entry] = api.list_models(expand=["safetensors", "gguf", "author"])
    assert entry.author == "ns" and entry.safetensors is None and entry.gguf is None


def test_a_card_larger_than_1_mib_lists_without_tags(hub, api):
    big = CARD + b"x" * (1024 * 1024)
    make(api, "ns/big", card=big)
    [entry] = api.list_datasets(full=True)
    assert entry.tags == []


def test_a_front_matter_larger_than_16_kib_is_not_parsed(hub, api):
    """PyYAML parses about 130 KiB a second: a 1 MiB front matter cost 7.7 s of the endpoint's
    CPU on the first list or repo info after each push of it. A cubepack card's is < 1 KiB."""
    tags = "".join(f"- tag-{i:08d}\n" for i in range(17 * 1024 // 15))
    make(api, "ns/heavy", card=f"---\ntags:\n{tags}---\n".encode())
    make(api, "ns/light", card=f"---\ntags:\n{tags[:15 * 1024]}---\n".encode())
    entries = {r.id: r.tags for r in api.list_datasets(full=True)}
    assert entries["ns/heavy"] == [] and len(entries["ns/light"]) > 1000
