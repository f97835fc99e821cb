"""Adversary (issue #38, round 2): two clients that send a commit's headers and not one byte of
its body hold the whole bodies' budget, and every other client's commit over 1 MiB answers 503.

The promise: docs/reference/local-hub.md, Limits: "Bodies read into memory share one budget
[...] all requests hold at most 128 MiB at once, and one client (an address) at most 64 MiB of
it. A request holds its share from its body's first byte until its answer is sent"; "a body
read into memory [...] within 10 s plus its length at 1 MiB/s"; Several users: "A fair share
of the endpoint". The code comment (MAX_BODIES_BYTES): "one client (an address) holds at most
MAX_BODY_BYTES of it, so a second client's large commit is read beside the first's".

The attack: from two loopback addresses (127.0.5.2, 127.0.5.3), one connection each sends the
head of a commit announcing 64 MiB (Content-Length, the largest allowed) and then nothing. The
share is taken when the head is read, before any byte of the body (not "from its body's first
byte"), and kept until the body's deadline: 10 s + 64 MiB at 1 MiB/s = 74 s, for 0 bytes sent;
the attacker reconnects then. Two addresses x 63 MiB leave 2 MiB of the 128 MiB.

What happened (0.36 and 2.x): an honest client (the real huggingface_hub, from 127.0.0.1)
commits 2.8 MB of text in 48 files of 59 KB (regular files, each under the endpoint's 64 KiB
LFS threshold: in the commit's body, base64): it waits 10 s and is refused 503 (Retry-After:
5), and would be at every retry while the attack lasts. A client that has sent nothing
holds memory it may never use; the test asks that the honest commit be answered 200.
"""

from __future__ import annotations

import json

from hub_users import Served, api_for, heads_only, honest_commit, raw, read_by_the_endpoint

TOKEN = "writer"
ANNOUNCED = 64 << 20


def test_headers_alone_never_take_the_bodies_budget_from_an_honest_commit(tmp_path, monkeypatch):
    with Served(tmp_path / "root", "--token", TOKEN) as served:
        assert raw(served.url, "POST", "/api/repos/create", json.dumps(
            {"name": "repo", "organization": "ns", "type": "dataset"}).encode(), TOKEN)[0] == 200
        head = (f"POST /api/datasets/ns/repo/commit/main HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {TOKEN}\r\nContent-Type: "
                f"application/x-ndjson\r\nContent-Length: {ANNOUNCED}\r\n\r\n"
                ).encode()  # and not one byte of the body
        hostile = heads_only(served.url, "127.0.5.2", head)
        try:
            for sock in hostile:  # the endpoint has read both heads
                read_by_the_endpoint(sock)
            outcome, took = honest_commit(api_for(served.url, TOKEN, monkeypatch))
        finally:
            for sock in hostile:
                sock.close()
    assert outcome == "200", (
        f"two addresses that sent 0 bytes of their bodies held the bodies' budget: an honest "
        f"2.8 MB commit of 48 small files answered {outcome} after {took:.1f} s")
