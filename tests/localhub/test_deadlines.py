"""The endpoint's deadlines and body caps, against raw sockets: a client that trickles its
request cannot hold a thread past its deadline, so MAX_CONNECTIONS tricklers cannot lock out
the real client; no body is read past its cap, nor before a write is authorized."""

from __future__ import annotations

import http.client
import socket
import threading

import pytest
from huggingface_hub import HfApi

from cubepack.localhub._server import MAX_CONNECTIONS
from cubepack.localhub._store import repo_ref
from cubepack.testing.hub import InstrumentedHub

TOKEN = "writer"
#: A safety net so a broken endpoint fails a test instead of hanging it (never asserted on).
HANG = 60


@pytest.fixture
def log():
    return []


@pytest.fixture
def hub(tmp_path, log):
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN], log=log.append, head_timeout=1.0,
                         idle_timeout=0.5, body_timeout=1.0, min_body_rate=1_000_000,
                         max_body_bytes=1000) as server:
        server.store.create(repo_ref("datasets", "ns", "repo"), False)  # no client connection
        yield server


def connect(hub, address: str = "127.0.0.1") -> socket.socket:
    """A connection from ``address`` (every 127/8 address is loopback: a client of its own)."""
    host, port = hub.url.rsplit("/", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)), source_address=(address, 0))
    sock.settimeout(HANG)
    return sock


def status_of(sock) -> int:
    """The status of the answer on ``sock``, or 0 when it closed without one."""
    data = b""
    try:
        while b"\r\n" not in data:
            piece = sock.recv(4096)
            if not piece:
                return 0
            data += piece
    except ConnectionResetError:
        return 0
    return int(data.split(b" ", 2)[1])


def wait_closed(sock) -> None:
    """Read until the endpoint closes ``sock`` (a reset counts: we may still be sending)."""
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass


class Trickle:
    """Send ``data`` to each socket one byte at a time, every ``interval`` seconds, as a
    slowloris client does; a socket the endpoint closed is left alone."""

    def __init__(self, sockets, data: bytes, interval: float = 0.2):
        self.sockets, self.data, self.interval = list(sockets), data, interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        alive = set(range(len(self.sockets)))
        for byte in self.data:
            for index in sorted(alive):
                try:
                    self.sockets[index].send(bytes([byte]))
                except OSError:
                    alive.discard(index)
            if not alive or self.stop.wait(self.interval):
                return

    def __enter__(self) -> Trickle:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        for sock in self.sockets:
            sock.close()


def test_trickling_connections_cannot_lock_out_a_real_client(tmp_path, log):
    """As many clients as there are threads (64 here), each from its own address, each
    trickling a request: every thread is held, and the real client is let in as their deadlines
    drop them."""
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN], log=log.append, head_timeout=3.0,
                         max_connections=64) as hub:
        hub.store.create(repo_ref("datasets", "ns", "repo"), False)
        sockets = [connect(hub, f"127.0.1.{2 + index}") for index in range(64)]
        head = b"GET /api/whoami-v2 HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000
        with Trickle(sockets, head):
            assert hub.wait_for_connections(64)  # every thread is held by a trickler
            api = HfApi(endpoint=hub.url, token=TOKEN)
            assert api.repo_info("ns/repo", repo_type="dataset").id == "ns/repo"
    dropped = [line for line in log if "dropped: request head not received within 3 s" in line]
    assert dropped  # at least one trickler was dropped to let the client in


def test_a_trickled_body_is_dropped_unanswered(hub, log):
    sock = connect(hub)
    sock.sendall(f"POST /api/validate-yaml HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 f"{TOKEN}\r\nContent-Length: 1000\r\n\r\n".encode())
    with Trickle([sock], b"x" * 1000):
        assert status_of(sock) == 0
    assert any('"POST /api/validate-yaml HTTP/1.1" dropped: request body not received within '
               '1.001 s' in line for line in log)


def test_an_idle_keep_alive_connection_is_closed_silently(hub, log):
    host, port = hub.url.rsplit("/", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=HANG)
    conn.request("GET", "/api/whoami-v2", headers={"Authorization": f"Bearer {TOKEN}"})
    answer = conn.getresponse()
    assert answer.status == 200 and answer.getheader("Connection") != "close"
    answer.read()
    assert conn.sock.recv(1) == b""  # the endpoint closed it after idle_timeout
    assert not [line for line in log if "dropped" in line]


def test_a_keep_alive_request_has_the_head_deadline_from_its_first_byte(tmp_path, log):
    hub = InstrumentedHub(tmp_path / "root", tokens=[TOKEN], log=log.append, head_timeout=1.0,
                          idle_timeout=30.0).start()  # the idle wait ends with the first byte
    sock = connect(hub)
    sock.sendall(f"GET /api/whoami-v2 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}"
                 "\r\n\r\n".encode())
    assert status_of(sock) == 200  # the first request's answer (its body is small)
    with Trickle([sock], b"GET /api/whoami-v2 HTTP/1.1\r\nX-Slow: " + b"a" * 10_000):
        wait_closed(sock)  # the rest of the first answer, then the close
    hub.stop()
    assert any("dropped: request head not received within 1 s" in line for line in log)


def test_a_declared_length_above_the_cap_is_refused_before_it_is_read(hub):
    sock = connect(hub)
    sock.sendall(f"POST /api/validate-yaml HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}"
                 "\r\nContent-Length: 1001\r\n\r\n".encode())  # the body is never sent
    assert status_of(sock) == 413


@pytest.mark.parametrize("route", ["/api/validate-yaml", "/api/datasets/ns/repo/paths-info/main"])
def test_a_chunk_larger_than_the_cap_is_refused_before_it_is_read(hub, route):
    sock = connect(hub)
    sock.sendall(f"POST {route} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n10000000\r\n".encode())  # 256 MiB, unsent
    assert status_of(sock) == 413


def test_chunks_summing_past_the_cap_are_refused_before_the_excess_is_read(hub):
    sock = connect(hub)
    sock.sendall(f"POST /api/validate-yaml HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}"
                 "\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
                 + b"258\r\n" + b"x" * 600 + b"\r\n258\r\n")  # 600 + 600 > 1000: not sent
    assert status_of(sock) == 413


@pytest.mark.parametrize("size_line", [b"zz", b"-5", b"0x10", b"1" * 2000])
def test_a_malformed_chunk_size_is_refused(hub, size_line):
    sock = connect(hub)
    sock.sendall(f"POST /api/validate-yaml HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}"
                 "\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + size_line + b"\r\n")
    assert status_of(sock) == 400


def test_an_upload_larger_than_its_signed_size_is_refused_before_it_is_read(hub):
    oid = "a" * 64
    sock = connect(hub)
    signature = hub.sign(repo_ref("datasets", "ns", "repo"), oid, 10)
    sock.sendall(f"PUT /lfs/upload/datasets/ns/repo/{oid}?size=10&sig={signature} HTTP/1.1\r\n"
                 "Host: x\r\n"
                 "Content-Length: 100000000\r\n\r\n".encode())
    assert status_of(sock) == 413


@pytest.mark.parametrize("request_line", [
    "POST /api/repos/move", "DELETE /api/repos/delete", "POST /api/repos/create",
    "POST /api/validate-yaml", "POST /api/datasets/ns/repo/commit/main",
    "POST /datasets/ns/repo.git/info/lfs/objects/batch"])
@pytest.mark.parametrize("framing", ["Content-Length: 100000000", "Transfer-Encoding: chunked"])
def test_a_write_is_authorized_before_its_body_is_read(hub, request_line, framing):
    sock = connect(hub)
    sock.sendall(f"{request_line} HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n".encode())  # no body
    assert status_of(sock) == 401


def test_the_deadlines_and_caps_the_readme_states():
    from cubepack.localhub import _server

    assert (_server.HEAD_TIMEOUT, _server.IDLE_TIMEOUT, _server.BODY_TIMEOUT) == (10, 8, 10)
    assert _server.MIN_BODY_RATE == 1024 * 1024 and MAX_CONNECTIONS == 256
    assert _server.MAX_CLIENT_CONNECTIONS == 16 and _server.MAX_BODY_BYTES == 64 * 1024 * 1024
    assert (_server.LOW_SPEED_LIMIT, _server.LOW_SPEED_TIME) == (1024, 30)
    assert _server.MAX_UPLOAD_BYTES == 50 * 1024**3


def test_a_client_s_transfers_are_judged_together_by_the_floor():
    """Two transfers of one client each under the floor but together above it are kept; once
    their window stalls, both are dropped, and a transfer that starts then is judged by a new
    window; another client's transfer is judged alone."""
    import time

    import pytest

    from cubepack.localhub._server import RequestDeadline, _Floor

    floor = _Floor(1000, 0.2)  # 200 bytes per 0.2 s window
    first, second = floor.window(("a", "upload")), floor.window(("a", "upload"))
    other = floor.window(("b", "upload"))
    first.moved(120, "upload")
    second.moved(100, "upload")  # 220 together: a new window opens
    time.sleep(0.1)
    first.moved(0, "upload")  # within the new window: no judgement yet
    time.sleep(0.15)
    with pytest.raises(RequestDeadline):
        first.moved(0, "upload")
    with pytest.raises(RequestDeadline):  # the same stalled window
        second.moved(199, "upload")
    late = floor.window(("a", "upload"))
    late.moved(10, "upload")  # a new window, not the stalled one
    with pytest.raises(RequestDeadline):  # alone, it moved nothing in 0.25 s
        other.moved(0, "upload")
    for window in (first, second, late, other):
        window.close()
    assert not floor._groups
