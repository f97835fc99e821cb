"""Bounded resources under hostile clients (issue #38): an upload is held to a rate floor
whatever size it announced, an announced size above the maximum is refused before a byte is
read, a client is served a bounded number of connections at once, and an abandoned upload is
one log line.

Hostile clients are raw loopback sockets, each from its own address (127.0.0.2, 127.0.0.3...:
every 127/8 address is loopback), so the endpoint sees them as the different clients they
would be; the normal client is the real huggingface_hub client from 127.0.0.1. Nothing here
waits a fixed time for something to happen: a test waits for a condition (connections held, a
log line), with a generous deadline that only ends a broken run.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest
from huggingface_hub import CommitOperationAdd, HfApi
from huggingface_hub import constants as hub_constants

from cubepack.localhub._store import AddFile, AddLfsFile, repo_ref
from cubepack.testing.hub import InstrumentedHub

TOKEN = "writer"
REPO = repo_ref("datasets", "ns", "repo")
#: Answered before this, or the endpoint let hostile clients lock a normal one out. Generous: a
#: normal request takes milliseconds; the hostile connections below hold their threads far
#: longer than this without the fixes (a never-read download 60 s, a never-finished commit 70 s,
#: a trickled upload 17 minutes).
ANSWERED_WITHIN = 45.0
#: A safety net so a broken endpoint fails a test instead of hanging it (never asserted on).
HANG = 120
BIG = 24 * 1024 * 1024  # a download larger than what the socket buffers of a reader hold


def within(seconds, action):
    """Run ``action``; fail if it has not returned within ``seconds``."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = action()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"not answered within {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def wait_until(condition, what, timeout=HANG):
    """Poll ``condition`` until it holds (a condition, never a fixed wait)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def api_for(hub, monkeypatch, token=TOKEN):
    monkeypatch.setattr(hub_constants, "HF_HUB_DISABLE_XET", True)
    import huggingface_hub

    if huggingface_hub.__version__.startswith("0."):  # 0.36 builds and parses URLs with these
        monkeypatch.setattr(hub_constants, "ENDPOINT", hub.url)
        from huggingface_hub import file_download

        monkeypatch.setattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE",
                            hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    return HfApi(endpoint=hub.url, token=token)


def seed(hub):
    """The repo every test reads: a small file, and a download larger than socket buffers."""
    hub.store.create(REPO, private=False)
    big = b"\x01" * BIG
    oid = hashlib.sha256(big).hexdigest()
    hub.store.put_blob(REPO, oid, BIG, [big])
    hub.store.apply_commit(REPO, "main", title="seed", message="", parent=None,
                           operations=[AddFile("small.txt", b"small"),
                                       AddLfsFile("big.bin", oid, BIG)])


def connect(hub, address="127.0.0.1", receive_buffer=None) -> socket.socket:
    host, port = urlsplit(hub.url).hostname, urlsplit(hub.url).port
    sock = socket.socket()
    if receive_buffer:  # a reader that takes little: the answer fills the buffers at once
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.bind((address, 0))
    sock.connect((host, port))
    sock.settimeout(HANG)
    return sock


def hostile_address(index: int) -> str:
    return f"127.0.{1 + index // 200}.{2 + index % 200}"


def slow_upload(hub, index, announced=1 << 30):
    """An upload announcing ``announced`` bytes that sends its headers and one byte."""
    oid = hashlib.sha256(str(index).encode()).hexdigest()
    sock = connect(hub, hostile_address(index))
    sock.sendall(f"PUT /lfs/upload/datasets/ns/repo/{oid}?size={announced}&sig="
                 f"{hub.sign(REPO, oid, announced)} HTTP/1.1\r\nHost: x\r\nContent-Length: "
                 f"{announced}\r\n\r\nx".encode())
    return sock


def slow_download(hub, index):
    """A download of BIG bytes whose reader never reads."""
    sock = connect(hub, hostile_address(index), receive_buffer=4096)
    sock.sendall(b"GET /datasets/ns/repo/resolve/main/big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock


def unfinished_commit(hub, index):
    """A commit announcing a 60 MiB body that sends its first line and stops."""
    sock = connect(hub, hostile_address(index))
    sock.sendall(f"POST /api/datasets/ns/repo/commit/main HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: Bearer {TOKEN}\r\nContent-Length: {60 << 20}\r\n\r\n"
                 '{"key": "header", "value": {"summary": "never"}}\n'.encode())
    return sock


HOSTILE = (slow_upload, slow_download, unfinished_commit)


@pytest.fixture
def log():
    return []


@pytest.fixture
def hub(tmp_path, log):
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN], log=log.append) as server:
        seed(server)
        yield server


def test_64_hostile_clients_do_not_lock_out_a_normal_request(hub, monkeypatch, tmp_path):
    """The issue's scene: 64 clients hold connections (slow uploads, never-read downloads,
    never-finished commits); the real client's requests are answered while they do."""
    sockets = [HOSTILE[index % 3](hub, index) for index in range(64)]
    try:
        assert hub.wait_for_connections(64, timeout=HANG)  # each holds a thread
        api = api_for(hub, monkeypatch)
        info = within(ANSWERED_WITHIN, lambda: api.repo_info("ns/repo", repo_type="dataset"))
        assert info.sha is not None
        path = within(ANSWERED_WITHIN, lambda: api.hf_hub_download(
            "ns/repo", "small.txt", repo_type="dataset", cache_dir=str(tmp_path / "cache")))
        assert open(path, "rb").read() == b"small"
        within(ANSWERED_WITHIN, lambda: api.create_commit(
            "ns/repo", [CommitOperationAdd("normal.bin", b"\0" * 100_000)],
            commit_message="a normal push", repo_type="dataset"))
    finally:
        for sock in sockets:
            sock.close()


def test_an_upload_is_held_to_the_rate_floor_whatever_it_announced(tmp_path):
    """An upload announcing a GiB that sends a few bytes a second is dropped once a window of
    ``low_speed_time`` moves less than ``low_speed_limit`` bytes/s, not at its announced size
    over a rate (which made 1 TiB at 1 byte/s a thread held for 12 days)."""
    lines = []
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN], log=lines.append,
                         low_speed_limit=1000, low_speed_time=1.0) as hub:
        seed(hub)
        sock = slow_upload(hub, 0)
        sock.recv(1)  # the endpoint closes it: b"" (or a reset), never an answer
        sock.close()
        wait_until(lambda: any("dropped" in line for line in lines), "the drop's log line")
    drop = [line for line in lines if "dropped" in line]
    assert len(drop) == 1 and re.search(r"upload moved \d+ bytes? in 1 s \(under 1000 "
                                        r"bytes/s\)", drop[0]), drop


def test_an_honest_upload_above_the_floor_completes(tmp_path):
    """The floor judges each window, not the whole: an upload sending well above it for several
    windows is taken whole."""
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN], low_speed_limit=1000,
                         low_speed_time=3.0) as hub:
        seed(hub)
        data = b"honest " * 40_000  # 280 kB at ~100 kB/s: about three windows
        oid = hashlib.sha256(data).hexdigest()
        sock = connect(hub)
        sock.sendall(f"PUT /lfs/upload/datasets/ns/repo/{oid}?size={len(data)}&sig="
                     f"{hub.sign(REPO, oid, len(data))} HTTP/1.1\r\nHost: x\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode())
        for start in range(0, len(data), 5_000):
            sock.sendall(data[start:start + 5_000])
            time.sleep(0.05)  # the pace of a slow link, not a synchronisation
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        assert hub.store.holds(REPO, oid, len(data))


def test_a_never_read_download_is_held_to_the_floor(tmp_path):
    lines = []
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN], log=lines.append,
                         low_speed_limit=1000, low_speed_time=1.0) as hub:
        seed(hub)
        sock = slow_download(hub, 0)
        wait_until(lambda: any("dropped" in line for line in lines), "the drop's log line")
        sock.close()
    drop = [line for line in lines if "dropped" in line]
    assert len(drop) == 1 and "answer" in drop[0] and "under 1000 bytes/s" in drop[0], drop


def test_an_announced_size_above_the_maximum_is_refused_up_front(tmp_path, monkeypatch):
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN], max_upload_bytes=100_000) as hub:
        seed(hub)
        body = json.dumps({"operation": "upload", "objects": [
            {"oid": "a" * 64, "size": 1 << 40}, {"oid": "b" * 64, "size": 100_000}]}).encode()
        connection = http.client.HTTPConnection(urlsplit(hub.url).hostname,
                                                urlsplit(hub.url).port, timeout=HANG)
        connection.request("POST", "/datasets/ns/repo.git/info/lfs/objects/batch", body,
                           {"Authorization": f"Bearer {TOKEN}"})
        objects = json.loads(connection.getresponse().read())["objects"]
        assert objects[0]["error"]["code"] == 422 and "100000" in objects[0]["error"]["message"]
        assert "actions" not in objects[0] and "actions" in objects[1]
        sock = slow_upload(hub, 0, announced=1 << 40)  # a URL signed before a lower maximum
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")
        api = api_for(hub, monkeypatch)
        with pytest.raises(ValueError, match="at most 100000 bytes"):
            api.create_commit("ns/repo", [CommitOperationAdd("w.bin", b"\0" * 200_000)],
                              commit_message="too big", repo_type="dataset")


def test_an_abandoned_upload_is_one_log_line(hub, log, capfd):
    """A client that goes away mid-upload: one log line each, no traceback (64 of them once
    printed 128)."""
    for index in range(8):
        sock = slow_upload(hub, index)
        sock.sendall(b"x" * 10_000)
        sock.close()
    wait_until(lambda: sum("dropped" in line for line in log) == 8, "8 drops logged")
    wait_until(lambda: hub.open_connections == 0, "the threads released")
    assert "Traceback" not in capfd.readouterr().err
    for index in range(8):
        oid = hashlib.sha256(str(index).encode()).hexdigest()
        assert sum(oid in line for line in log) == 1, [line for line in log if oid in line]


def test_a_client_is_served_a_bounded_number_of_connections(tmp_path, monkeypatch):
    """40 connections from one address: 16 are served, the rest wait their turn without a
    thread (served as others end, not refused), and another client is served at once."""
    from cubepack.localhub._server import MAX_CLIENT_CONNECTIONS

    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN], head_timeout=HANG) as hub:
        seed(hub)
        sockets = [connect(hub, "127.0.0.9") for _ in range(40)]
        try:
            wait_until(lambda: hub.waiting_connections() == 40 - MAX_CLIENT_CONNECTIONS,
                       "the excess connections waiting")
            assert hub.open_connections == MAX_CLIENT_CONNECTIONS
            api = api_for(hub, monkeypatch)
            within(ANSWERED_WITHIN, lambda: api.repo_info("ns/repo", repo_type="dataset"))
            for sock in sockets[:10]:  # ten end: ten waiting ones are served
                sock.close()
            wait_until(lambda: hub.waiting_connections() == 40 - MAX_CLIENT_CONNECTIONS - 10,
                       "ten waiting connections served")
            last = sockets[-1]  # the last to arrive is served in its turn, and answered
            last.sendall(b"GET /api/datasets/ns/repo HTTP/1.1\r\nHost: x\r\n\r\n")
            for sock in sockets[10:-1]:
                sock.close()
            assert last.recv(4096).startswith(b"HTTP/1.1 200")
        finally:
            for sock in sockets:
                sock.close()


def test_idle_keep_alive_connections_yield_to_a_waiting_one(tmp_path):
    """A client's idle keep-alive connections hold its threads; when another of its
    connections waits, they close (each answer says so meanwhile), long before the idle
    timeout (two minutes here)."""
    from cubepack.localhub._server import MAX_CLIENT_CONNECTIONS

    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN], idle_timeout=HANG) as hub:
        seed(hub)
        address = urlsplit(hub.url)
        idle = []
        for _ in range(MAX_CLIENT_CONNECTIONS):
            connection = http.client.HTTPConnection(address.hostname, address.port,
                                                    timeout=HANG, source_address=("127.0.0.9", 0))
            connection.request("GET", "/api/datasets/ns/repo")
            answer = connection.getresponse()
            assert answer.status == 200 and answer.getheader("Connection") != "close"
            answer.read()
            idle.append(connection)  # kept open, idle: it holds a thread
        late = connect(hub, "127.0.0.9")
        late.sendall(b"GET /api/datasets/ns/repo HTTP/1.1\r\nHost: x\r\n\r\n")
        answered = within(ANSWERED_WITHIN, lambda: late.recv(4096))
        assert answered.startswith(b"HTTP/1.1 200")
        for connection in idle:
            connection.close()
        late.close()


def test_bodies_in_memory_share_one_budget(tmp_path, monkeypatch):
    """Beyond the first 1 MiB of each body, bodies read into memory hold at most
    ``max_bodies_bytes`` in all and one client at most ``max_body_bytes``, held a piece at a
    time as the bytes arrive: a body that does not fit waits (here 0.5 s) for a share, then
    answers 503 with Retry-After, its rest unread; a small body
    never waits; once the holder goes, a large body is read again."""
    from cubepack.localhub import _server

    monkeypatch.setattr(_server, "BODY_BUDGET_WAIT", 0.5)
    mib = 1 << 20
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN], max_body_bytes=4 * mib,
                         max_bodies_bytes=4 * mib) as hub:
        seed(hub)
        path = f"/api/{REPO.kind}/{REPO.namespace}/{REPO.name}/commit/main"

        def start(address, length, sent):
            sock = connect(hub, address)
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                         f"Content-Type: application/x-ndjson\r\nContent-Length: {length}\r\n"
                         f"\r\n".encode() + b" " * sent)
            return sock

        def raw(hub, method, path, body, headers):
            connection = http.client.HTTPConnection(urlsplit(hub.url).hostname,
                                                    urlsplit(hub.url).port, timeout=HANG)
            try:
                connection.request(method, path, body=body, headers={
                    "Authorization": f"Bearer {TOKEN}", **headers})
                response = connection.getresponse()
                return response.status, response.read()
            finally:
                connection.close()

        holder = start("127.0.5.2", 4 * mib, 3 * mib)  # holds 3 MiB of the 4
        wait_until(lambda: hub.bodies.held() == 3 * mib, "the first body's share")
        # Shares are held as bytes arrive (a head alone holds nothing): after 2 MiB sent, its
        # third needs a second MiB of the budget, where one is left: waits, then 503.
        refused = start("127.0.5.3", 3 * mib, 2 * mib)
        answer = within(HANG, lambda: refused.recv(4096))
        assert answer.startswith(b"HTTP/1.1 503") and b"Retry-After: 5" in answer, answer
        refused.close()
        small = b'{"key": "header", "value": {"summary": "s"}}\n'
        status = raw(hub, "POST", path, small, {"Content-Type": "application/x-ndjson"})[0]
        assert status == 200  # within the free 1 MiB: never waits
        holder.close()
        wait_until(lambda: hub.bodies.held() == 0, "the share given back")
        body = small + b" " * (3 * mib)
        assert raw(hub, "POST", path, body, {"Content-Type": "application/x-ndjson"})[0] == 200


def test_two_bodies_of_one_client_never_wait_each_other_out():
    """Two bodies of one client, each holding part of its share and waiting for the rest: the
    younger gives up at once (503) and the older is read when the younger's share comes back;
    a body waiting for another client's share still waits."""
    import threading
    import time

    from cubepack.localhub._server import _BodyBudget

    budget = _BodyBudget(total=100, per_client=64)
    assert budget.reserve("a", 40, 1.0, since=1.0)  # the older body
    assert budget.reserve("a", 20, 1.0, since=2.0)  # the younger
    outcome: list[bool] = []
    older = threading.Thread(target=lambda: outcome.append(budget.reserve("a", 20, 5.0, 1.0)))
    older.start()
    deadline = time.monotonic() + 30
    while True:  # the older waits for its client's share: it is listed as a waiter
        with budget._guard:
            if budget._waiting.get("a"):
                break
        assert time.monotonic() < deadline, "the older body never waited"
        time.sleep(0.001)
    started = time.monotonic()
    assert not budget.reserve("a", 10, 5.0, since=2.0)  # the younger gives up, at once
    assert time.monotonic() - started < 1.0
    budget.release("a", 20)  # its answer (503) is sent: its share comes back
    older.join(5)
    assert outcome == [True] and budget.held() == 60
    assert budget.reserve("b", 30, 1.0, since=3.0)  # another client: the total's 100
    started = time.monotonic()
    assert not budget.reserve("b", 20, 0.3, since=3.0)  # waits its time, then gives up
    assert time.monotonic() - started >= 0.3
