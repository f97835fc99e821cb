"""Pull requests and discussions on the local endpoint, through the real huggingface_hub client
(0.36 and 2.x): a proposal lands on refs/pr/N, which every read route resolves, and the branch
moves only when it is merged."""

from __future__ import annotations

import http.client
from urllib.parse import quote, urlsplit

import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
from huggingface_hub.utils import HfHubHTTPError

TOKEN = "writer"
REPO = "ns/repo"


def add(path, data=b"x"):
    return CommitOperationAdd(path_in_repo=path, path_or_fileobj=data)


@pytest.fixture
def main(api):
    """A dataset repo whose main holds a.txt ("one"); its head commit."""
    api.create_repo(REPO, repo_type="dataset")
    return api.create_commit(REPO, [add("a.txt", b"one")], commit_message="first",
                             repo_type="dataset").oid


def download(hub, revision, path):
    """GET /datasets/REPO/resolve/<quoted revision>/<path>: (status, body, X-Repo-Commit)."""
    host = urlsplit(hub.url)
    connection = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
    try:
        connection.request("GET", f"/datasets/{REPO}/resolve/{quote(revision, safe='')}/{path}",
                           headers={"Authorization": f"Bearer {TOKEN}"})
        response = connection.getresponse()
        return response.status, response.read(), response.getheader("X-Repo-Commit")
    finally:
        connection.close()


def head(api, revision="main"):
    return api.repo_info(REPO, repo_type="dataset", revision=revision).sha


def test_create_pr_lands_on_refs_pr_and_main_does_not_move(api, hub, main):
    proposed = api.create_commit(REPO, [add("b.txt", b"two"), CommitOperationDelete("a.txt")],
                                 commit_message="propose", commit_description="why",
                                 repo_type="dataset", create_pr=True)
    assert (proposed.pr_num, proposed.pr_revision) == (1, "refs/pr/1")
    assert proposed.pr_url == f"{hub.url}/datasets/{REPO}/discussions/1"
    assert head(api) == main  # main never moves on a proposal
    assert head(api, "refs/pr/1") == proposed.oid
    tree = {f.path for f in api.list_repo_tree(REPO, repo_type="dataset", revision="refs/pr/1")}
    assert tree == {".gitattributes", "b.txt"}
    assert [p.path for p in api.get_paths_info(REPO, ["b.txt"], repo_type="dataset",
                                               revision="refs/pr/1")] == ["b.txt"]
    assert download(hub, "refs/pr/1", "b.txt") == (200, b"two", proposed.oid)
    assert download(hub, "main", "b.txt")[0] == 404
    commits = api.list_repo_commits(REPO, repo_type="dataset", revision="refs/pr/1")
    assert [c.commit_id for c in commits][:2] == [proposed.oid, main]
    api.create_tag(REPO, tag="proposal", revision="refs/pr/1", repo_type="dataset")
    assert head(api, "proposal") == proposed.oid
    refs = api.list_repo_refs(REPO, repo_type="dataset", include_pull_requests=True)
    assert [(r.ref, r.target_commit) for r in refs.pull_requests] == [("refs/pr/1", proposed.oid)]
    details = api.get_discussion_details(REPO, 1, repo_type="dataset")
    assert details.is_pull_request and details.status == "open"
    assert details.target_branch == "refs/heads/main" and details.title == "propose"
    assert [e.type for e in details.events] == ["comment", "commit"]
    assert details.events[0].content == "why" and details.events[1].oid == proposed.oid


def test_commits_to_an_open_pr_move_it_and_merging_moves_main(api, hub, main):
    api.create_commit(REPO, [add("b.txt", b"two")], commit_message="propose",
                      repo_type="dataset", create_pr=True)
    more = api.create_commit(REPO, [add("c.txt", b"three")], commit_message="more",
                             repo_type="dataset", revision="refs/pr/1").oid
    assert head(api, "refs/pr/1") == more and head(api) == main
    api.merge_pull_request(REPO, 1, repo_type="dataset", comment="thanks")
    details = api.get_discussion_details(REPO, 1, repo_type="dataset")
    assert details.status == "merged" and details.merge_commit_oid == head(api)
    files = {f.path for f in api.list_repo_tree(REPO, repo_type="dataset")}
    assert files == {".gitattributes", "a.txt", "b.txt", "c.txt"}
    assert [c.title for c in api.list_repo_commits(REPO, repo_type="dataset")][:2] == [
        "Merge pull request #1: propose", "first"]
    with pytest.raises(HfHubHTTPError) as closed:  # a merged request takes no more commits
        api.create_commit(REPO, [add("d.txt")], commit_message="late", repo_type="dataset",
                          revision="refs/pr/1")
    assert closed.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError) as again:
        api.merge_pull_request(REPO, 1, repo_type="dataset")
    assert again.value.response.status_code == 403


def test_a_pr_against_another_branch_and_from_a_parent_commit(api, hub, main):
    api.create_branch(REPO, branch="dev", repo_type="dataset")
    on_dev = api.create_commit(REPO, [add("dev.txt")], commit_message="dev work",
                               repo_type="dataset", revision="dev").oid
    proposed = api.create_commit(REPO, [add("x.txt")], commit_message="to dev",
                                 repo_type="dataset", revision="dev", create_pr=True)
    assert api.get_discussion_details(REPO, proposed.pr_num,
                                      repo_type="dataset").target_branch == "refs/heads/dev"
    assert head(api, "dev") == on_dev
    api.create_commit(REPO, [add("a.txt", b"newer")], commit_message="main moves",
                      repo_type="dataset")
    old = api.create_commit(REPO, [add("y.txt")], commit_message="from the old head",
                            repo_type="dataset", parent_commit=main, create_pr=True)
    commits = api.list_repo_commits(REPO, repo_type="dataset", revision=old.pr_revision)
    assert commits[1].commit_id == main  # started where the proposer was, no 412
    api.merge_pull_request(REPO, old.pr_num, repo_type="dataset")
    assert download(hub, "main", "a.txt")[1] == b"newer"  # main's own change kept
    assert download(hub, "main", "y.txt")[1] == b"x"


def test_a_conflicting_pr_is_not_merged_and_names_the_files(api, main):
    api.create_commit(REPO, [add("a.txt", b"theirs")], commit_message="change a",
                      repo_type="dataset", create_pr=True)
    api.create_commit(REPO, [add("a.txt", b"ours")], commit_message="main changes a too",
                      repo_type="dataset")
    before = head(api)
    details = api.get_discussion_details(REPO, 1, repo_type="dataset")
    assert details.conflicting_files == ["a.txt"]
    with pytest.raises(HfHubHTTPError) as conflict:
        api.merge_pull_request(REPO, 1, repo_type="dataset")
    assert conflict.value.response.status_code == 409 and "a.txt" in str(conflict.value)
    assert head(api) == before
    assert api.get_discussion_details(REPO, 1, repo_type="dataset").status == "open"


def test_discussions_list_filter_comment_rename_edit_close_and_reopen(api, main):
    pr = api.create_pull_request(REPO, title=" An empty proposal ", repo_type="dataset")
    assert (pr.num, pr.title, pr.git_reference) == (1, "An empty proposal", "refs/pr/1")
    assert head(api, "refs/pr/1") == main  # opened at the head of main
    talk = api.create_discussion(REPO, title="A question", repo_type="dataset")
    assert talk.num == 2 and not talk.is_pull_request

    def listed(**filters):
        return [d.num for d in api.get_repo_discussions(REPO, repo_type="dataset", **filters)]

    assert listed() == [2, 1]  # newest first
    assert listed(discussion_type="pull_request") == [1]
    assert listed(discussion_type="discussion") == [2]
    assert listed(author="somebody-else") == []
    comment = api.comment_discussion(REPO, 2, "An answer", repo_type="dataset")
    edited = api.edit_discussion_comment(REPO, 2, comment.id, "A better answer",
                                         repo_type="dataset")
    assert edited.edited and edited.content == "A better answer"
    renamed = api.rename_discussion(REPO, 2, "A clearer question", repo_type="dataset")
    assert (renamed.old_title, renamed.new_title) == ("A question", "A clearer question")
    closed = api.change_discussion_status(REPO, 2, "closed", repo_type="dataset")
    assert closed.new_status == "closed"
    assert listed(discussion_status="open") == [1] and listed(discussion_status="closed") == [2]
    api.change_discussion_status(REPO, 2, "open", repo_type="dataset")
    details = api.get_discussion_details(REPO, 2, repo_type="dataset")
    assert details.title == "A clearer question" and details.status == "open"
    assert [e.type for e in details.events] == ["comment", "comment", "title-change",
                                                "status-change", "status-change"]
    with pytest.raises(HfHubHTTPError) as missing:
        api.get_discussion_details(REPO, 9, repo_type="dataset")
    assert missing.value.response.status_code == 404


def test_discussion_writes_need_a_token(api, hub, main):
    anonymous = HfApi(endpoint=hub.url, token=False)
    with pytest.raises(HfHubHTTPError) as refused:
        anonymous.create_discussion(REPO, title="spam", repo_type="dataset")
    assert refused.value.response.status_code == 401
    assert list(api.get_repo_discussions(REPO, repo_type="dataset")) == []
