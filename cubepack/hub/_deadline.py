"""The overall deadline of a pull or a push.

huggingface_hub's timeouts apply to each read (a byte every few seconds never trips them), and
its API calls have none. A :class:`Deadline` bounds the whole operation instead:

- **a watchdog**: each network part of the operation runs in a worker thread, and the caller
  waits for it until the deadline at most, then raises a :class:`~cubepack.errors.HubError`
  naming the endpoint and what was slow (the file and the bytes that had arrived, or the call);
- **an HTTP guard** on every request huggingface_hub makes for the operation: each read may
  block only until the deadline, a response body is checked after every chunk, and at expiry
  the sockets in flight are shut down and any new request is refused, so no download goes on
  in the background. With huggingface_hub 2.x these are hooks on its shared httpx client (the
  request hook caps the timeouts, the response hook wraps the body stream); with 0.36 a backend
  factory (``configure_http_backend``) whose sessions wrap their adapters. The guard is
  installed while a guarded operation runs and removed when the last one ends, and it acts only
  on requests made for such an operation.

- **the low-speed rule** (:mod:`cubepack.hub._stall`): the guard counts each request's bytes,
  sent and received, into the operation's :class:`~cubepack.hub._stall.Windows` (the bytes of
  all its requests, in whatever thread, count for each), and the watchdog judges every request
  in flight when its window is due; a stall ends the operation as the deadline would, with a
  HubError naming it.

Requests belong to an operation when made in its threads (the worker, and the threads it binds
with :meth:`Deadline.bind`), or when their URL holds a name it gave (:meth:`Deadline.name`: a
push names its files' sha256, which the LFS upload URLs huggingface_hub sends from threads of
its own carry, whatever their host). Any other request passes untouched.
"""

from __future__ import annotations

import contextvars
import io
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from ..errors import HubError
from ._stall import ADVICE, LowSpeed, Verdict, Windows

#: A sha256 in a URL path (LFS upload URLs carry the object's).
_SHA256_RUN = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
#: Seconds the caller waits, after the deadline, for the aborted worker to end (aborted requests
#: end at once; huggingface_hub may sleep a second before it asks again, and is refused).
_ABORT_GRACE = 5.0
#: Answers after which huggingface_hub waits and asks again (its retried statuses, and 429).
_RETRYABLE = frozenset({429, 500, 502, 503, 504})
#: The shortest wait between two judgements of the low-speed rule (a window due "now" is judged
#: now; this only keeps a clock's rounding from spinning the watchdog).
_MIN_JUDGE_WAIT = 0.01


class _Expired(Exception):
    """Raised inside huggingface_hub once the deadline passed. Deliberately no OSError and no
    HTTP library's error, so the client does not retry it."""


@dataclass
class _Transfer:
    """One request in flight, for the error message and the abort."""

    method: str
    url: str
    received: int = 0
    total: int | None = None
    answered: bool = False
    sock: Any = None
    started: float = field(default_factory=time.monotonic)
    sent: int = 0
    to_send: int | None = None
    status: int | None = None
    retry_after: str | None = None
    #: A retry wait: no request in flight, the client sleeping before it asks again (after a
    #: retryable answer). It moves no bytes, so the low-speed rule judges it like a request.
    waiting: bool = False


class Deadline:
    """``seconds`` from now for everything ``action`` asks of ``endpoint``.

    Args:
        action: what is bounded, for the message ("the pull of ns/cube").
        outcome: what the caller can rely on after expiry, for the message.
        low_speed: the low-speed rule its requests are judged by (None: none).
    """

    def __init__(self, seconds: float, endpoint: str, action: str, outcome: str = "",
                 low_speed: LowSpeed | None = None):
        self.seconds, self.endpoint, self.action, self.outcome = seconds, endpoint, action, outcome
        self.low_speed = low_speed
        #: The low-speed rule's windows, one per request in flight (keyed as ``_transfers``).
        self._windows = Windows(low_speed) if low_speed is not None else None
        self._stall: tuple[_Transfer, Verdict] | None = None
        self.expires = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._transfers: dict[int, _Transfer] = {}  # by thread: each makes one at a time
        self._names: dict[str, str] = {}
        self._last = ""
        self._slow = ""
        self._aborted = threading.Event()

    # --- time --------------------------------------------------------------------------------
    def remaining(self) -> float:
        return max(0.0, self.expires - time.monotonic())

    @property
    def expired(self) -> bool:
        return self._aborted.is_set() or time.monotonic() >= self.expires

    def io_limit(self) -> float:
        """The longest one network wait (connect, read, write) of a request may block: until
        the deadline, and within the low-speed rule's cap."""
        remaining = self.remaining()
        return remaining if self.low_speed is None else min(remaining, self.low_speed.read_cap)

    def pause(self, seconds: float) -> bool:
        """Wait ``seconds`` (a retry's backoff) unless that would pass the deadline: then
        return False at once. An abort ends the wait early (False too)."""
        if seconds >= self.remaining():
            return False
        return not self._aborted.wait(seconds)

    # --- running an operation ----------------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in a worker thread, waited for until the deadline at most.

        Raises:
            HubError: the deadline passed (the worker's requests are aborted first).
        """
        if _CURRENT.get() is self:  # already inside this operation's worker
            return fn(*args, **kwargs)
        if self.expired:
            raise self.error()
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            token = _CURRENT.set(self)
            try:
                outcome["value"] = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome["error"] = exc
            finally:
                self.settled()
                _CURRENT.reset(token)
                _leave(self)  # the guard stays until the worker really ended
                done.set()

        _enter(self)
        try:
            threading.Thread(target=work, name="cubepack-call", daemon=True).start()
        except BaseException:
            _leave(self)
            raise
        try:
            finished = self._watch(done)
        except BaseException:  # interrupted (Ctrl-C): stop the worker's requests too
            self.expire()
            raise
        if not finished:
            self.expire()
            done.wait(_ABORT_GRACE)
            raise self.error() from outcome.get("error")
        if "error" in outcome:
            if self.expired:
                raise self.error() from outcome["error"]
            raise outcome["error"]
        return outcome["value"]

    def _watch(self, done: threading.Event) -> bool:
        """Wait for ``done`` until the deadline, judging the requests in flight by the
        low-speed rule whenever one's window is due. True: done; False: the deadline passed or
        a request stalled (recorded for :meth:`error`), and the caller expires the rest."""
        while True:
            wait = self.remaining()
            if self.low_speed is not None:
                wait = min(wait, max(_MIN_JUDGE_WAIT, self._next_due() - time.monotonic()))
            if done.wait(wait):
                return True
            if self.expired:
                return False
            if self._judge():
                return False

    def _next_due(self) -> float:
        assert self.low_speed is not None and self._windows is not None
        with self._lock:
            due = self._windows.due()
        # A request sent from now on is due no sooner than a full window from now.
        return due if due is not None else time.monotonic() + self.low_speed.seconds

    def _judge(self) -> bool:
        """Judge every request in flight (on the bytes all of them moved); on the first
        (oldest) stalled one, record it, abort the operation's requests and return True."""
        assert self._windows is not None
        now = time.monotonic()
        with self._lock:
            in_flight = sorted(self._transfers.items(), key=lambda item: item[1].started)
            verdicts = [(transfer, self._windows.judge(key, now)) for key, transfer in in_flight]
        for transfer, verdict in verdicts:
            if verdict is not None:
                self.expire(stall=(transfer, verdict))
                return True
        return False

    def progress(self, transfer: _Transfer, *, received: int = 0, sent: int = 0) -> None:
        """``transfer`` moved bytes: counted for messages, and for the low-speed rule as the
        operation's (every request's window counts them)."""
        transfer.received += received
        transfer.sent += sent
        if self._windows is not None:
            with self._lock:
                self._windows.add(received + sent, time.monotonic())

    def bind(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` for another thread of this operation (a pool's): its requests are guarded."""
        def bound(*args: Any, **kwargs: Any) -> Any:
            if self.expired:  # cooperative: no new file starts after the deadline
                raise _Expired()
            token = _CURRENT.set(self)
            try:
                return fn(*args, **kwargs)
            finally:
                self.settled()
                _CURRENT.reset(token)
        return bound

    def name(self, sha256: str, label: str) -> None:
        """A request whose URL path holds ``sha256`` (a file's digest: LFS upload URLs carry
        it) is this operation's, whichever thread sends it, and ``label`` in messages."""
        self._names[sha256.lower()] = label

    def names(self, path: str) -> str | None:
        """The label of the first named digest ``path`` holds, or None: a look-up per 64-hex
        run of the path, never a scan of the names (a push names every file it holds)."""
        return next((self._names[digest] for digest in _SHA256_RUN.findall(path.lower())
                     if digest in self._names), None)

    def expire(self, stall: tuple[_Transfer, Verdict] | None = None) -> None:
        """Record what was slow (or the ``stall``: a request and the low-speed rule's verdict
        on it), then abort every request in flight and refuse new ones."""
        with self._lock:
            if self._aborted.is_set():
                return
            self._slow = self._describe()
            self._stall = stall
            self._aborted.set()
            transfers = list(self._transfers.values())
        for transfer in transfers:
            if transfer.sock is not None:
                try:
                    transfer.sock.shutdown(socket.SHUT_RDWR)  # a blocked read returns at once
                except OSError:
                    pass

    def check(self, step: str) -> HubError | None:
        """For work that is not I/O (a pull's verification): the error to end with once the
        deadline passed, naming the step that was running (see :mod:`cubepack._util.budget`)."""
        if self._stall is not None:
            return self.error()
        if self.expired:
            return HubError(f"The {self.action} did not finish within {self.seconds:g} s "
                           f"(--timeout or CUBEPACK_HUB_TIMEOUT): its checks were still running "
                           f"({step})." + (f" {self.outcome}" if self.outcome else ""))

    def error(self) -> HubError:
        if self._stall is not None:
            return self._stall_error(*self._stall)
        slow = self._slow or self._describe()
        return HubError(f"The {self.action} did not finish within {self.seconds:g} s (--timeout "
                        f"or CUBEPACK_HUB_TIMEOUT): {self.endpoint} was too slow; {slow}."
                        + (f" {self.outcome}" if self.outcome else ""))

    def _stall_error(self, transfer: _Transfer, verdict: Verdict) -> HubError:
        assert self.low_speed is not None
        what = self._what(transfer)
        # The rate is the operation's: with several requests in flight, say it is theirs.
        rate = f"{verdict.rate:,.1f} bytes/s" + (
            f", its {verdict.requests} requests in flight together" if verdict.requests > 1
            else "")
        error = HubError(
            f"The {self.action} stalled: {self.endpoint} moved {verdict.moved:,} bytes in "
            f"{verdict.seconds:.1f} s ({rate}) while {what}, under "
            f"{self.low_speed.describe()}; {self._progress(transfer)}. {ADVICE}"
            + (f" {self.outcome}" if self.outcome else ""))
        error.details = {"stall": {
            "endpoint": self.endpoint, "request": f"{transfer.method} {urlsplit(transfer.url).path}",
            "phase": what, "file": self._file(transfer), "answered": transfer.answered,
            "bytes_sent": transfer.sent, "bytes_to_send": transfer.to_send,
            "bytes_received": transfer.received, "bytes_total": transfer.total,
            "retry_wait": transfer.waiting, "retry_after": transfer.retry_after,
            **self.low_speed.details(verdict)}}
        return error

    # --- the guard's view of requests --------------------------------------------------------
    def begin(self, method: str, url: str, to_send: int | None = None) -> _Transfer:
        if self.expired:
            raise _Expired()
        transfer = _Transfer(method, url, to_send=to_send)
        transfer.started = time.monotonic()
        key = threading.get_ident()
        with self._lock:
            self._transfers[key] = transfer
            if self._windows is not None:
                self._windows.open(key, transfer.started)
        return transfer

    def connected(self, transfer: _Transfer, sock: Any) -> None:
        """The request's socket, before any answer: an abort can shut it too."""
        transfer.sock = sock
        if self._aborted.is_set() and sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def answered(self, transfer: _Transfer, total: int | None, sock: Any,
                 status: int | None = None, retry_after: str | None = None) -> None:
        transfer.answered, transfer.total = True, total
        transfer.status, transfer.retry_after = status, retry_after
        transfer.sock = sock if sock is not None else transfer.sock
        if self._aborted.is_set() and sock is not None:  # answered as the deadline passed
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def end(self, transfer: _Transfer) -> None:
        """``transfer`` is over. After a retryable answer (429, 5xx) the client waits and asks
        again with no request in flight: that wait stands in its place, so the low-speed rule
        judges the whole operation, not only its requests (a ``Retry-After: 600`` is a stall,
        not ten minutes)."""
        with self._lock:
            for key, current in list(self._transfers.items()):
                if current is transfer:
                    del self._transfers[key]
                    if self._windows is None:
                        continue
                    self._windows.close(key)
                    if transfer.status in _RETRYABLE:
                        wait = _Transfer(transfer.method, transfer.url, answered=True, total=0,
                                         status=transfer.status,
                                         retry_after=transfer.retry_after, waiting=True)
                        self._transfers[key] = wait
                        self._windows.open(key, wait.started)
            self._last = self._what(transfer)

    def settled(self) -> None:
        """The calling thread's part of the operation ended (returned or gave up): a retry
        wait it left is over, not a stall."""
        key = threading.get_ident()
        with self._lock:
            current = self._transfers.get(key)
            if current is not None and current.waiting:
                del self._transfers[key]
                if self._windows is not None:
                    self._windows.close(key)

    def _describe(self) -> str:
        transfers = sorted(self._transfers.values(), key=lambda t: t.started)
        if not transfers:
            return "no request was in flight" + (f" (the last: {self._last})" if self._last
                                                 else "")
        described = [f"{self._what(t)} ({self._progress(t)})" for t in transfers[:3]]
        more = f" and {len(transfers) - 3} more" if len(transfers) > 3 else ""
        return "still " + "; ".join(described) + more

    def _file(self, transfer: _Transfer) -> str | None:
        """The file a request downloads (or asks about) or uploads, if it is one's."""
        downloaded = self._downloaded(transfer)
        return downloaded if downloaded is not None else self.names(urlsplit(transfer.url).path)

    @staticmethod
    def _downloaded(transfer: _Transfer) -> str | None:
        _, resolve, rest = urlsplit(transfer.url).path.partition("/resolve/")
        return unquote(rest.split("/", 1)[1]) if resolve and "/" in rest else None

    def _what(self, transfer: _Transfer) -> str:
        if transfer.waiting:
            after = f", Retry-After: {transfer.retry_after}" if transfer.retry_after else ""
            return (f"waiting to retry {transfer.method} {urlsplit(transfer.url).path} (the "
                    f"retry wait after a {transfer.status} answer{after}; no request in flight)")
        downloaded = self._downloaded(transfer)
        if downloaded is not None:
            return f"downloading {downloaded}" if transfer.method == "GET" else \
                f"asking for {downloaded} ({transfer.method})"
        path = urlsplit(transfer.url).path
        label = self.names(path)
        return f"uploading {label}" if label else f"waiting for {transfer.method} {path}"

    @staticmethod
    def _progress(transfer: _Transfer) -> str:
        if transfer.waiting:
            return "no bytes moved while the client waited"
        sent = ""
        if transfer.sent or transfer.to_send:
            of = f" of {transfer.to_send:,}" if transfer.to_send is not None else ""
            sent = f"{transfer.sent:,}{of} bytes sent, "
        if not transfer.answered:
            return sent + "no answer yet"
        total = f" of {transfer.total:,}" if transfer.total is not None else ""
        return f"{sent}{transfer.received:,}{total} bytes arrived"


# --- which operation a request belongs to ------------------------------------------------------
_CURRENT: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("cubepack_deadline",
                                                                           default=None)
_ACTIVE: list[Deadline] = []  # one entry per running worker
_ACTIVE_LOCK = threading.Lock()
_UNINSTALL: list[Callable[[], None]] = []


def _deadline_for(url: str) -> Deadline | None:
    """The operation a request belongs to: its thread's, else the running one whose names its
    URL holds (the latest to expire, should two share a file: never cut one short)."""
    current = _CURRENT.get()
    if current is not None:
        return current
    path = urlsplit(url).path
    with _ACTIVE_LOCK:
        candidates = [deadline for deadline in _ACTIVE if deadline.names(path)]
    return max(candidates, key=lambda d: d.expires) if candidates else None


def _enter(deadline: Deadline) -> None:
    with _ACTIVE_LOCK:
        if not _ACTIVE:
            _UNINSTALL.append(_install())
        _ACTIVE.append(deadline)


def _leave(deadline: Deadline) -> None:
    with _ACTIVE_LOCK:
        _ACTIVE.remove(deadline)
        if not _ACTIVE and _UNINSTALL:
            _UNINSTALL.pop()()


def _install() -> Callable[[], None]:
    """Put the guard into huggingface_hub's HTTP layer; return what takes it out again."""
    import huggingface_hub

    if hasattr(huggingface_hub, "configure_http_backend"):  # 0.x: requests, a session per thread
        remove = _install_requests(huggingface_hub)
    else:
        remove = _install_httpx(huggingface_hub)
    restore = _install_retry_sleep()

    def uninstall() -> None:
        restore()
        remove()
    return uninstall


class _GuardedTime:
    """huggingface_hub's ``time`` module as its retry loop (``http_backoff``) sees it while a
    guarded operation runs: ``sleep`` in an operation's thread ends when the operation is
    aborted (a stall, the deadline), so a ``Retry-After: 600`` wait does not outlive the
    operation in a worker thread; everything else is the ``time`` module's."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        deadline = _CURRENT.get()
        if deadline is None:
            time.sleep(seconds)
        elif deadline._aborted.wait(max(0.0, seconds)):
            raise _Expired()


def _install_retry_sleep() -> Callable[[], None]:
    try:
        from huggingface_hub.utils import _http
    except ImportError:  # pragma: no cover - a layout without it: retry waits are not cut
        return lambda: None
    if getattr(_http, "time", None) is not time:
        return lambda: None
    _http.time = _GuardedTime()

    def restore() -> None:
        if isinstance(getattr(_http, "time", None), _GuardedTime):
            _http.time = time
    return restore


def _capped(value: float | None, remaining: float) -> float:
    return remaining if value is None else min(value, remaining)


# --- huggingface_hub 2.x (httpx) ---------------------------------------------------------------
def _install_httpx(huggingface_hub: Any) -> Callable[[], None]:
    client = huggingface_hub.get_session()
    hooks = client.event_hooks
    hooks["request"].append(_on_httpx_request)
    hooks["response"].append(_on_httpx_response)

    def uninstall() -> None:
        for kind, hook in (("request", _on_httpx_request), ("response", _on_httpx_response)):
            if hook in hooks[kind]:
                hooks[kind].remove(hook)
    return uninstall


def _on_httpx_request(request: Any) -> None:
    deadline = _deadline_for(str(request.url))
    if deadline is None:
        return
    length = request.headers.get("Content-Length")
    transfer = deadline.begin(request.method, str(request.url),
                              int(length) if length and length.isdigit() else None)
    limit = deadline.io_limit()
    timeouts = dict(request.extensions.get("timeout") or {})
    request.extensions["timeout"] = {key: _capped(timeouts.get(key), limit)
                                     for key in ("connect", "read", "write", "pool")}
    request.extensions["cubepack_transfer"] = (deadline, transfer)
    request.extensions["trace"] = _httpx_trace(deadline, transfer, request.extensions.get("trace"))
    request.stream = _guarded_stream_classes()[1](request.stream, deadline, transfer)


def _httpx_trace(deadline: Deadline, transfer: _Transfer,
                 inner: Callable[[str, dict[str, Any]], None] | None
                 ) -> Callable[[str, dict[str, Any]], None]:
    """httpcore's trace extension for one request: its socket as soon as it is connected (an
    abort then shuts it even before an answer), and its end if it fails before any answer (the
    response hook, which otherwise ends it, never runs then: the low-speed rule must not judge
    a request that is gone)."""
    def trace(event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                deadline.connected(transfer, sock)
        elif event.endswith(".failed") and not transfer.answered:
            deadline.end(transfer)
        if inner is not None:
            inner(event, info)
    return trace


def _on_httpx_response(response: Any) -> None:
    owner = response.request.extensions.get("cubepack_transfer")
    if owner is None:
        return
    deadline, transfer = owner
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    length = response.headers.get("Content-Length")
    deadline.answered(transfer, int(length) if length and length.isdigit() else None, sock,
                      response.status_code, response.headers.get("Retry-After"))
    response.stream = _guarded_stream_classes()[0](response.stream, deadline, transfer)


_GUARDED_STREAM: list[type] = []


def _guarded_stream_classes() -> tuple[type, type]:
    """httpx body streams (built on first use: httpx is imported only with huggingface_hub
    2.x): a response's, whose chunks are counted and stopped once the deadline passed, and a
    request's, whose chunks are counted as they are sent."""
    if not _GUARDED_STREAM:
        try:
            from httpx2 import SyncByteStream
        except ImportError:  # huggingface_hub 1.x
            from httpx import SyncByteStream

        class GuardedStream(SyncByteStream):
            def __init__(self, inner: Any, deadline: Deadline, transfer: _Transfer):
                self._inner, self._deadline, self._transfer = inner, deadline, transfer

            def __iter__(self) -> Iterator[bytes]:
                yield from _guarded_chunks(iter(self._inner), self._deadline, self._transfer)

            def close(self) -> None:
                try:
                    self._inner.close()
                finally:
                    self._deadline.end(self._transfer)

        class CountedBody(SyncByteStream):
            def __init__(self, inner: Any, deadline: Deadline, transfer: _Transfer):
                self._inner, self._deadline, self._transfer = inner, deadline, transfer

            def __iter__(self) -> Iterator[bytes]:
                for chunk in self._inner:
                    if self._deadline.expired:  # aborted: send no more of it
                        raise _Expired()
                    yield chunk
                    # Back for more: the chunk was handed to the socket.
                    self._deadline.progress(self._transfer, sent=len(chunk))

            def close(self) -> None:
                close = getattr(self._inner, "close", None)
                if close is not None:
                    close()

        _GUARDED_STREAM.extend([GuardedStream, CountedBody])
    return _GUARDED_STREAM[0], _GUARDED_STREAM[1]


def _guarded_chunks(chunks: Iterator[Any], deadline: Deadline, transfer: _Transfer,
                    read: Callable[[Any], bytes] = lambda chunk: chunk) -> Iterator[bytes]:
    """A body's chunks (each ``read(next(chunks))``), counted, and stopped (without a retry)
    once the deadline passed."""
    while True:
        try:
            chunk = read(next(chunks))
        except StopIteration:
            return
        except Exception:
            if deadline.expired:  # we shut its socket: do not let the client retry
                raise _Expired() from None
            raise
        deadline.progress(transfer, received=len(chunk))
        if deadline.expired:
            raise _Expired()
        yield chunk


# --- huggingface_hub 0.x (requests) ------------------------------------------------------------
def _install_requests(huggingface_hub: Any) -> Callable[[], None]:
    from huggingface_hub.utils import _http

    previous = _http._GLOBAL_BACKEND_FACTORY  # the user's own factory, if any, is kept inside

    def guarded_factory() -> Any:
        session = previous()
        for prefix, adapter in list(session.adapters.items()):
            session.mount(prefix, _guarded_adapter(adapter))
        return session

    huggingface_hub.configure_http_backend(guarded_factory)
    return lambda: huggingface_hub.configure_http_backend(previous)


def _guarded_adapter(inner: Any) -> Any:
    from requests.adapters import BaseAdapter

    class GuardedAdapter(BaseAdapter):
        def send(self, request: Any, stream: bool = False, timeout: Any = None,
                 verify: Any = True, cert: Any = None, proxies: Any = None) -> Any:
            deadline = _deadline_for(request.url)
            if deadline is None:
                return inner.send(request, stream=stream, timeout=timeout, verify=verify,
                                  cert=cert, proxies=proxies)
            length = request.headers.get("Content-Length")
            transfer = deadline.begin(request.method, request.url,
                                      int(length) if length and length.isdigit() else None)
            limit = deadline.io_limit()
            connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
            if isinstance(request.body, bytes) or hasattr(request.body, "read"):
                # A copy sends a counted body; the caller's request keeps its own (a redirect
                # or a retry rewinds that one).
                request = request.copy()
                request.body = _CountedBody(request.body, deadline, transfer)
            try:
                response = inner.send(request, stream=stream, verify=verify, cert=cert,
                                      proxies=proxies, timeout=(_capped(connect, limit),
                                                                _capped(read, limit)))
            except Exception:
                deadline.end(transfer)
                if deadline.expired:
                    raise _Expired() from None
                raise
            raw = response.raw
            length = response.headers.get("Content-Length")
            deadline.answered(transfer, int(length) if length and length.isdigit() else None,
                              getattr(getattr(raw, "connection", None), "sock", None),
                              response.status_code, response.headers.get("Retry-After"))
            response.raw = _GuardedRaw(raw, deadline, transfer)
            return response

        def close(self) -> None:
            inner.close()

    return GuardedAdapter()


class _CountedBody:
    """A request body for urllib3 (which reads a file-like body block by block), counted as it
    is read, which is as it is sent: bytes become a file too, so a large body is counted as it
    goes rather than at once."""

    def __init__(self, body: Any, deadline: Deadline, transfer: _Transfer):
        self._body = io.BytesIO(body) if isinstance(body, bytes) else body
        self._deadline, self._transfer = deadline, transfer

    def read(self, *args: Any) -> bytes:
        if self._deadline.expired:  # aborted: send no more of it
            raise _Expired()
        chunk = self._body.read(*args)
        self._deadline.progress(self._transfer, sent=len(chunk))
        return chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self._body, name)


class _GuardedRaw:
    """A urllib3 response whose body is counted and stopped once the deadline passed."""

    def __init__(self, raw: Any, deadline: Deadline, transfer: _Transfer):
        self._raw, self._deadline, self._transfer = raw, deadline, transfer

    def stream(self, amt: int | None = None, decode_content: bool | None = None) -> Iterator[bytes]:
        raw = self._raw
        if getattr(raw, "chunked", False) or not hasattr(raw, "read1"):
            chunks = raw.stream(amt, decode_content=decode_content)
        else:
            # What has arrived, up to ``amt``, rather than ``amt`` bytes at once: urllib3's
            # stream() blocks until a whole chunk (huggingface_hub asks for 10 MB) is in, so a
            # slow link would show no progress for minutes and the low-speed rule would judge
            # an honest download stalled.
            chunks = _arrived(raw, amt, decode_content)
        try:
            yield from _guarded_chunks(chunks, self._deadline, self._transfer)
        finally:
            self._deadline.end(self._transfer)

    def read(self, *args: Any, **kwargs: Any) -> bytes:
        return b"".join(_guarded_chunks(iter([None]), self._deadline, self._transfer,
                                        lambda _: self._raw.read(*args, **kwargs)))

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            self._deadline.end(self._transfer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def _arrived(raw: Any, amt: int | None, decode_content: bool | None) -> Iterator[bytes]:
    """A urllib3 response's body as it arrives: each chunk one read of the socket (``read1``),
    at most ``amt`` bytes; ends at the body's end."""
    while True:
        chunk = raw.read1(amt, decode_content=decode_content)
        if not chunk:
            return
        yield chunk
