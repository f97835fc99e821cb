"""The local Hub endpoint with the knobs tests and benchmarks need.

:class:`InstrumentedHub` is a :class:`~cubepack.localhub.LocalHub` whose hooks inject faults
(500, dropped connection, truncated body, a body with one byte flipped, delay, a request held
until released, a download trickled a byte at a time, transfers sharing one slow link), cap
download bandwidth like a real link, count requests, uploaded
bytes, commits and open connections, and let a test wait for a request or connections.
``python -m cubepack.testing.hub --root DIR --port P [--max-rate-mb R]`` serves one in its own
process (the pull benchmark does).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..hub._client import HubClient
from ..localhub import LocalHub


@dataclass
class Fault:
    """Make the next ``times`` requests matching ``method`` and ``path`` (regex) misbehave.

    kind: an HTTP status (``"500"``, ``"412"``: answered with it), ``"drop"`` (close without answering), ``"truncate"`` (send
    half the body of a download, then close), ``"corrupt"`` (send a download's body whole, of
its true size, but with its middle byte flipped, as a faulty cache or link would), ``"delay"`` (wait ``seconds`` first), ``"hold"``
    (wait until the test calls :meth:`release`), ``"trickle"`` (send a download's headers,
    then ``step`` bytes of its body (one by default) every ``seconds``, as a hostile or very
    slow endpoint would, until the client goes away: :attr:`abandoned` is then set; on a request
    with a body (an upload, a commit), read ``step`` bytes of it every ``seconds`` instead, and
    never answer). ``seconds=None``: after the first step, wait until the endpoint stops.
    ``"link"``: every request the fault matches shares one link of ``rate`` bytes/s (its
    :attr:`link`), as parallel transfers over one slow network do: a download's body is sent,
    a request's body (an upload) read, ``step`` bytes at a time as the link allows.
    """

    kind: str
    path: str = ".*"
    method: str = ".*"
    times: int = 1
    seconds: float | None = 0.0
    step: int = 1
    rate: float | None = None
    hits: int = 0
    released: threading.Event = field(default_factory=threading.Event)
    abandoned: threading.Event = field(default_factory=threading.Event)
    link: Link | None = None

    def __post_init__(self) -> None:
        if self.kind == "link":
            if not self.rate or self.rate <= 0:
                raise ValueError("a link fault needs a rate > 0 (bytes/s)")
            # A sleep that overslept on a loaded machine is made up: the link keeps its rate.
            self.link = Link(self.rate, burst=0.25)

    def release(self) -> None:
        """Let held requests go on."""
        self.released.set()

    def matches(self, method: str, path: str) -> bool:
        return (self.hits < self.times and re.search(self.method, method) is not None
                and re.search(self.path, path) is not None)


@dataclass
class Stats:
    """What the endpoint received: bytes per upload key, commits, requests by route."""

    uploaded_bytes: Counter = field(default_factory=Counter)
    commits: int = 0
    requests: Counter = field(default_factory=Counter)
    #: the bytes of file bodies the endpoint sent (downloads, whole or by range)
    sent_bytes: int = 0

    def reset(self) -> None:
        self.uploaded_bytes.clear()
        self.requests.clear()
        self.commits = 0
        self.sent_bytes = 0


class Link:
    """A shared bandwidth cap: each sender reserves its bytes' slot on one timeline and waits
    for its own slot's end. ``burst``: seconds of sending a late sender may catch up on (one that
    overslept sends at once), so the link's rate holds on a loaded machine; 0: none."""

    def __init__(self, rate: float, burst: float = 0.0):
        self.rate, self.burst = rate, burst
        self._next, self._lock = time.monotonic(), threading.Lock()

    def wait_for(self, size: int, stopping: threading.Event | None = None) -> bool:
        """Wait for ``size`` bytes' slot; False if ``stopping`` was set meanwhile."""
        with self._lock:
            start = max(self._next, time.monotonic() - self.burst)
            self._next = end = start + size / self.rate
        delay = end - time.monotonic()
        if stopping is None:
            if delay > 0:
                time.sleep(delay)
            return True
        return not stopping.wait(max(0.0, delay))


class _LinkedBody:
    """A request's ``rfile`` whose body reads (``read``) go through a link fault's link, ``step``
    bytes at a time; lines (the next request's head, chunk sizes) are read as they come."""

    def __init__(self, inner: Any, fault: Fault, stopping: threading.Event):
        self.inner, self._fault, self._stopping = inner, fault, stopping

    def read(self, size: int | None = -1) -> bytes:
        step = self._fault.step if size is None or size < 0 else min(size, self._fault.step)
        assert self._fault.link is not None
        if not self._fault.link.wait_for(step, self._stopping):
            return b""  # the endpoint stops: the body "ended early"
        return self.inner.read(step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class InstrumentedHub(LocalHub):
    """A :class:`LocalHub` for tests: faults, a bandwidth cap, counters, request waiting.

    Args:
        max_rate: cap on download bandwidth in bytes/s, shared by all connections; None means
            as fast as loopback goes.
    """

    def __init__(self, root: str | Path, *, max_rate: float | None = None, **kwargs: Any):
        super().__init__(root, **kwargs)
        self.faults: list[Fault] = []
        self.stats = Stats()
        self.link = Link(max_rate) if max_rate else None
        self._faults_lock = threading.Lock()
        self._seen: list[str] = []
        self._seen_changed = threading.Condition()
        self._stopping = threading.Event()
        self.open_connections = 0
        self._connections_changed = threading.Condition()

    def add_fault(self, kind: str, path: str = ".*", method: str = ".*", times: int = 1,
                  seconds: float | None = 0.0, step: int = 1,
                  rate: float | None = None) -> Fault:
        fault = Fault(kind, path, method, times, seconds, step, rate)
        with self._faults_lock:
            self.faults.append(fault)
        return fault

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._faults_lock:
            for fault in self.faults:
                if fault.matches(method, path):
                    fault.hits += 1
                    return fault
        return None

    def stop(self) -> None:
        self._stopping.set()  # held and trickling requests end with the endpoint
        for fault in self.faults:
            fault.release()
        super().stop()

    def wait_for_connections(self, count: int, timeout: float = 60.0) -> bool:
        """Block until ``count`` connections are being served at once (each holds a thread)."""
        with self._connections_changed:
            return self._connections_changed.wait_for(
                lambda: self.open_connections >= count, timeout)

    def wait_for_request(self, pattern: str, timeout: float = 60.0) -> bool:
        """Block until a request matching ``pattern`` ("METHOD /path" regex) has arrived.

        For tests that must act while a request is in flight (e.g. kill a client mid-download).
        """
        with self._seen_changed:
            return self._seen_changed.wait_for(
                lambda: any(re.search(pattern, seen) for seen in self._seen), timeout)

    # --- hooks -----------------------------------------------------------------------------------
    def before_request(self, handler: Any, method: str, path: str) -> bool:
        self.stats.requests[f"{method} {re.sub(r'/[0-9a-f]{40,64}', '/<oid>', path)}"] += 1
        with self._seen_changed:
            self._seen.append(f"{method} {path}")
            self._seen_changed.notify_all()
        if isinstance(handler.rfile, _LinkedBody):  # the connection's last request had a link
            handler.rfile = handler.rfile.inner
        fault = self._take_fault(method, path)
        handler.shared_link = fault if fault is not None and fault.kind == "link" else None
        if handler.shared_link is not None and method in ("PUT", "POST"):
            handler.rfile = _LinkedBody(handler.rfile, fault, self._stopping)
            # The link paces the body, not loopback's megabytes of receive buffer.
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2 * fault.step)
        handler.truncate = fault is not None and fault.kind == "truncate"
        handler.corrupt = fault is not None and fault.kind == "corrupt"
        handler.trickle = fault if fault is not None and fault.kind == "trickle" else None
        if handler.trickle is not None and method in ("PUT", "POST"):
            self._trickle_body(handler, handler.trickle)
            return False
        if fault is None or fault.kind in ("truncate", "corrupt", "trickle", "link"):
            return True
        if fault.kind == "delay":
            self._stopping.wait(fault.seconds)
            return True
        if fault.kind == "hold":
            while not (fault.released.is_set() or self._stopping.is_set()):
                fault.released.wait(0.5)
            return True
        handler.drain()
        if fault.kind == "drop":
            handler.close_connection = True
        else:
            status = int(fault.kind) if fault.kind.isdigit() else 500
            handler.send_json({"error": f"Injected {status}"}, status)
        return False

    def _trickle_body(self, handler: Any, trickle: Fault) -> None:
        """Read a request's body ``step`` bytes at a time, never answering (see :class:`Fault`)."""
        handler.close_connection = True
        try:
            while True:
                if not handler.connection.recv(trickle.step):
                    break  # the client hung up (or sent all: it waits for an answer in vain)
                if self._stopping.wait(trickle.seconds):
                    return
        except OSError:
            pass
        trickle.abandoned.set()

    def connection_changed(self, delta: int) -> None:
        with self._connections_changed:
            self.open_connections += delta
            self._connections_changed.notify_all()

    def send_file(self, handler: Any, handle: Any, offset: int, count: int) -> None:
        self.stats.sent_bytes += count
        trickle = getattr(handler, "trickle", None)
        if trickle is not None:
            handler.close_connection = True
            try:
                for position in range(offset, offset + count, trickle.step):
                    size = min(trickle.step, offset + count - position)
                    handler.connection.sendall(os.pread(handle.fileno(), size, position))
                    if self._stopping.wait(trickle.seconds):
                        return
            except OSError:
                trickle.abandoned.set()  # the client hung up
            return
        shared = getattr(handler, "shared_link", None)
        if shared is not None:
            try:
                for position in range(offset, offset + count, shared.step):
                    size = min(shared.step, offset + count - position)
                    if not shared.link.wait_for(size, self._stopping):
                        return
                    handler.connection.sendall(os.pread(handle.fileno(), size, position))
            except OSError:
                handler.close_connection = True
                shared.abandoned.set()  # the client hung up
            return
        if getattr(handler, "truncate", False):
            count //= 2
            handler.close_connection = True
        if getattr(handler, "corrupt", False) and count:
            body = bytearray(os.pread(handle.fileno(), count, offset))
            body[count // 2] ^= 0xFF
            handler.connection.sendall(bytes(body))
            return
        if self.link is None:
            super().send_file(handler, handle, offset, count)
            return
        for start in range(offset, offset + count, 1024 * 1024):
            size = min(1024 * 1024, offset + count - start)
            self.link.wait_for(size)
            super().send_file(handler, handle, start, size)

    def count_upload(self, key: str, size: int) -> None:
        self.stats.uploaded_bytes[key] += size

    def count_commit(self) -> None:
        self.stats.commits += 1


def upload_folder(endpoint: str, repo_id: str, folder: str | Path, *, repo_type: str = "model",
                  token: str | None = None) -> str:
    """Create ``repo_id`` on ``endpoint`` and commit every file of ``folder`` to it, as someone
    publishing a model or a raw folder would (no cubepack checks); return the commit SHA."""
    from huggingface_hub import CommitOperationAdd



    client = HubClient(endpoint, token)
    client.api.create_repo(repo_id, repo_type=repo_type, exist_ok=True)
    folder = Path(folder)
    operations = [CommitOperationAdd(path.relative_to(folder).as_posix(), str(path))
                  for path in sorted(folder.rglob("*")) if path.is_file()]
    return client.create_commit(repo_id, operations, repo_type=repo_type, branch="main",
                                message=f"upload {folder.name}").oid


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve an InstrumentedHub (tests, benchmarks).")
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-rate-mb", type=float, default=None)
    args = parser.parse_args(argv)
    hub = InstrumentedHub(args.root, port=args.port,
                          max_rate=args.max_rate_mb * 1e6 if args.max_rate_mb else None)
    print(f"serving {args.root} at {hub.url}", flush=True)
    try:
        hub.serve_forever()
    except KeyboardInterrupt:
        hub.stop()


if __name__ == "__main__":
    main()
