"""Adversary (issue #38, item 1): a second `cubepack hub serve` on a root already served starts
without a word and deletes the first one's uploads in progress.

The promise (docs/reference/local-hub.md): "One server process serves a root", "Uploads a
killed server left half-written are removed at start", and the several-users section: "Both
are safe while the server runs". The store's own docstring: "One process serves a root: the
per-repo locks are threads' locks", and each server keeps its holdings in memory. Principle 1
(docs): refuse, loudly and precisely.

The attack (or a slip: a teammate starts the endpoint for their own port on the shared folder,
or a restart overlaps the old process): while a push uploads to the running endpoint, a second
`hub serve --root` on the same folder starts.

What happened: the second server starts (nothing holds the root), takes every `.*.tmp` under
`blobs/` for a killed server's leftovers and deletes them: the first server's upload in
progress loses its temp file, and its last byte is answered 500 (FileNotFoundError) after the
client sent everything. (Two servers also keep two stale views of which repo holds which blob,
so a delete on one removes a blob the other just committed.)
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from urllib.parse import urlsplit

from envs import once
from hub_users import Served, raw

# The endpoint's own code over raw HTTP or in process, no Hub client: the same in both
# environments (huggingface_hub only validates its ids, fixed valid ones here).
pytestmark = once

TOKEN = "writer"
DATA = b"a push in progress " * 10000


def test_a_second_server_on_a_served_root_is_refused_or_harmless(tmp_path):
    root = tmp_path / "root"
    oid = hashlib.sha256(DATA).hexdigest()
    with Served(root, "--token", TOKEN) as first:
        assert raw(first.url, "POST", "/api/repos/create", json.dumps(
            {"name": "cube", "organization": "team", "type": "dataset"}).encode(), TOKEN)[0] == 200
        batch = raw(first.url, "POST", "/datasets/team/cube.git/info/lfs/objects/batch",
                    json.dumps({"operation": "upload", "objects": [
                        {"oid": oid, "size": len(DATA)}]}).encode(), TOKEN)[1]
        href = urlsplit(batch["objects"][0]["actions"]["upload"]["href"])
        upload = socket.create_connection((href.hostname, href.port), timeout=60)
        upload.sendall(f"PUT {href.path}?{href.query} HTTP/1.1\r\nHost: x\r\n"
                       f"Content-Length: {len(DATA)}\r\n\r\n".encode() + DATA[:-1])
        deadline = time.monotonic() + 30  # the first server has the bytes in its temp file
        while not list((root / "blobs").glob(f".{oid}.*.tmp")):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        try:
            second = Served(root, "--port", "0")
        except AssertionError:
            second = None  # refused to start on a served root: the fix
        if second is not None:
            second.stop()
        upload.sendall(DATA[-1:])
        answer = upload.recv(4096).decode(errors="replace")
        upload.close()
        assert answer.startswith("HTTP/1.1 200"), \
            f"a second server started on the root{'' if second else ' (refused)'}; the " \
            f"first one's upload then answered: {answer.splitlines()[0] if answer else answer!r}"
