"""Adversary (issue #38, round 2): on an endpoint with tokens, a client WITHOUT a token holds
the bodies' budget through a public repo's paths-info (a read route whose JSON body is read into
memory), and every token holder's commit over 1 MiB answers 503.

The promise: docs/reference/local-hub.md, Access: "`--token` (repeatable) makes every write
and every read of a private repo carry one of the tokens [...] A write is authorized before its
body is read"; Limits: "Bodies read into memory share one budget [...] all requests hold at most
128 MiB at once, and one client (an address) at most 64 MiB of it"; Several users: "Tokens mean
something", "A fair share of the endpoint". The budget was added so that "never-finished
commits hold bounded memory"; commits need a token, but reads of public repos do not.

The attack: the endpoint runs with `--token writer` and holds one public repo. From two loopback
addresses, with no Authorization header, one connection each sends the head of
`POST /api/datasets/ns/repo/paths-info/main` announcing a 64 MiB body (the route reads any
body up to the commit limit, 64 MiB) and then nothing. Each takes 63 MiB of the 128 MiB budget
at once and keeps it until its body's deadline (74 s), for 0 bytes sent.

What happened (0.36 and 2.x): a token holder (the real huggingface_hub, 127.0.0.1) commits 48
regular files of 59 KB (2.8 MB, in the commit's body): it waits 10 s and answers 503. Anyone who
reaches the port, with no token, denies the team every commit of more than 1 MiB of small files.
The test asks that the token holder's commit be answered 200.
"""

from __future__ import annotations

import json

from hub_users import Served, api_for, heads_only, honest_commit, raw, read_by_the_endpoint

TOKEN = "writer"
ANNOUNCED = 64 << 20


def test_a_client_without_a_token_never_takes_the_commits_body_budget(tmp_path, monkeypatch):
    with Served(tmp_path / "root", "--token", TOKEN) as served:
        assert raw(served.url, "POST", "/api/repos/create", json.dumps(
            {"name": "repo", "organization": "ns", "type": "dataset"}).encode(), TOKEN)[0] == 200
        head = (f"POST /api/datasets/ns/repo/paths-info/main HTTP/1.1\r\n"
                f"Host: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {ANNOUNCED}\r\n\r\n").encode()  # no token, no body byte
        hostile = heads_only(served.url, "127.0.7.2", head)
        try:
            for sock in hostile:  # the endpoint has read both heads
                read_by_the_endpoint(sock)
            outcome, took = honest_commit(api_for(served.url, TOKEN, monkeypatch))
        finally:
            for sock in hostile:
                sock.close()
    assert outcome == "200", (
        f"two addresses without a token, reading a public repo's paths-info, held the "
        f"bodies' budget: a token holder's 2.8 MB commit of 48 small files answered {outcome} "
        f"after {took:.1f} s")
