"""The local endpoint against the real huggingface_hub client (0.36 and 2.x): every route the
README claims answers as the Hub does, errors included, and nothing can hang a client."""

from __future__ import annotations

import http.client
import threading

import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationCopy
from huggingface_hub.utils import HfHubHTTPError

from cubepack.testing.hub import InstrumentedHub

TOKEN = "writer"


def within(seconds, action):
    """Run ``action``; fail (instead of hanging the suite) if it has not returned in time."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = action()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the client hung waiting for the endpoint"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def add(path, data=b"x"):
    return CommitOperationAdd(path_in_repo=path, path_or_fileobj=data)


@pytest.fixture
def repo(api):
    api.create_repo("ns/repo", repo_type="dataset")
    first = api.create_commit("ns/repo", [add("a.txt", b"one"), add("w.safetensors", b"\0" * 70000)],
                              commit_message="first", repo_type="dataset").oid
    return first


def test_errors_found_after_the_body_is_read_reach_the_client_at_once(api, repo):
    api.create_commit("ns/repo", [add("b.txt")], commit_message="second", repo_type="dataset")
    with pytest.raises(HfHubHTTPError) as stale:  # parent is no longer the head
        within(30, lambda: api.create_commit("ns/repo", [add("c.txt")], commit_message="late",
                                             repo_type="dataset", parent_commit=repo))
    assert stale.value.response.status_code == 412
    api.create_branch("ns/repo", branch="dev", repo_type="dataset")
    with pytest.raises(HfHubHTTPError) as exists:
        within(30, lambda: api.create_branch("ns/repo", branch="dev", repo_type="dataset"))
    assert exists.value.response.status_code == 409
    api.create_tag("ns/repo", tag="v1", repo_type="dataset")
    within(30, lambda: api.create_tag("ns/repo", tag="v1", repo_type="dataset", exist_ok=True))
    with pytest.raises(HfHubHTTPError):
        within(30, lambda: api.create_tag("ns/repo", tag="bad name", repo_type="dataset"))


def test_a_route_of_a_repo_that_is_not_there_answers_repo_not_found(api, repo):
    from huggingface_hub.utils import RepositoryNotFoundError

    assert api.revision_exists("ns/repo", "main", repo_type="dataset")
    assert not api.revision_exists("missing-repo", "main", repo_type="dataset")
    with pytest.raises(RepositoryNotFoundError):
        api.list_repo_commits("missing_repo_id", repo_type="dataset")
    with pytest.raises(RepositoryNotFoundError):
        api.list_repo_commits("ns/missing", repo_type="dataset")


def test_the_default_branch_cannot_be_deleted(api, repo):
    with pytest.raises(HfHubHTTPError) as caught:
        within(30, lambda: api.delete_branch("ns/repo", branch="main", repo_type="dataset"))
    assert caught.value.response.status_code == 403
    assert api.repo_info("ns/repo", repo_type="dataset").sha == repo


def test_a_copied_lfs_file_keeps_its_size(api, repo):
    api.create_commit("ns/repo", [CommitOperationCopy(src_path_in_repo="w.safetensors",
                                                      path_in_repo="copy.safetensors")],
                      commit_message="copy", repo_type="dataset")
    sizes = {entry.path: entry.size for entry in api.list_repo_tree("ns/repo",
                                                                    repo_type="dataset")}
    assert sizes["copy.safetensors"] == sizes["w.safetensors"] == 70000


def test_unknown_repos_are_typed_so_exists_checks_return_false(api, repo):
    import huggingface_hub

    assert api.repo_exists("gpt2") is False                   # no namespace
    assert api.repo_exists("nobody/nothing", repo_type="dataset") is False
    if huggingface_hub.__version__.startswith("0."):
        return  # 0.36's file_exists builds its URL from the import-time endpoint, not the API's
    assert api.file_exists("ns/repo", "missing.txt", repo_type="dataset") is False
    assert api.file_exists("ns/repo", "a.txt", repo_type="dataset") is True


def test_repo_settings_move_and_delete(api, repo):
    api.update_repo_settings("ns/repo", private=True, repo_type="dataset")
    assert api.repo_info("ns/repo", repo_type="dataset").private is True
    api.move_repo("ns/repo", "ns/moved", repo_type="dataset")
    assert api.repo_exists("ns/moved", repo_type="dataset")
    # The old id leads to the new one, as on the Hub (a redirect the client follows).
    assert api.repo_info("ns/repo", repo_type="dataset").id == "ns/moved"
    api.delete_repo("ns/moved", repo_type="dataset")
    assert not api.repo_exists("ns/moved", repo_type="dataset")
    assert not api.repo_exists("ns/repo", repo_type="dataset")


def test_repo_ids_match_case_insensitively(api, repo):
    assert api.repo_info("NS/Repo", repo_type="dataset").sha == repo


def test_expand_gives_the_last_commit_of_each_file(api, repo):
    second = api.create_commit("ns/repo", [add("a.txt", b"two")], commit_message="edit a",
                               repo_type="dataset").oid
    entries = {e.path: e for e in api.list_repo_tree("ns/repo", repo_type="dataset",
                                                     expand=True)}
    assert entries["a.txt"].last_commit.oid == second
    assert entries["w.safetensors"].last_commit.oid == repo
    [info] = api.get_paths_info("ns/repo", ["a.txt"], repo_type="dataset", expand=True)
    assert info.last_commit.title == "edit a"


def test_whoami_answers_what_the_hf_cli_reads(api):
    me = api.whoami()
    assert me["name"] == "local" and me["orgs"] == [] and "fullname" in me


def test_preupload_honours_gitignore(api, repo, tmp_path):
    api.create_commit("ns/repo", [add(".gitignore", b"*.log\nbuild/\n")],
                      commit_message="ignore", repo_type="dataset")
    folder = tmp_path / "up"
    (folder / "build").mkdir(parents=True)
    (folder / "keep.txt").write_text("k")
    (folder / "debug.log").write_text("l")
    (folder / "build" / "out.txt").write_text("b")
    api.upload_folder(repo_id="ns/repo", folder_path=str(folder), repo_type="dataset")
    paths = {e.path for e in api.list_repo_tree("ns/repo", repo_type="dataset", recursive=True)}
    assert "keep.txt" in paths and "debug.log" not in paths and "build/out.txt" not in paths


def raw(hub, method, path, headers=None, body=None):
    host, port = hub.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, dict(response.getheaders()), data


@pytest.mark.parametrize("header, status, expected", [
    ("bytes=0-2", 206, b"one"), ("bytes=1-", 206, b"ne"), ("bytes=-2", 206, b"ne"),
    ("bytes=3-", 416, b""), ("bytes=2-1", 416, b""), ("bytes=9-12", 416, b""),
])
def test_ranges_follow_the_http_rules(hub, repo, header, status, expected):
    code, headers, data = raw(hub, "GET", "/datasets/ns/repo/resolve/main/a.txt",
                              {"Range": header})
    assert code == status
    if status == 206:
        assert data == expected
    else:
        assert headers["Content-Range"] == "bytes */3"


def test_an_unauthenticated_huge_body_is_refused_without_reading_it(hub, repo):
    host, port = hub.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.putrequest("POST", "/api/datasets/ns/repo/commit/main")
    connection.putheader("Content-Length", str(300 * 1024 * 1024))
    connection.endheaders()  # and never send the 300 MB
    response = within(30, connection.getresponse)
    assert response.status == 401
    connection.close()


def test_uploads_a_killed_server_left_are_removed_at_start(tmp_path):
    blobs = tmp_path / "root" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / ".abc.12345.tmp").write_bytes(b"half an upload")
    with InstrumentedHub(tmp_path / "root"):
        assert list(blobs.iterdir()) == []


def test_hub_serve_logs_one_line_per_request(tmp_path):
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "cubepack", "hub", "serve", "--root",
                               str(tmp_path / "r"), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ))
    try:
        assert "serving" in server.stdout.readline()
        server.stdout.readline()  # the no-token notice
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/api/datasets/ns/none")
        assert connection.getresponse().status == 404
        line = server.stdout.readline()
        assert '"GET /api/datasets/ns/none" 404' in line
    finally:
        server.terminate()
        server.wait()


def test_one_process_serves_a_root(tmp_path):
    """A second endpoint on a served root is refused, naming the pid that serves it (it would
    take the first's uploads in progress for a killed server's leftovers); once the first
    stops, the root may be served again."""
    import os

    import pytest

    from cubepack.errors import UsageError

    with InstrumentedHub(tmp_path / "root"):
        with pytest.raises(UsageError) as second:
            InstrumentedHub(tmp_path / "root")
        assert f"pid {os.getpid()}" in str(second.value) and "--root" in str(second.value)
    with InstrumentedHub(tmp_path / "root"):
        pass


def test_an_endpoint_never_started_stops_and_frees_its_root(tmp_path):
    """``stop()`` of an endpoint made but never started returns (it waited forever for a
    serving loop that never ran) and frees the root for the next one."""
    hub = InstrumentedHub(tmp_path / "root")
    stopping = threading.Thread(target=hub.stop, daemon=True)
    stopping.start()
    stopping.join(60)  # a guard against hanging the suite, not a synchronisation
    assert not stopping.is_alive(), "stop() of an endpoint never started never returned"
    with InstrumentedHub(tmp_path / "root"):
        pass


def test_the_compiled_patterns_match_as_fnmatch_does_pattern_by_pattern():
    """One expression for all patterns means what one ``fnmatch`` per pattern meant: the path
    or its name matches, or the path is below a folder a pattern names (a random sweep)."""
    import fnmatch
    import random

    from cubepack.localhub._server import _matcher

    def reference(path, patterns):
        name = path.rsplit("/", 1)[-1]
        return any(fnmatch.fnmatch(path, bare) or fnmatch.fnmatch(name, bare)
                   or path.startswith(bare + "/")
                   for bare in (p.rstrip("/").lstrip("/") for p in patterns))

    chooser = random.Random(38)
    pieces = ["a", "b", "*", "?", "[ab]", "/", ".log", "[!a]"]
    for _ in range(300):
        patterns = ["".join(chooser.choice(pieces) for _ in range(chooser.randint(1, 5)))
                    for _ in range(chooser.randint(0, 6))]
        match = _matcher(patterns)
        for _ in range(20):
            path = "/".join("".join(chooser.choice("ab.") for _ in range(chooser.randint(1, 3)))
                            for _ in range(chooser.randint(1, 4)))
            assert match(path) == reference(path, patterns), (path, patterns)


def test_a_preupload_s_matching_work_is_bounded(hub, repo):
    """More files than MAX_PREUPLOAD_FILES, a .gitignore of more than MAX_PATTERNS_BYTES, or
    more than MAX_MATCH_WORK pattern x path-character matches: 400, at once; and a repo's own
    .gitignore larger than MAX_PATTERNS_BYTES is refused, never cut."""
    import json

    from cubepack.localhub import _server

    def preupload(files, ignore):
        body = json.dumps({"files": [{"path": f"d/f{i}.txt", "size": 1, "sample": ""}
                                     for i in range(files)], "gitIgnore": ignore}).encode()
        return raw(hub, "POST", "/api/datasets/ns/repo/preupload/main",
                   {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
                   body)

    assert preupload(256, "\n".join(f"*x{i}*" for i in range(1000)))[0] == 200
    assert preupload(_server.MAX_PREUPLOAD_FILES + 1, "")[0] == 400
    assert preupload(1, "*" * (_server.MAX_PATTERNS_BYTES + 1))[0] == 400
    status, _, data = preupload(_server.MAX_PREUPLOAD_FILES, "\n".join(
        f"*x{i}*" for i in range(4000)))
    assert status == 400 and b"pattern x path-character" in data
    from cubepack.localhub._store import AddFile, repo_ref

    hub.store.apply_commit(repo_ref("datasets", "ns", "repo"), "main", title="t", message="",
                           parent=None, operations=[AddFile(".gitignore", b"#" * (
                               _server.MAX_PATTERNS_BYTES + 1))])
    status, _, data = preupload(1, None)  # the repo's own: refused, not cut
    assert status == 400 and b"repo's .gitignore" in data


def test_connections_fit_the_process_s_descriptors(tmp_path):
    """Under a hard limit of 1024 descriptors (not raisable), served and waiting connections
    are lowered until they fit below it with the margin; under a raisable one, the soft limit
    is raised to the hard one and the bounds stay as documented."""
    import json
    import os
    import subprocess
    import sys

    script = (
        "import json, os, resource, sys\n"
        "soft, hard = (int(x) for x in sys.argv[1:3])\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))\n"
        "from cubepack.localhub import _server\n"
        "hub = _server.LocalHub(sys.argv[3])\n"
        "print(json.dumps([resource.getrlimit(resource.RLIMIT_NOFILE)[0], hub._httpd.limit,\n"
        "                  hub._httpd.max_waiting, len(os.listdir('/proc/self/fd'))]))\n"
        "hub._httpd.server_close()\n")
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    for soft, hard, expected in ((1024, 1024, None), (1024, 4096, (4096, 256, 1024))):
        done = subprocess.run([sys.executable, "-c", script, str(soft), str(hard),
                               str(tmp_path / f"root{hard}")], capture_output=True, text=True,
                              env=env, timeout=120, check=True)
        limit, served, waiting, in_use = json.loads(done.stdout)
        if expected is not None:
            assert (limit, served, waiting) == expected
        else:
            assert limit == 1024 and 0 < served < 256
            assert 3 * served + waiting + in_use <= 1024 - 32  # most of the margin left
