"""Adversary (issue #38, item 3): a preupload whose `.gitignore` has many patterns costs
patterns x files `fnmatch` calls, unbounded: one client's 16 such requests of ~2 MB hold the
endpoint's CPU for many minutes, and normal requests slow down 100-fold.

The promise: issue #38, "Bounded resources [...] a normal request is answered within its usual
time"; docs/reference/local-hub.md, Limits: "so one client cannot take the endpoint", and
"preupload honours the `.gitignore` an upload sends with it". Every other bound there (head,
body, rate floor) is on time a request waits, none on the work it makes the endpoint do; the
paths-info handler was fixed once for "100,000 paths a CPU-bound DoS", preupload was not.

The attack: `POST /api/datasets/ns/repo/preupload/main` (a write: any token holder, anyone on
an endpoint without tokens) naming 40,000 files and sending a `gitIgnore` of 1,000 patterns
(`*x1*y*`, ...): 2.2 MB, far under the 64 MiB body limit. `_ignored` tries every pattern on
every path twice, 80 million `fnmatch` calls, with no deadline. 16 such requests from one
address (the per-client bound).

What happened (measured): one request of 200 patterns x 20,000 files takes 16 s of CPU; these
take minutes each, 16 of them hours, and while they run a normal `repo_info` takes 0.5-3 s
instead of milliseconds (the GIL is shared with 16 busy threads); none is answered within 30 s.
The endpoint runs in its own process here, killed at the end, so the work stops with the test.
"""

from __future__ import annotations

import json
import socket
import time

from envs import once
from hub_users import Served, raw

# The endpoint's own code over raw HTTP or in process, no Hub client: the same in both
# environments (huggingface_hub only validates its ids, fixed valid ones here).
pytestmark = once

TOKEN = "writer"
REQUESTS = 16
FILES = 40_000
PATTERNS = 1_000
ANSWERED_WITHIN = 30.0


def test_hostile_preuploads_are_answered_in_bounded_time(tmp_path):
    body = json.dumps({"files": [{"path": f"d{i}/f{i}.txt", "size": 10, "sample": ""}
                                 for i in range(FILES)],
                       "gitIgnore": "\n".join(f"*x{i}*y*" for i in range(PATTERNS))}).encode()
    with Served(tmp_path / "root", "--token", TOKEN) as served:
        assert raw(served.url, "POST", "/api/repos/create", json.dumps(
            {"name": "repo", "organization": "ns", "type": "dataset"}).encode(), TOKEN)[0] == 200
        port = int(served.url.rsplit(":", 1)[1])
        sockets = []
        for _ in range(REQUESTS):
            sock = socket.socket()
            sock.bind(("127.0.6.2", 0))  # one client
            sock.connect(("127.0.0.1", port))
            sock.sendall(f"POST /api/datasets/ns/repo/preupload/main HTTP/1.1\r\nHost: x\r\n"
                         f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            sockets.append(sock)
        started = time.monotonic()
        normal = time.monotonic()
        assert raw(served.url, "GET", "/api/datasets/ns/repo", token=TOKEN)[0] == 200
        normal = time.monotonic() - normal
        answered = 0
        for sock in sockets:
            sock.settimeout(max(0.1, started + ANSWERED_WITHIN - time.monotonic()))
            try:
                answered += sock.recv(16).startswith(b"HTTP/1.1 ")
            except TimeoutError:
                pass
            sock.close()
    assert answered == REQUESTS, (
        f"{answered} of {REQUESTS} preuploads ({len(body):,} bytes each) answered within "
        f"{ANSWERED_WITHIN:g} s; a normal request meanwhile took {normal:.2f} s")
