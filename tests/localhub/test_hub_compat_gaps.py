"""What huggingface_hub's own suite found the endpoint claiming and not doing, or refusing where
a normal client needs an answer (issue #38, item 6), driven by the real client (0.36 and 2.x):
a repo id without a namespace is a missing repo, not an untyped "No route"; file names with
backslashes are stored as the Hub stores them; the ``gitIgnore`` an upload sends with its
pre-upload check is honoured; a moved repo's old id leads to the new one; settings the endpoint
does not serve are refused, not answered 200 and dropped.
"""

from __future__ import annotations

import pytest
from huggingface_hub import CommitOperationAdd, HfApi
from huggingface_hub import constants as hub_constants
from huggingface_hub.utils import (
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from cubepack.testing.hub import InstrumentedHub

TOKEN = "writer"


@pytest.fixture
def hub(tmp_path):
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN]) as server:
        yield server


@pytest.fixture
def api(hub, monkeypatch, tmp_path):
    monkeypatch.setattr(hub_constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    import huggingface_hub

    if huggingface_hub.__version__.startswith("0."):  # 0.36 builds and parses URLs with these
        from huggingface_hub import file_download

        monkeypatch.setattr(hub_constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE",
                            hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    return HfApi(endpoint=hub.url, token=TOKEN)


def test_a_repo_id_without_a_namespace_is_a_missing_repo(api):
    assert api.file_exists("repo-that-does-not-exist", "file.txt") is False
    assert api.repo_exists("repo-that-does-not-exist") is False
    with pytest.raises(RepositoryNotFoundError):
        api.unlike("missing_repo_id")
    with pytest.raises(RepositoryNotFoundError) as missing:
        api.delete_repo("repo-that-does-not-exist")
    assert missing.value.response.headers.get("X-Request-Id")  # the Hub's errors name one


def test_file_names_with_backslashes_are_stored_as_the_hub_stores_them(api, tmp_path):
    api.create_repo("ns/repo")
    name = "folder/..\\..\\..\\file"  # huggingface_hub's suite uploads this very name
    api.upload_file(path_or_fileobj=b"content", path_in_repo=name, repo_id="ns/repo")
    assert name in api.list_repo_files("ns/repo")
    with pytest.raises(HfHubHTTPError) as refused:  # a leading ..\ the Hub refuses: 422
        api.upload_file(path_or_fileobj=b"content", path_in_repo="..\\ddd", repo_id="ns/repo")
    assert refused.value.response.status_code == 422


def test_the_gitignore_an_upload_sends_is_honoured(api, tmp_path):
    folder = tmp_path / "folder"
    (folder / "nested").mkdir(parents=True)
    (folder / "nested" / "file.bin").write_bytes(b"\0" * 10)
    (folder / "kept.txt").write_text("kept")
    (folder / ".gitignore").write_text("nested/*\n")
    api.create_repo("ns/repo")
    api.upload_folder(folder_path=str(folder), repo_id="ns/repo")
    assert not api.file_exists("ns/repo", "nested/file.bin")
    assert api.file_exists("ns/repo", "kept.txt") and api.file_exists("ns/repo", ".gitignore")


def test_a_moved_repos_old_id_leads_to_the_new_one(api):
    api.create_repo("ns/before", private=True)
    api.upload_file(path_or_fileobj=b"content", path_in_repo="file.txt", repo_id="ns/before")
    api.move_repo("ns/before", "ns/after")
    path = api.hf_hub_download("ns/before", filename="file.txt")
    assert open(path, "rb").read() == b"content"
    assert api.repo_info("ns/before").id == "ns/after"
    anonymous = HfApi(endpoint=api.endpoint, token=False)  # a private repo's new id stays hidden
    with pytest.raises(RepositoryNotFoundError):
        anonymous.repo_info("ns/before")
    api.move_repo("ns/after", "ns/before")  # the old id is a repo again: no redirect
    assert api.repo_info("ns/before").id == "ns/before"
    api.move_repo("ns/before", "ns/third")
    api.create_repo("ns/before")  # a new repo at an old id: it leads nowhere else, then or later
    api.delete_repo("ns/before")
    assert not api.repo_exists("ns/before")


def test_settings_the_endpoint_does_not_serve_are_refused(api):
    api.create_repo("ns/repo")
    for gated in ("auto", "manual"):
        with pytest.raises(HfHubHTTPError) as refused:
            api.update_repo_settings("ns/repo", gated=gated)
        assert refused.value.response.status_code == 422
        assert "gated" in str(refused.value)
    assert api.repo_info("ns/repo").gated is False
    api.update_repo_settings("ns/repo", gated=False)  # what it already is: taken


def test_a_tag_on_a_missing_revision_names_the_revision(api):
    api.create_repo("ns/repo")
    with pytest.raises(RevisionNotFoundError):
        api.create_tag("ns/repo", tag="invalid tag", revision="foobar")


def test_xet_storage_asked_for_in_settings_is_refused(hub, api):
    """0.36 sends ``xetEnabled``; 2.x has no argument for it: raw HTTP, both."""
    import http.client
    import json
    from urllib.parse import urlsplit

    api.create_repo("ns/repo")
    address = urlsplit(hub.url)
    for asked, status in ((True, 422), (False, 200)):
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
        connection.request("PUT", "/api/models/ns/repo/settings",
                           json.dumps({"xetEnabled": asked}),
                           {"Authorization": f"Bearer {TOKEN}",
                            "Content-Type": "application/json"})
        assert connection.getresponse().status == status
        connection.close()


def test_a_gitattributes_lfs_pattern_decides_the_upload_mode(api):
    """huggingface_hub's suite: a repo whose .gitattributes tracks *.png by LFS stores a 10-byte
    PNG as an LFS file, as the Hub does (the endpoint judged by size and suffix alone)."""
    api.create_repo("ns/repo")
    api.upload_file(path_or_fileobj=b"*.png filter=lfs diff=lfs merge=lfs -text\n",
                    path_in_repo=".gitattributes", repo_id="ns/repo")
    api.upload_file(path_or_fileobj=b"0123456789", path_in_repo="image.png", repo_id="ns/repo")
    [sibling] = [s for s in api.model_info("ns/repo", files_metadata=True).siblings
                 if s.rfilename == "image.png"]
    assert sibling.lfs is not None


def test_auth_check_answers_for_a_readable_repo(api):
    api.create_repo("ns/repo", repo_type="dataset")
    api.auth_check("ns/repo", repo_type="dataset")  # no error: readable
    with pytest.raises(RepositoryNotFoundError):
        api.auth_check("ns/missing")
