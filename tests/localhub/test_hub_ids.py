"""Repo ids and paths as huggingface_hub has them (issue #38): the endpoint takes no id or path
the installed client refuses, checked against the client's own validators over a generated
corpus, in both environments (0.36 and 2.x, whose rules differ: 0.36 reads ``\\w`` as Unicode).

The endpoint's rule is the intersection of the client's and an ASCII name: 2.x's validator is
ASCII-only, and a repo id is a folder name here. Revisions have no client rule (the client only
quotes them); the endpoint keeps git's ref-name rule there (tests/localhub/test_ref_names.py).
"""

from __future__ import annotations

import json
import random
import re

import huggingface_hub
import pytest
from huggingface_hub.utils import HFValidationError, validate_repo_id

from cubepack.localhub._errors import StoreError
from cubepack.localhub import _ids
from cubepack.localhub._ids import new_repo_ref, repo_ref
from cubepack.testing.hub import InstrumentedHub

TOKEN = "writer"
#: Ids a client refuses that the endpoint once created (the issue's), and their neighbours.
EDGES = ["a..b", "a-", "x.git", "a--b", "-a", ".a", "a.", "_a", "a_", "a" * 96, "a" * 97,
         "A.b-c_d", "a.gi", "git", ".git", "a.GIT", "a.b.c", "1", "-", "_", "ab-", "a b",
         "caf\u00e9", "\u0661\u0662", "a\u0301", "a/b", "", "a\x00", "\u212a", "ǅ",
         "a\n", "\na", "a\nb", "a.\n", "a\r", "a\t"]
ALPHABET = "aZ09._-" + "/ \u00e9\u0661+\n"
#: Each client version's rule as that version applies it (its REPO_ID_REGEX, then its checks):
#: 0.36 with ``.match`` (``$`` matches before a final newline), ``\\w`` Unicode, no namespace
#: bound; 2.x with ``fullmatch``, ASCII, a namespace of at most 96. The endpoint refuses what
#: either refuses; the installed client is checked to follow its version's rule here.
RULES = {
    "0.36": lambda repo_id: re.compile(r"^(\b[\w\-.]+\b/)?\b[\w\-.]{1,96}\b$").match(repo_id),
    "2.x": lambda repo_id: re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b",
                                      re.ASCII).fullmatch(repo_id),
}


def rule_accepts(version: str, repo_id: str) -> bool:
    return repo_id.count("/") <= 1 and bool(RULES[version](repo_id)) and "--" not in repo_id \
        and ".." not in repo_id and not repo_id.endswith(".git")


def corpus(seed: int, count: int) -> list[str]:
    chooser = random.Random(seed)
    names = []
    for _ in range(count):
        length = chooser.choice([1, 2, 3, 5, 8, 20, 95, 96, 97])
        names.append("".join(chooser.choice(ALPHABET) for _ in range(length)))
    return names


def client_accepts(namespace: str, name: str) -> bool:
    try:
        validate_repo_id(f"{namespace}/{name}")
    except HFValidationError:
        return False
    return True


def endpoint_accepts(namespace: str, name: str) -> bool:
    try:
        new_repo_ref("models", namespace, name)
    except StoreError:
        return False
    return True


def test_the_endpoint_takes_exactly_the_repo_ids_the_client_takes():
    """Over EDGES in every pairing and 4000 generated ids: the endpoint takes an id if and only
    if the installed client's validator does and neither version's rule refuses it (0.36 reads
    \\w as Unicode, taking ``café``, bounds no namespace and takes ``cube\\n``; the Hub and
    2.x do none of it): a root written under one version is served under the other."""
    names = EDGES + corpus(38, 4000)
    pairs = [(namespace, name) for namespace in EDGES for name in EDGES]
    pairs += [("ns", name) for name in names] + [(name, "repo") for name in names]
    taken = 0
    installed = "0.36" if huggingface_hub.__version__.startswith("0.") else "2.x"
    for namespace, name in pairs:
        repo_id = f"{namespace}/{name}"
        assert client_accepts(namespace, name) == rule_accepts(installed, repo_id), repo_id
        expected = client_accepts(namespace, name) and repo_id.isascii() \
            and len(namespace) <= 96 and all(rule_accepts(v, repo_id) for v in RULES)
        assert endpoint_accepts(namespace, name) == expected, (namespace, name)
        taken += expected
        if not expected:  # never looked up either: a malformed id names no repo
            with pytest.raises(StoreError) as missing:
                repo_ref("models", namespace, name)
            assert missing.value.status == 404 and missing.value.code == "RepoNotFound"
    assert taken > 500  # the corpus exercises acceptance too


@pytest.mark.parametrize("name", ["a..b", "a-", "x.git", "a--b"])
def test_a_repo_the_client_refuses_is_not_created(tmp_path, name):
    """Raw HTTP: the client itself refuses to send these."""
    import http.client
    from urllib.parse import urlsplit

    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN]) as hub:
        address = urlsplit(hub.url)
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
        connection.request("POST", "/api/repos/create", json.dumps(
            {"name": name, "organization": "ns", "type": "dataset"}),
            {"Authorization": f"Bearer {TOKEN}"})
        answer = connection.getresponse()
        body = json.loads(answer.read())
        assert answer.status == 400 and name in body["error"], body
        assert not (tmp_path / "root" / "repos").exists() or not list(
            (tmp_path / "root" / "repos").rglob("repo.json"))


# --- paths in a repo -----------------------------------------------------------------------------
#: Paths at the edges of the client's rule (a ``..`` segment anywhere: 2.x; leading: 0.36; a
#: ``.git`` or ``.cache`` folder: both) and of the Hub's (backslashes are names, but not a
#: leading ``..\\``).
PATH_EDGES = ["a.txt", "a/b.txt", "..", "../a", "a/..", "a/../b", ".", "./a", "a/./b", "a//b",
              "/a", "a/", "", ".git/x", "a/.git/x", "a/.git", ".gitattributes", ".cache/x",
              "a/.cache", ".cached/x", "..a", "a..", "a\\b", "folder/..\\..\\..\\file",
              "..\\ddd", "\\a", "a\\..\\b", "C:\\x", "a\x00b", "a\nb", "\u00e9/\u0661",
              "x" * 1024, "x" * 1025, "a/" * 300 + "b", " ", "a /b", "~/a", "a:b"]
PATH_ALPHABET = "a./\\" + "-_ :\u00e9"


def path_corpus(seed: int, count: int) -> list[str]:
    chooser = random.Random(seed)
    return ["".join(chooser.choice(PATH_ALPHABET) for _ in range(chooser.choice([1, 2, 3, 4, 6])))
            for _ in range(count)]


def client_takes_path(path: str) -> str | None:
    """The path the installed client sends for ``path``, or None when it refuses it."""
    from huggingface_hub._commit_api import _validate_path_in_repo

    try:
        return _validate_path_in_repo(path)
    except ValueError:
        return None


def test_the_endpoint_takes_no_path_the_client_refuses():
    """A path reaches the endpoint as the client normalised it; the endpoint takes none the
    client refuses (checked on what the client would send, and on the raw path too)."""
    taken = 0
    for path in PATH_EDGES + path_corpus(38, 5000):
        sent = client_takes_path(path)
        for candidate in {path, sent} - {None}:
            try:
                _ids.repo_path(candidate)
            except StoreError as refusal:
                assert refusal.status in (400, 422)
                continue
            assert client_takes_path(candidate) == candidate, candidate
            taken += 1
    assert taken > 500


def test_the_hub_s_own_backslash_names_are_taken_and_a_leading_dotdot_refused():
    """The Hub stores ``folder/..\\..\\..\\file`` (huggingface_hub's suite uploads one) and
    answers 422 for ``..\\ddd``."""
    assert _ids.repo_path("folder/..\\..\\..\\file") == "folder/..\\..\\..\\file"
    assert _ids.repo_path("a\\b") == "a\\b"
    with pytest.raises(StoreError) as refused:
        _ids.repo_path("..\\ddd")
    assert refused.value.status == 422
