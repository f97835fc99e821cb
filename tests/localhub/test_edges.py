"""The endpoint's edge: every id in a request is parsed before it is used, and every body is
checked for shape and type, so a hostile request gets a 4xx with a sentence, never a 500 and
never another repo's files.

The sweeps are derived from the server's own routing table (:data:`ROUTES`): every route and
every placeholder of its path is swept, so a new route is covered as it is declared. Valid bodies
come from the real huggingface_hub client (0.36 or 2.x), recorded as the endpoint reads them;
each is then broken field by field.
"""

from __future__ import annotations

import copy
import hashlib
import http.client
import json
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

import pytest
from huggingface_hub import CommitOperationAdd

from cubepack.localhub import _server
from cubepack.localhub._ids import is_repo_id
from cubepack.localhub._server import ROUTES, SEGMENTS, STREAM
from cubepack.localhub._store import AddFile, StoreError, repo_ref

TOKEN = "writer"
REPO = "ns/repo"
SECRET = b"the secret of victim/secret"


class Client:
    """Raw requests on one keep-alive connection (opened again when the endpoint closes it):
    thousands of requests in seconds."""

    def __init__(self, hub):
        self.address = urlsplit(hub.url)
        self.connection: http.client.HTTPConnection | None = None

    def __call__(self, method, path, body=b"", token=TOKEN, headers=None):
        """(status, headers, body: parsed JSON when the answer is JSON, else bytes)."""
        sent = {"Authorization": f"Bearer {token}"} if token else {}
        sent.update(headers or {})
        for attempt in (1, 2):
            if self.connection is None:
                self.connection = http.client.HTTPConnection(self.address.hostname,
                                                             self.address.port, timeout=30)
            try:
                self.connection.request(method, path, body=body, headers=sent)
                response = self.connection.getresponse()
                data = response.read()
                break
            except (ConnectionError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
        if response.getheader("Connection", "").lower() == "close" or response.will_close:
            self.close()
        if response.getheader("Content-Type", "").startswith("application/json") and data:
            data = json.loads(data)
        return response.status, dict(response.getheaders()), data

    def close(self):
        if self.connection is not None:
            self.connection.close()
            self.connection = None


@pytest.fixture
def client(hub):
    raw = Client(hub)
    yield raw
    raw.close()


def ndjson(*lines):
    return b"\n".join(json.dumps(line).encode() for line in lines)


def put_file(hub, repo, path, data):
    """Commit one regular file to ``repo``'s main through the store (no client needed)."""
    return hub.store.apply_commit(repo, "main", title="add", message="", parent=None,
                                  operations=[AddFile(path, data)])


def refused(status, data, *, field=None):
    """The answer is a 4xx whose JSON body says what is wrong in one line (naming ``field``
    when given); never a 500, never a traceback."""
    assert 400 <= status < 500, (status, data)
    assert isinstance(data, dict) and isinstance(data.get("error"), str), data
    message = data["error"]
    assert message and "\n" not in message and "Internal error" not in message, message
    assert "Traceback" not in message and "KeyError" not in message, message
    if field is not None:
        assert field in message, (field, message)


# --- the reported break --------------------------------------------------------------------------
def test_a_parent_commit_cannot_name_another_repos_commit(hub, client):
    """parentCommit once joined into a path: ``../../../victim/secret/commits/<sha>`` based a
    public pull request on a private repo's commit, readable without a token."""
    victim, public = repo_ref("datasets", "victim", "secret"), repo_ref("datasets", "ns", "repo")
    hub.store.create(victim, private=True)
    hub.store.create(public, private=False)
    secret = put_file(hub, victim, "secret.txt", SECRET)
    for parent in (f"../../../victim/secret/commits/{secret}", secret.upper(), secret[:12],
                   f"{secret}/../{secret}", f"..\\..\\..\\victim\\{secret}", secret):
        for create_pr in ("?create_pr=1", ""):
            status, _, answer = client("POST", f"/api/datasets/ns/repo/commit/main{create_pr}",
                                       ndjson({"key": "header", "value": {
                                           "summary": "steal", "parentCommit": parent}}))
            # Malformed: a 400 naming the field. The victim's own id: not a commit of this
            # repo (404 for a proposal; 412 for a branch, whose head it is not).
            refused(status, answer, field="parentCommit" if parent != secret else None)
    status, _, data = client("GET", "/datasets/ns/repo/resolve/refs%2Fpr%2F1/secret.txt",
                             token=None)
    assert status == 404 and SECRET not in json.dumps(data).encode()
    assert hub.store.refs(public)["pulls"] == {}


def test_the_store_refuses_a_commit_id_that_is_not_40_hex(hub):
    """Defence in depth: whoever calls the store, a commit id becomes a path only as 40 hex."""
    repo = repo_ref("datasets", "ns", "repo")
    hub.store.create(repo, private=False)
    for bad in ("../../x", "A" * 40, "a" * 39, "a" * 41, "", None):
        with pytest.raises(StoreError) as caught:
            hub.store.commit(repo, bad)
        assert caught.value.status == 400
        with pytest.raises(StoreError):
            hub.store.open_pull_request(repo, "main", title="t", message="", parent=bad or "x",
                                        operations=[], author="a")


# --- a scene: every write route used once by the real client, its bodies recorded ---------------
@dataclass
class Sample:
    """One request as the real client sent it."""

    method: str
    path: str
    content_type: str
    body: bytes


@pytest.fixture
def scene(hub, api, monkeypatch, tmp_path):
    """A public repo the client has used on every route that reads a body (each request's body
    recorded by route), beside a private repo holding a secret."""
    samples: dict[_server.Route, list[Sample]] = {}
    original = _server._Handler._chunks

    def recording(self, limit, **options):
        chunks = []
        for chunk in original(self, limit, **options):
            chunks.append(chunk)
            yield chunk
        if self.route is not None:
            samples.setdefault(self.route, []).append(Sample(
                self.command, self.path, self.headers.get("Content-Type", ""), b"".join(chunks)))

    monkeypatch.setattr(_server._Handler, "_chunks", recording)
    victim = repo_ref("datasets", "victim", "secret")
    hub.store.create(victim, private=True)
    secret_commit = put_file(hub, victim, "secret.txt", SECRET)

    kw = {"repo_type": "dataset"}
    api.create_repo(REPO, **kw)
    api.create_commit(REPO, [CommitOperationAdd("README.md", b"---\nlicense: mit\n---\n"),
                             CommitOperationAdd("a.txt", b"one"),
                             CommitOperationAdd("w.safetensors", b"\0" * 70000)],
                      commit_message="first", commit_description="why", **kw)
    head = api.repo_info(REPO, **kw).sha
    api.create_commit(REPO, [CommitOperationAdd("b.txt", b"two")], commit_message="second",
                      parent_commit=head, **kw)
    api.create_commit(REPO, [CommitOperationAdd("c.txt", b"three")], commit_message="propose",
                      create_pr=True, **kw)
    api.create_tag(REPO, tag="v1", tag_message="first tag", **kw)
    api.create_branch(REPO, branch="dev", revision="main", **kw)
    api.get_paths_info(REPO, ["a.txt", "missing"], expand=True, **kw)
    talk = api.create_discussion(REPO, title="A question", description="details", **kw)
    comment = api.comment_discussion(REPO, talk.num, "An answer", **kw)
    api.edit_discussion_comment(REPO, talk.num, comment.id, "A better answer", **kw)
    api.rename_discussion(REPO, talk.num, "A clearer question", **kw)
    api.change_discussion_status(REPO, talk.num, "closed", comment="done", **kw)
    api.merge_pull_request(REPO, 1, comment="thanks", **kw)
    api.update_repo_settings(REPO, private=False, **kw)
    api.create_repo("ns/throwaway", **kw)
    api.move_repo("ns/throwaway", "ns/moved", **kw)
    api.delete_repo("ns/moved", **kw)
    monkeypatch.setattr(_server._Handler, "_chunks", original)  # the sweeps are not recorded
    return {"samples": samples, "secret_commit": secret_commit, "comment": comment.id,
            "oid": hashlib.sha256(b"\0" * 70000).hexdigest(), "root": tmp_path}


def valid_ids(scene):
    """A value for every placeholder of the routing table that names something in the scene."""
    return {"kind": "datasets", "datasets": "datasets", "namespace": "ns", "name": "repo",
            "revision": "main", "branch": "fresh", "ref_kind": "tag", "ref": "v1", "num": "2",
            "event": scene["comment"], "oid": scene["oid"], "path": "a.txt",
            "xet": "xet-write-token"}


def body_routes():
    """Every route a body may be sent to: POST and PUT, and any other that reads one (the
    DELETE of a repo names it in its body)."""
    return [route for route in ROUTES
            if {"POST", "PUT"} & set(route.methods) or route.body is not None]


def assert_secret_kept(hub, scene):
    """No public repo's tree holds the secret's blob, and nothing was written outside the
    endpoint's root."""
    secret_blob = hashlib.sha256(SECRET).hexdigest()
    for namespace in (hub.store.root / "repos" / "datasets").iterdir():
        for folder in namespace.iterdir():
            repo = repo_ref("datasets", namespace.name, folder.name)
            if hub.store.is_private(repo):
                continue
            refs = hub.store.refs(repo)
            for commit in [*refs["branches"].values(), *refs["tags"].values(),
                           *refs["pulls"].values()]:
                for record in hub.store.history(repo, commit):
                    assert all(entry["sha256"] != secret_blob for entry in record["tree"].values())
    assert sorted(p.name for p in scene["root"].iterdir()) == ["root"]


# --- the body sweep ------------------------------------------------------------------------------
#: Bodies no route takes: not JSON, not UTF-8, JSON of the wrong type, NaN, numbers too large to
#: read, nesting too deep.
MALFORMED = [b"{not json", b"\xff\xfe\x00", b"[]", b"[{}]", b'"x"', b"1", b"null", b"true",
             b'{"a": NaN}', b"1e999", b"9" * 5000, b"[" * 10000 + b"]" * 10000,
             b'{"a": ' * 1000 + b"1" + b"}" * 1000, b"\x00"]
#: Values of every JSON type: a field is sent each that is not of its own type.
TYPED = [1, 1.5, True, "x", [], {}, [1], {"a": 1}]
#: Numbers no size or count may be.
NUMBERS = [-1, 10**30, 2**53, 2**63]
#: Strings that have escaped a folder somewhere, or may.
HOSTILE = ["..", "../..", "../../../victim/secret/commits/" + "a" * 40, "..%2f..",
           "%2e%2e%2f%2e%2e", "..\\..\\x", "/etc/passwd", "C:\\x", "refs/pr/../..",
           "refs/pr/1/../../x", "refs/heads/../../x", "\u2025", "\uff0e\uff0e/x", "a\x00b",
           "a\r\nX-Injected: yes", "\ud800", "\u202e", "x" * 300, "", " "]


def json_type(value):
    return (type(None) if value is None else bool if isinstance(value, bool)
            else (int, float) if isinstance(value, (int, float)) else type(value))


def nodes(document, where=()):
    """(path, value) of every node under the root of a JSON document."""
    children = document.items() if isinstance(document, dict) else \
        enumerate(document) if isinstance(document, list) else ()
    for key, value in children:
        yield (*where, key), value
        yield from nodes(value, (*where, key))


def replaced(document, where, value):
    changed = copy.deepcopy(document)
    target = changed
    for key in where[:-1]:
        target = target[key]
    if value is _DELETE:
        if isinstance(target, dict):
            del target[where[-1]]
        else:
            target.pop(where[-1])
    else:
        target[where[-1]] = value
    return changed


_DELETE = object()


def field_name(where):
    """The name a refusal must mention: the last object key on the way to the node."""
    return next(str(key) for key in reversed(where) if isinstance(key, str)) \
        if any(isinstance(key, str) for key in where) else None


def mutations(sample):
    """(body, field that a refusal must name, whether it must be refused) for every way of
    breaking ``sample`` one node at a time: every node given every other JSON type, every number
    made huge or negative, every string made hostile, every node null or missing."""
    if "ndjson" in sample.content_type:
        lines = [json.loads(line) for line in sample.body.splitlines() if line.strip()]

        def encode(changed):
            return ndjson(*changed)

        document = lines
    elif "json" in sample.content_type:
        document = json.loads(sample.body) if sample.body.strip() else {}

        def encode(changed):
            return json.dumps(changed).encode()
    else:
        return
    for where, value in nodes(document):
        named = field_name(where)
        for other in TYPED:
            if json_type(other) != json_type(value):
                yield encode(replaced(document, where, other)), named, True
        if isinstance(value, int) and not isinstance(value, bool):
            for number in NUMBERS:
                yield encode(replaced(document, where, number)), named, True
        if isinstance(value, str):
            for text in HOSTILE:
                yield encode(replaced(document, where, text)), named, False
        yield encode(replaced(document, where, None)), named, False
        yield encode(replaced(document, where, _DELETE)), named, False


def form_mutations(sample):
    form = parse_qs(sample.body.decode(), keep_blank_values=True)
    for key in form:
        for text in HOSTILE:
            if "\ud800" not in text:
                yield urlencode({**form, key: [text]}, doseq=True).encode()


def test_every_write_route_refuses_malformed_bodies_with_a_sentence(hub, scene, client):
    samples, ids = scene["samples"], valid_ids(scene)
    routes = body_routes()
    assert routes and all(set(route.placeholders()) <= set(ids) for route in ROUTES), \
        "a placeholder the sweeps have no valid value for: add it to valid_ids"
    for route in routes:
        if route.body is not None:  # the client scene must have used every route with a body
            assert samples.get(route), f"the client scene never used {route.template}"
        base = samples[route][0] if samples.get(route) else None
        path = base.path if base else route.path(**{k: quote(v, safe="") for k, v in ids.items()})
        method = base.method if base else next(m for m in route.methods if m != "GET")
        json_types = {"application/json"} | ({base.content_type} if base and "form" not in
                                             base.content_type else set())
        for body in MALFORMED:  # (a form is any text: only the JSON reading of a route is here)
            for content_type in json_types:
                headers = {"Content-Type": content_type} if content_type else {}
                status, _, data = client(method, path, body, headers=headers)
                refused(status, data)
        for sample in samples.get(route, []):
            if route.body is STREAM:  # the bytes of an upload: any others are refused
                for body in (b"x" * len(sample.body), sample.body[:-1], b""):
                    refused(*client(sample.method, sample.path, body)[::2])
                continue
            headers = {"Content-Type": sample.content_type}
            for body, named, must in mutations(sample):
                status, _, data = client(sample.method, sample.path, body, headers=headers)
                assert status < 500, (route.template, body[:300], data)
                if must:
                    refused(status, data, field=named)
                elif status >= 400:
                    refused(status, data)
            if "form" in sample.content_type:
                for body in form_mutations(sample):
                    status, _, data = client(sample.method, sample.path, body, headers=headers)
                    assert status < 500, (route.template, body[:300], data)
                for body, named in ((b"paths=\xff", "UTF-8"), (b"paths=a&expand=maybe", "expand")):
                    refused(*client(sample.method, sample.path, body, headers=headers)[::2],
                            field=named)
    assert_secret_kept(hub, scene)


def test_commit_bodies_are_refused_line_by_line(hub, scene, client):
    """The NDJSON of a commit: a line that is not an object, no header, two headers, an unknown
    operation, bad base64 or a path that leaves the repo: a 400 naming the line and field."""
    header = {"key": "header", "value": {"summary": "s"}}
    add = {"key": "file", "value": {"path": "x.txt", "content": "eA==", "encoding": "base64"}}
    cases = [
        (b"", "header"), (ndjson(add), "header"), (ndjson(header, header), "header"),
        (ndjson(header, [1]), "Line 2"), (ndjson(header, "x"), "Line 2"),
        (ndjson(header, {"key": "file"}), "value"), (ndjson(header, {"value": {}}), "key"),
        (ndjson(header, {"key": "copy", "value": {}}), "key"),
        (ndjson(header, {"key": "file", "value": {**add["value"], "content": "e A=="}}), "base64"),
        (ndjson(header, {"key": "file", "value": {**add["value"], "content": "eA="}}), "base64"),
        (ndjson(header, {"key": "file", "value": {**add["value"], "path": "../x"}}), "path"),
        (ndjson(header, {"key": "file", "value": {**add["value"], "path": "/etc/x"}}), "path"),
        (ndjson(header, {"key": "file", "value": {**add["value"], "encoding": "hex"}}), "encoding"),
        (ndjson(header, {"key": "lfsFile", "value": {"path": "w", "oid": "../x"}}), "oid"),
        (ndjson(header, {"key": "lfsFile", "value": {"path": "w", "oid": "a" * 64,
                                                     "size": -1}}), "size"),
        (ndjson(header, {"key": "deletedFolder", "value": {"path": "../"}}), "path"),
        (ndjson({"key": "header", "value": {"summary": 1}}), "summary"),
        (ndjson({"key": "header", "value": {"parentCommit": ["a"]}}), "parentCommit"),
        (b'{"key": "header", "value": {}}\n{"key": "file", "value": {"path": "a", "conte', "Line 2"),
    ]
    for body, named in cases:
        for create_pr in ("", "?create_pr=1"):
            refused(*client("POST", f"/api/datasets/{REPO}/commit/main{create_pr}", body)[::2],
                    field=named)


# --- the id sweep --------------------------------------------------------------------------------
#: Ids no route may take: traversal in every spelling, ids of the wrong form, other repos' ids.
HOSTILE_IDS = ["..", ".", "../..", "../../../victim/secret", "..%2f..%2fvictim",
               "%2e%2e%2f%2e%2e%2fvictim", "%252e%252e%252f", "..\\..\\victim", "\\..\\",
               "/etc/passwd", "C:\\Windows", "refs/pr/../..", "refs/pr/1/../../x",
               "refs/heads/../../x", "refs/tags/..", "\u2025", "\u2025/\u2025", "\uff0e\uff0e",
               "a\x00b", "a\r\nX-Injected: yes", "\u20ac\u202e", "x" * 300, "A" * 40, "g" * 40,
               "a" * 39 + "/", "*", "?"]
#: Ids of the form of a number: refused where a number is expected, names of nothing elsewhere.
NUMBER_IDS = ["-1", "1e3", "01", "0", "+1", "1.0", "1000000000", "9" * 40, "\u0661"]


def well_formed(placeholder, value):
    """Whether the edge takes ``value`` (as the server unquotes it) in ``placeholder``: then it
    names nothing that exists, and is answered as such; else it must be refused."""
    if placeholder == "namespace":
        return is_repo_id(value, "repo")
    if placeholder == "name":
        return is_repo_id("ns", value)
    if SEGMENTS[placeholder].parse is str:  # kind, ref_kind, path...: their pattern says
        return re.fullmatch(SEGMENTS[placeholder].pattern, value) is not None
    try:
        SEGMENTS[placeholder].parse(value)
    except StoreError:
        return False
    return True


def quoted(value):
    """The spellings of ``value`` in a URL: fully quoted, with its slashes raw, and (when it is
    already URL-safe) as it is, so ``%2e%2e`` arrives as ``..``."""
    spellings = {quote(value, safe=""), quote(value, safe="/")}
    if all(33 <= ord(ch) < 127 and ch not in "?#" for ch in value):
        spellings.add(value)
    return spellings


def test_every_id_of_every_route_refuses_traversal_and_malformed_ids(hub, scene, client):
    samples, ids = scene["samples"], valid_ids(scene)
    hostile = [*HOSTILE_IDS, scene["secret_commit"], scene["secret_commit"][:12],
               hashlib.sha256(SECRET).hexdigest()]
    checked = 0
    for route in ROUTES:
        base = samples.get(route, [None])[0]
        for method in route.methods:
            body = b"" if method in ("GET", "HEAD") else (base.body if base else b"{}")
            headers = {"Content-Type": base.content_type} if base and body else {}
            for placeholder in route.placeholders():
                for value in [*hostile, *NUMBER_IDS]:
                    for spelling in quoted(value):
                        path = route.path(**{**{k: quote(v, safe="") for k, v in ids.items()},
                                             placeholder: spelling})
                        status, answer_headers, data = client(method, path, body, headers=headers)
                        checked += 1
                        assert "X-Injected" not in answer_headers
                        assert SECRET not in (data if isinstance(data, bytes)
                                              else json.dumps(data).encode())
                        if well_formed(placeholder, unquote(spelling)):
                            assert status < 500, (method, path, data)  # e.g. 01 as a branch
                            continue
                        assert 400 <= status < 500, (method, path, status, data)
                        if method != "HEAD":
                            refused(status, data)
    assert checked > 5000
    # Well-formed names of nothing were answered too; the malformed ones all refused. Some
    # routes answer a name of nothing leniently (preupload to a revision not there yet: no
    # files known), so the proof that no id escaped is here: nothing written, nothing leaked.
    assert_secret_kept(hub, scene)


@pytest.mark.parametrize("number", NUMBER_IDS + ["", "1/", "1 ", "%2B1"])
def test_discussion_numbers_are_plain_positive_integers(hub, scene, client, number):
    """``01`` is not discussion 1 and ``1e3`` not 1000: a number is refused unless plainly
    written (the route matches any segment, so each is a 400 saying so, not a missing route)."""
    status, _, data = client("GET", f"/api/datasets/{REPO}/discussions/{quote(number, safe='%/')}")
    assert 400 <= status < 500, (number, data)
    refused(status, data)
    status, _, data = client("GET", f"/api/datasets/{REPO}/discussions/2")
    assert status == 200 and data["num"] == 2


def test_error_messages_cannot_add_headers(hub, scene, client):
    """A message quotes the request; in the X-Error-Message header it is escaped, so a CR/LF in
    a revision or name adds no header, and a character outside latin-1 does not break the
    answer half-way."""
    for path in ("/api/models/%0d%0aX-Injected:%20yes",
                 f"/api/datasets/{REPO}/revision/a%0d%0aX-Injected:%20yes",
                 f"/api/datasets/{REPO}/revision/%E2%82%AC%0A"):
        status, headers, data = client("GET", path)
        assert status == 404 and "X-Injected" not in headers
        assert all(" " <= ch <= "~" for ch in headers["X-Error-Message"])
        refused(status, data)


def test_upload_urls_with_a_malformed_size_or_signature_are_forbidden(hub, scene, client):
    oid = scene["oid"]
    for query in ("size=x&sig=a", "size=-1&sig=a", "size=1e3&sig=a", f"size={10**40}&sig=a",
                  "size=70000&sig=%E2%82%AC", "size=70000", "sig=a", ""):
        for method, action in (("PUT", "upload"), ("POST", "verify")):
            status, _, data = client(method, f"/lfs/{action}/datasets/ns/repo/{oid}?{query}",
                                     b"{}")
            assert status == 403, (query, data)
            refused(status, data)


def test_a_malformed_content_length_is_answered_on_every_route(hub, scene):
    """A Content-Length that is no number: every route answers 4xx and closes (it once dropped
    the connection unanswered, with a traceback, on a route that refused before the body)."""
    import socket

    ids = {k: quote(v, safe="") for k, v in valid_ids(scene).items()}
    address = urlsplit(hub.url)
    for route in ROUTES:
        for method in route.methods:
            with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
                sock.sendall(f"{method} {route.path(**ids)} HTTP/1.1\r\nHost: x\r\n"
                             f"Authorization: Bearer {TOKEN}\r\nContent-Length: 1x\r\n\r\n"
                             .encode())
                answer = sock.recv(65536)
                assert answer.startswith(b"HTTP/1.1 4"), (method, route.template, answer[:100])


def test_the_request_log_escapes_what_the_client_sent(tmp_path):
    from cubepack.testing.hub import InstrumentedHub

    lines = []
    with InstrumentedHub(tmp_path / "root", log=lines.append) as hub:
        import socket

        address = urlsplit(hub.url)
        with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
            sock.sendall(b"GET /api/datasets/ns/repo/tree/main/\x1b[2J\xff HTTP/1.1\r\n"
                         b"Host: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 404")
    assert lines and all("\x1b" not in line and "\xff" not in line for line in lines)
    assert "\\x1b[2J" in lines[0]
