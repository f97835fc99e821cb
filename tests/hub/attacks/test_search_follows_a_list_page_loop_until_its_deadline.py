"""Adversary (issue #40, item 4): an endpoint whose list pages loop holds search for its deadline.

The promise (docs/how-to/hub.md): search asks the Hub's list API for candidates, "every page"
followed, and refuses loudly and precisely (the principles): an error says what happened.

The attack: an endpoint (a proxy, a broken mirror, a hostile host) whose `Link: rel="next"`
names a page already read: an empty page linking to itself, or a page of one repo linking to
itself; and a list naming the same repo on two pages without any loop.

What happened: huggingface_hub's pagination follows any next link. An empty page linking to
itself was requested ~10,000 times in 15 s until the deadline (an hour by default: millions of
requests), then reported as "was too slow; still waiting for GET /api/datasets (no answer
yet)", which it was not. A page repeating one repo made it `limit` candidates: the same repo
read and listed again and again.

The fix: search walks the pages itself (huggingface_hub's session, headers, retries and info
classes, the requests its list call would send) and refuses a next link it has already
followed with a HubError naming the loop; a repo the list names twice is one candidate.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from cubepack import HubError
from cubepack.hub import search

DIGEST = "sha256:" + "b" * 64
ENTRY = {"id": "ns/x", "sha": "a" * 40, "siblings": [{"rfilename": "README.md"}]}
#: page name -> (its entries, the page its Link names next, or None)
SHAPES = {
    "an empty page linking to itself": {"": ([], "p1"), "p1": ([], "p1")},
    "a page of one repo linking to itself": {"": ([ENTRY], "p1"), "p1": ([ENTRY], "p1")},
    "a loop of two pages": {"": ([], "p1"), "p1": ([], "p2"), "p2": ([], "p1")},
}


class Hostile:
    def __init__(self, pages):
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802 - http.server's name
                owner.requests += 1
                url = urlsplit(self.path)
                if url.path != "/api/datasets":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                name = parse_qs(url.query).get("cursor", [""])[0]
                entries, following = pages[name]
                body = json.dumps(entries).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if following is not None:
                    port = self.server.server_port
                    self.send_header("Link", f"<http://127.0.0.1:{port}/api/datasets?"
                                             f'filter=x&cursor={following}>; rel="next"')
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile(request):
    server = Hostile(request.param)
    yield server
    server.close()


@pytest.mark.parametrize("hostile", list(SHAPES.values()), ids=list(SHAPES), indirect=True)
def test_a_page_loop_is_refused_as_a_loop_at_once(hostile):
    with pytest.raises(HubError, match="loop") as raised:
        search(DIGEST, repo_type="dataset", endpoint=hostile.url, timeout=20)
    assert hostile.requests <= 4, hostile.requests
    assert "too slow" not in str(raised.value)


@pytest.mark.parametrize("hostile", [{"": ([ENTRY], "p1"), "p1": ([ENTRY, dict(ENTRY, id="ns/y")],
                                                                   None)}],
                         indirect=True)
def test_a_repo_listed_twice_is_one_candidate(hostile):
    result = search(DIGEST, repo_type="dataset", endpoint=hostile.url, timeout=20)
    assert [c.repo_id for c in result.others] == ["ns/x", "ns/y"]
    assert result.listed == 2 and hostile.requests == 2
