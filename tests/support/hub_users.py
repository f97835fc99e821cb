"""Helpers of the attack reproductions of the local endpoint as a server for several users
(tests/localhub/attacks/, issue #38): raw HTTP (where the client would refuse to send the request), the real client pointed at
an endpoint, and ``cubepack hub serve`` / ``hub gc`` run as the processes a team runs."""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import subprocess
import sys
from urllib.parse import urlsplit

from huggingface_hub import HfApi
from huggingface_hub import constants as hub_constants


def api_for(url, token, monkeypatch):
    """The real huggingface_hub client (0.36 or 2.x), Xet off, pointed at ``url``."""
    monkeypatch.setattr(hub_constants, "HF_HUB_DISABLE_XET", True)
    import huggingface_hub

    if huggingface_hub.__version__.startswith("0."):  # 0.36 builds and parses URLs with these
        from huggingface_hub import file_download

        monkeypatch.setattr(hub_constants, "ENDPOINT", url)
        monkeypatch.setattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE",
                            url + "/{repo_id}/resolve/{revision}/{filename}")
    return HfApi(endpoint=url, token=token)


def raw(url, method, path, body=b"", token=None, headers=None):
    """(status, parsed JSON or bytes) of one raw request; ``token`` "" sends ``Bearer `` with
    nothing after it."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    sent = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        connection.request(method, path, body=body, headers={**sent, **(headers or {})})
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    if response.getheader("Content-Type", "").startswith(("application/json",
                                                           "application/vnd.git-lfs+json")):
        data = json.loads(data) if data else None
    return response.status, data


def cli_env():
    return dict(os.environ, PYTHONPATH=os.getcwd())


class Served:
    """``cubepack hub serve --json`` as a process: its url, what it said, stopped on exit."""

    def __init__(self, root, *args, preexec_fn=None):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cubepack", "hub", "serve", "--root", str(root), "--port",
             "0", "--json", "--quiet", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=cli_env(), preexec_fn=preexec_fn)
        line = b""  # the JSON object, indented: until its closing brace on a line of its own
        while not line.endswith(b"\n}\n") and select.select([self.process.stdout], [], [],
                                                              60)[0]:
            piece = os.read(self.process.stdout.fileno(), 1)
            if not piece:
                break
            line += piece
        if not line.endswith(b"}\n"):
            self.stop()
            raise AssertionError(f"hub serve did not start: {self.process.stderr.read()!r}")
        try:
            self.info = json.loads(line)
        except ValueError:
            self.stop()
            raise
        if "url" not in self.info:  # --json's error object: it refused to start
            self.stop()
            raise AssertionError(f"hub serve did not start: {self.info}")
        self.url = self.info["url"]

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)
        return self.process.stderr.read().decode(errors="replace")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def run_gc(root):
    done = subprocess.run([sys.executable, "-m", "cubepack", "hub", "gc", str(root), "--json"],
                          capture_output=True, text=True, env=cli_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def heads_only(url, first_address, head):
    """Two connections from two addresses (``first_address`` and the next), each sending the
    request ``head`` (bytes) and not one byte of its body; the caller closes them."""
    port = int(url.rsplit(":", 1)[1])
    prefix, last = first_address.rsplit(".", 1)
    held = []
    for index in range(2):
        sock = socket.socket()
        sock.bind((f"{prefix}.{int(last) + index}", 0))
        sock.connect(("127.0.0.1", port))
        sock.sendall(head)
        held.append(sock)
    return held


def _tcp_queues(local, remote):
    """(send queue, receive queue) in bytes of the IPv4 TCP socket from ``local`` to ``remote``
    (each (address, port)) as /proc/net/tcp lists it, or None when it lists none."""
    def hexed(address):
        host, port = address
        return "%08X:%04X" % (int.from_bytes(socket.inet_aton(host), "little"), port)

    wanted = (hexed(local), hexed(remote))
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if (fields[1], fields[2]) == wanted:
                sent, received = fields[4].split(":")
                return int(sent, 16), int(received, 16)
    return None


def read_by_the_endpoint(sock, timeout=30.0):
    """Wait until the endpoint has read every byte ``sock`` sent it: nothing left in this side's
    send queue nor in the endpoint's receive queue (/proc/net/tcp). The event an attack waits
    for before the honest request it would deny, instead of a guess at how long the endpoint
    takes to read it."""
    import time

    client, endpoint = sock.getsockname(), sock.getpeername()
    deadline = time.monotonic() + timeout
    while True:
        mine, theirs = _tcp_queues(client, endpoint), _tcp_queues(endpoint, client)
        if mine is not None and theirs is not None and mine[0] == 0 and theirs[1] == 0:
            return
        assert time.monotonic() < deadline, (
            f"the endpoint did not read what {client} sent within {timeout} s: {mine}, {theirs}")
        time.sleep(0.01)


def honest_commit(api, repo_id="ns/repo"):
    """(outcome, seconds) of a commit of 48 regular files of 59 KB each (under the 64 KiB LFS
    threshold: 2.8 MB of body): "200", or the HTTP status (the error's type) it met."""
    import time

    from huggingface_hub import CommitOperationAdd

    line = b"an honest line of a cube's notes\n"
    notes = [CommitOperationAdd(f"notes/{index:02d}.txt", line * 1800 + bytes([index]))
             for index in range(48)]
    started = time.monotonic()
    try:
        api.create_commit(repo_id, repo_type="dataset", commit_message="honest",
                          operations=notes)
        outcome = "200"
    except Exception as error:  # noqa: BLE001 - the client's typed HTTP error
        response = getattr(error, "response", None)
        outcome = str(getattr(response, "status_code", type(error).__name__))
    return outcome, time.monotonic() - started
