"""Adversary (issue #40, item 4): a card whose front matter holds a date answers 500.

The promise (docs/reference/local-hub.md): the list API serves `full`, `cardData` and
`expand=cardData`, and "repo info carries the same tags and card data", derived from the
card's front matter "read strictly". A date is the most ordinary YAML there is (`date:
2024-01-01`, a model card's `model-index` or a dataset's release date).

The attack: one repo's card carries `date: 2024-01-01` (or a timestamp, a `!!binary`, a set,
a mapping key that is a list: all safe YAML).

What happened: PyYAML's safe loader reads the date as a `datetime.date`, which the endpoint's
JSON answer cannot hold: `GET /api/datasets/<repo>` (the repo info `pull` resolves a revision
with) and every list page with card data that holds the repo answered 500, so one card made
the repo unpullable and the listing of its neighbours unreadable.

The fix: card data is what JSON holds: a date or a time is written as its ISO 8601 text; front
matter holding anything else JSON cannot (bytes, a set, a key that is no scalar) is no card
data, as a front matter that does not parse.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

CARDS = {
    "date": (b"---\ntags: [cubepack]\ndate: 2024-01-01\n---\n# x\n", {"date": "2024-01-01"}),
    "timestamp": (b"---\ntags: [cubepack]\nwhen: 2024-01-01 10:20:30\n---\n",
                  {"when": "2024-01-01T10:20:30"}),
    "nested": (b"---\ntags: [cubepack]\nmodel-index: [{results: [{date: 2023-05-06}]}]\n---\n",
               {"model-index": [{"results": [{"date": "2023-05-06"}]}]}),
    "binary": (b"---\ntags: [cubepack]\nblob: !!binary aGk=\n---\n", {}),
    "set": (b"---\ntags: [cubepack]\nitems: !!set {a, b}\n---\n", {}),
    "list key": (b"---\ntags: [cubepack]\n? [a, b]\n: c\n---\n", {}),
}


def get(url: str) -> tuple[int, object]:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - loopback
        return response.status, json.loads(response.read())


@pytest.mark.parametrize("name", sorted(CARDS))
def test_a_card_json_cannot_hold_as_read_is_still_answered(hub, api, name):
    card, expected = CARDS[name]
    api.create_repo("ns/a", repo_type="dataset")
    api.create_repo("ns/b", repo_type="dataset")
    api.upload_file(path_or_fileobj=card, path_in_repo="README.md", repo_id="ns/a",
                    repo_type="dataset")
    for query in ("?full=true", "?cardData=true", "?expand=cardData"):
        status, listed = get(f"{hub.url}/api/datasets{query}")
        assert status == 200 and [entry["id"] for entry in listed] == ["ns/a", "ns/b"]
        data = listed[0]["cardData"]
        assert {key: value for key, value in data.items() if key != "tags"} == expected
    status, info = get(f"{hub.url}/api/datasets/ns/a")
    assert status == 200 and info["cardData"].get("tags", ["cubepack"]) == ["cubepack"]
    # What pull resolves a revision with, through the real client.
    assert api.repo_info("ns/a", repo_type="dataset").sha == info["sha"]
    assert api.list_datasets(filter=["cubepack"]) is not None
