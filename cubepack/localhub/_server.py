"""The HTTP side of the local Hub: routes of the Hub API the huggingface_hub client uses.

Routes and response shapes follow what huggingface_hub 0.36 and 2.x send and parse (see the
README's "Local Hub endpoint" section). Errors carry ``X-Error-Code`` (RepoNotFound,
RevisionNotFound, EntryNotFound) so the client raises its typed exceptions.

:class:`LocalHub` has a few hook methods (``before_request``, ``send_file``, ``count_upload``,
``count_commit``) that do nothing special here; :mod:`cubepack.testing.hub` overrides them for
fault injection, bandwidth caps and byte counting.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import functools
import hashlib
import hmac
import html
import io
import itertools
import json
import math
import os
import re
import secrets
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from .._util import constants
from ..errors import UsageError
from . import _bodies as bodies
from ._errors import StoreError, shown
from ._listing import PAGE_SIZE, ListQuery, card_tags, page, selected
from ._ids import (
    RepoRef,
    Revision,
    blob_oid,
    discussion_number,
    event_id,
    new_ref_name,
    new_repo_ref,
    parse_revision,
    ref_name,
    repo_ref,
)
from ._store import AddFile, HubStore


@dataclass(frozen=True)
class Segment:
    """A placeholder of a route's path: the text it matches, and the parser of :mod:`._ids`
    that turns it (URL-unquoted) into the typed value the handler gets."""

    pattern: str
    parse: Callable[[str], Any] = str


#: Every placeholder a route may have. ``kind``, ``datasets``, ``namespace`` and ``name`` are
#: typed together into the route's RepoRef (:func:`repo_ref`, 404 RepoNotFound); the others one
#: by one. ``path`` stays a string: it is only ever a key of a commit's tree, never a file name.
SEGMENTS = {
    "kind": Segment("models|datasets"),
    "datasets": Segment("datasets"),
    "namespace": Segment("[^/]+"),
    "name": Segment("[^/]+"),
    "revision": Segment("[^/]+", parse_revision),
    "branch": Segment("[^/]+", new_ref_name),
    "ref_kind": Segment("tag|branch"),
    "ref": Segment("[^/]+", ref_name),
    "num": Segment("[^/]+", discussion_number),
    "event": Segment("[^/]+", event_id),
    "oid": Segment("[^/]+", blob_oid),
    "path": Segment(".*"),
    "xet": Segment("xet-(?:write|read)-token(?:/.*)?"),
}
#: A route's path template: literal text, ``{placeholder}`` (one segment, or as SEGMENTS says),
#: ``{placeholder*}`` (one or more segments: ``refs/pr/1`` sent unquoted) and ``[...]``
#: (optional).
_TEMPLATE = re.compile(r"\{(?P<name>\w+)(?P<star>\*?)\}|(?P<open>\[)|(?P<close>\])|[^{}\[\]]+")


def _compile(template: str) -> re.Pattern[str]:
    """The regular expression of a path template (an unknown placeholder is a KeyError, a
    malformed template a ValueError: both at import)."""
    parts, depth = [], 0
    for token in _TEMPLATE.finditer(template):
        if token["name"]:
            pattern = ".+" if token["star"] else SEGMENTS[token["name"]].pattern
            parts.append(f"(?P<{token['name']}>{pattern})")
        elif token["open"] or token["close"]:
            depth += 1 if token["open"] else -1
            parts.append("(?:" if token["open"] else ")?")
            if depth not in (0, 1):  # Route.path fills one level of optional parts
                raise ValueError(f"Unbalanced or nested [...] in route template {template!r}.")
        else:
            parts.append(re.escape(token[0]))
    if depth or "".join(token[0] for token in _TEMPLATE.finditer(template)) != template:
        raise ValueError(f"Malformed route template {template!r}.")
    return re.compile(f"^{''.join(parts)}$")


@dataclass(frozen=True)
class Route:
    """One route of the Hub API: its methods, its path template, the handler method that
    answers it, whether it names a repo that must be readable (``read``) or writable
    (``write``), whether it writes without naming one in its path (``auth``), or is authorized
    by the signature of its URL (``signed``: an LFS upload, which the client sends without a
    token); all are checked before a byte of the body is read. ``body``: the parser of
    :mod:`._bodies` its body goes through (the handler gets the typed result as ``body``);
    :data:`STREAM` for a body the handler streams itself; None for a route that reads none."""

    methods: tuple[str, ...]
    template: str
    handler: str
    repo: str | None = None
    auth: bool = False
    body: Callable[[bytes, str], Any] | str | None = None
    signed: bool = False
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", _compile(self.template))

    def placeholders(self) -> list[str]:
        """The placeholders of the template, in order."""
        return [token["name"] for token in _TEMPLATE.finditer(self.template) if token["name"]]

    def path(self, **values: str) -> str:
        """The template filled with ``values`` (already URL-quoted): an optional part is kept
        when it has placeholders and all of them have values. The sweep tests build their
        requests with it, so a new route is swept as it is declared."""
        out: list[str] = []
        section: list[str] | None = None
        named: list[str] = []
        for token in _TEMPLATE.finditer(self.template):
            if token["open"]:
                section, named = [], []
            elif token["close"]:
                if named and all(values.get(name) is not None for name in named):
                    out.extend(section or [])
                section = None
            elif token["name"] and section is not None:
                named.append(token["name"])
                section.append(values.get(token["name"]) or "")
            else:
                piece = values[token["name"]] if token["name"] else token[0]
                (out if section is None else section).append(piece)
        return "".join(out)


#: A route whose handler streams its body itself (an LFS upload, to disk).
STREAM = "stream"


def _route(methods: str, template: str, handler: str, repo: str | None = None,
           auth: bool = False, body: Callable[[bytes, str], Any] | str | None = None,
           signed: bool = False) -> Route:
    return Route(tuple(methods.split("|")), template, handler, repo, auth, body, signed)


_REPO = "/api/{kind}/{namespace}/{name}"
_FILES = "/[{datasets}/]{namespace}/{name}"

#: The Hub surface this endpoint serves, in matching order. Ids and paths arrive URL-quoted;
#: handlers get them unquoted and parsed (SEGMENTS), bodies parsed (``body``).
ROUTES = (
    _route("POST", "/api/repos/create", "_create_repo", auth=True, body=bodies.create_repo),
    _route("DELETE", "/api/repos/delete", "_delete_repo", auth=True, body=bodies.delete_repo),
    _route("POST", "/api/repos/move", "_move_repo", auth=True, body=bodies.move_repo),
    _route("POST", "/api/validate-yaml", "_validate_yaml", auth=True, body=bodies.validate_yaml),
    _route("GET", "/api/whoami-v2", "_whoami"),
    _route("GET", "/api/{kind}", "_list_repos"),
    _route("PUT", "/lfs/upload/{kind}/{namespace}/{name}/{oid}", "_lfs_upload", body=STREAM,
           signed=True),
    _route("POST", "/lfs/verify/{kind}/{namespace}/{name}/{oid}", "_lfs_verify",
           body=bodies.lfs_verify, signed=True),
    _route("POST", _FILES + ".git/info/lfs/objects/batch", "_lfs_batch", "write",
           body=bodies.lfs_batch),
    _route("GET", _REPO + "[/]", "_repo_info", "read"),
    _route("GET", _REPO + "/revision/{revision*}", "_repo_info", "read"),
    _route("GET", _REPO + "/refs", "_refs", "read"),
    _route("POST", _REPO + "/preupload/{revision*}", "_preupload", "write", body=bodies.preupload),
    _route("POST", _REPO + "/commit/{revision*}", "_commit", "write", body=bodies.commit),
    _route("POST", _REPO + "/tag/{revision*}", "_create_tag", "write", body=bodies.new_tag),
    _route("POST", _REPO + "/branch/{branch*}", "_create_branch", "write",
           body=bodies.new_branch),
    _route("DELETE", _REPO + "/{ref_kind}/{ref*}", "_delete_ref", "write"),
    _route("GET", _REPO + "/tree/{revision}[/{path}]", "_tree", "read"),
    _route("POST", _REPO + "/paths-info/{revision*}", "_paths_info", "read",
           body=bodies.paths_info),
    _route("GET", _REPO + "/commits[/{revision*}]", "_commits", "read"),
    _route("GET", _REPO + "/discussions", "_discussions", "read"),
    _route("POST", _REPO + "/discussions", "_create_discussion", "write",
           body=bodies.new_discussion),
    _route("GET", _REPO + "/discussions/{num}", "_discussion", "read"),
    _route("POST", _REPO + "/discussions/{num}/comment", "_comment", "write",
           body=bodies.new_comment),
    _route("POST", _REPO + "/discussions/{num}/title", "_rename", "write", body=bodies.new_title),
    _route("POST", _REPO + "/discussions/{num}/status", "_set_status", "write",
           body=bodies.new_status),
    _route("POST", _REPO + "/discussions/{num}/merge", "_merge", "write", body=bodies.merge),
    _route("POST", _REPO + "/discussions/{num}/comment/{event}/edit", "_edit_comment", "write",
           body=bodies.edited_comment),
    _route("PUT", _REPO + "/settings", "_settings", "write", body=bodies.repo_settings),
    _route("GET", _REPO + "/auth-check", "_auth_check", "read"),
    _route("GET|POST", _REPO + "/{xet}", "_no_xet", "read"),
    _route("GET|POST|PUT|DELETE", "/api/{kind}/{namespace}[/]", "_no_namespace"),
    _route("GET|HEAD", _FILES + "/resolve/{revision}/{path*}", "_resolve", "read"),
)
#: Any path of a repo (or one named like one: ``/api/models/missing_repo_id/like``): a route
#: of a repo that is not here still answers RepoNotFound.
_REPO_PREFIX = _compile(_REPO + "[/{path}]")
#: A file of a repo id without a namespace (``/gpt2/resolve/main/x``): no such repo here.
_NO_NAMESPACE_FILE = _compile("/[{datasets}/]{name}/resolve/{path}")
#: Largest request body read into memory (commits carry regular files, base64); LFS uploads
#: stream to disk and are limited by their signed size instead.
MAX_BODY_BYTES = 64 * 1024 * 1024
#: Most files one preupload request names (both clients send 256 at a time), and most bytes of
#: patterns a ``.gitignore`` or ``.gitattributes`` it honours may hold: with the patterns
#: compiled into one expression, a preupload costs at most this many matches of it.
MAX_PREUPLOAD_FILES = 1_000
MAX_PATTERNS_BYTES = 64 * 1024
#: Most work one preupload's patterns cost: (patterns) x (characters of the paths), a match
#: scanning a path once per pattern (~6 ns each), plus PATTERN_CHAR_WORK per character of the
#: distinct patterns, compiling them (~9 us each, pure Python: 128 KiB of patterns once cost
#: 1.3 s of CPU uncounted); about 0.3 s of CPU in all. A .gitignore of 1,000 lines (15,000
#: characters) and the client's 256 paths of 60 characters take 15,616,000 + 22,500,000.
MAX_MATCH_WORK = 40_000_000
PATTERN_CHAR_WORK = 1_500
#: Largest unread body drained to keep a connection; beyond it the connection is closed.
MAX_DRAIN_BYTES = 1024 * 1024
#: Bytes of bodies read into memory that all requests hold at once, beyond the first
#: SMALL_BODY_BYTES of each (a commit of small files is never kept waiting): a request holds its
#: share from the body's first byte until its answer is sent, so bodies never finished hold at
#: most this much in all (each was once bounded alone: 256 connections could hold 16 GiB). A
#: body that does not fit waits up to BODY_BUDGET_WAIT seconds for the share others free, then
#: is refused (503, Retry-After); one client (an address) holds at most MAX_BODY_BYTES of it,
#: so a second client's large commit is read beside the first's.
MAX_BODIES_BYTES = 128 * 1024 * 1024
SMALL_BODY_BYTES = 1024 * 1024
BODY_BUDGET_WAIT = 10.0
#: Connections served at once (a thread each); more wait, without a thread, for one to end.
MAX_CONNECTIONS = 256
#: Connections one client (an address) is served at once, uploads among them: its others wait
#: their turn without a thread, so one client cannot take the endpoint's threads, and 64
#: hostile clients holding one each leave most of them to everyone else. When a thread ends,
#: the waiting connection of the client served least goes first.
MAX_CLIENT_CONNECTIONS = 16
#: Connections waiting for a thread, for one client and in all; beyond, a new one is closed.
MAX_CLIENT_WAITING = 4 * MAX_CLIENT_CONNECTIONS
MAX_WAITING = 1024
#: Descriptors a served connection may use (its socket, a blob or temp file, the root's lock)
#: and a waiting one (its socket); DESCRIPTOR_MARGIN are kept for everything else. At start the
#: soft RLIMIT_NOFILE is raised to the hard one where allowed, and served + waiting connections
#: are lowered until they fit below it with the margin: connections never exhaust descriptors
#: (idle ones once took all 1024 of a stock limit; then every `open` failed).
SERVED_DESCRIPTORS = 3
DESCRIPTOR_MARGIN = 64
#: Seconds the accept loop pauses when the process is out of descriptors anyway (EMFILE): it
#: once retried at once, a core at 100%.
ACCEPT_PAUSE = 0.1
#: Seconds a new connection may stay silent (no byte of its first request) while connections
#: wait for a thread: then it is closed, as an idle keep-alive connection is, so connections
#: that never send hold no thread a real request waits for (a client sends its request at
#: once).
SILENT_WHEN_CROWDED = 1.0
#: The rate floor of an upload and of a download (the low-speed rule of cubepack's own client,
#: curl's --speed-limit/--speed-time): a transfer that moves fewer than LOW_SPEED_LIMIT bytes/s
#: over a window of LOW_SPEED_TIME seconds is dropped, whatever size it announced (an upload's
#: deadline once was its size at 1 MiB/s: 12 days for 1 TiB sent a byte a second).
LOW_SPEED_LIMIT = constants.DEFAULT_LOW_SPEED_LIMIT
LOW_SPEED_TIME = constants.DEFAULT_LOW_SPEED_TIME
#: Largest object an upload may announce (the Hub's own limit per file is 50 GB); a larger one
#: is refused in the LFS batch answer, before any byte is sent.
MAX_UPLOAD_BYTES = 50 * 1024**3
#: Seconds a connection has for a request's line and headers (under 8 KiB, which a live client
#: sends in one packet): a client trickling them cannot hold one of the MAX_CONNECTIONS threads.
HEAD_TIMEOUT = 10.0
#: Seconds an idle keep-alive connection waits for its next request: longer than the 5 s after
#: which huggingface_hub 2.x drops idle connections itself, so it never reuses one we are
#: closing (0.36 checks a pooled socket before reusing it).
IDLE_TIMEOUT = 8.0
#: A body read into memory (a commit's, at most MAX_BODY_BYTES) must arrive within
#: BODY_TIMEOUT + its length / MIN_BODY_RATE seconds: 8 Mbit/s, far below loopback or a LAN, so
#: the memory it takes is held a bounded time. An upload streams to disk under the rate floor.
BODY_TIMEOUT = 10.0
MIN_BODY_RATE = 1024 * 1024
#: Seconds between an idle keep-alive connection's looks at whether connections wait.
IDLE_CHECK = 0.25
#: Seconds between a download's looks at what its client received, for the rate floor.
FLOOR_CHECK = 0.25
#: Seconds one write of an answer may block on a client that stopped reading.
WRITE_TIMEOUT = 60.0
#: Longest chunk-size or trailer line of a chunked body.
_MAX_CHUNK_LINE = 1024
#: Bodies are read in pieces of at most this size.
_READ_SIZE = 1024 * 1024
_BINARY_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".pickle", ".pkl", ".npy",
                    ".adapter", ".h5", ".msgpack", ".zip", ".tar", ".gz")
LFS_THRESHOLD = 64 * 1024


class LocalHub:
    """A local Hub endpoint serving ``root`` on ``host:port`` (port 0 picks a free one).

    Args:
        tokens: accepted bearer tokens. When given, writes and private reads need one of them;
            when empty, anyone who can reach the port may write (bind to loopback!), and no repo
            can be private: none is created or made private, and one already private is served
            to nobody (a made-up token reads no more than no token).
        log: called with one line per request (client, method, path, status) and per dropped
            connection; None: silent.
        user: the account ``whoami`` reports and the namespace of repos created without one.
        head_timeout, idle_timeout, body_timeout, min_body_rate, write_timeout: the deadlines
            (see :data:`HEAD_TIMEOUT` and the others); a request that misses one is dropped.
        low_speed_limit, low_speed_time: the rate floor of uploads and downloads (see
            :data:`LOW_SPEED_LIMIT`); 0 turns it off.
        max_body_bytes: largest request body read into memory.
        max_upload_bytes: largest object an upload may announce.
        max_connections, max_client_connections: connections served at once, in all and for
            one client address (see :data:`MAX_CONNECTIONS`).
        max_bodies_bytes: bytes of bodies read into memory held at once by all requests
            (see :data:`MAX_BODIES_BYTES`).
        list_page_size: repos one page of the list API holds (the Hub's 1,000; tests page
            with fewer).
    """

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 0,
                 tokens: list[str] | None = None, log: Callable[[str], None] | None = None,
                 user: str = "local", *, head_timeout: float = HEAD_TIMEOUT,
                 idle_timeout: float = IDLE_TIMEOUT, body_timeout: float = BODY_TIMEOUT,
                 min_body_rate: float = MIN_BODY_RATE, write_timeout: float = WRITE_TIMEOUT,
                 low_speed_limit: float = LOW_SPEED_LIMIT,
                 low_speed_time: float = LOW_SPEED_TIME,
                 max_body_bytes: int = MAX_BODY_BYTES, max_upload_bytes: int = MAX_UPLOAD_BYTES,
                 max_connections: int = MAX_CONNECTIONS,
                 max_client_connections: int = MAX_CLIENT_CONNECTIONS,
                 max_bodies_bytes: int = MAX_BODIES_BYTES, list_page_size: int = PAGE_SIZE):
        for index, token in enumerate(tokens or [], 1):  # never echoed: it may be a secret
            if problem := token_problem(token):
                raise UsageError(f"Token {index} (--token) is refused: {problem}.")
        self.store = HubStore(root)
        self.tokens = set(tokens or [])
        self.log = log
        self.user = user
        self.head_timeout, self.idle_timeout = head_timeout, idle_timeout
        self.body_timeout, self.min_body_rate = body_timeout, min_body_rate
        self.write_timeout, self.max_body_bytes = write_timeout, max_body_bytes
        self.floor = _Floor(low_speed_limit, low_speed_time) if low_speed_limit > 0 else None
        self.bodies = _BodyBudget(max(max_bodies_bytes, max_body_bytes), max_body_bytes)
        self.max_upload_bytes = max_upload_bytes
        self.list_page_size = list_page_size
        self._secret = secrets.token_bytes(32)
        self.store.serve()  # refused when another process serves the root
        max_connections, max_waiting, claim = _fit_descriptors(max_connections, MAX_WAITING)
        # What this endpoint's connections may use is the process's until it stops (or is
        # collected): the endpoints of one process share its descriptors.
        self._release_descriptors = weakref.finalize(self, _DESCRIPTORS.release, claim)
        try:
            self._httpd = _BoundedServer((host, port), _handler_for(self), max_connections,
                                         max_client_connections, max_waiting)
        except BaseException:
            self._release_descriptors()
            self.store.close()
            raise
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None
        self._serving = False

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> LocalHub:
        self._serving = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="cubepack-hub",
                                        daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._serving = True
        self._httpd.serve_forever()

    def stop(self) -> None:
        try:
            # shutdown() waits for the serving loop to end: an endpoint never started has
            # none, and its stop() waited forever.
            if self._serving:
                self._httpd.shutdown()
            self._httpd.server_close()
        finally:
            self._release_descriptors()
            self.store.close()

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- hooks (see cubepack.testing.hub) --------------------------------------------------------
    def before_request(self, handler: _Handler, method: str, path: str) -> bool:
        """Called first for every request; return False when the request was answered here."""
        return True

    def send_file(self, handler: _Handler, handle: Any, offset: int, count: int) -> None:
        """Send ``count`` bytes of an open blob from ``offset``: the kernel copies page cache
        to the socket (sendfile), no bytes pass through Python; held to the rate floor."""
        sock, end = handler.connection, offset + count
        window = self.floor.window((handler.client_address[0], "download")) \
            if self.floor else None
        handed = judged = 0  # bytes given to the kernel; bytes the client took of them
        try:
            while offset < end:
                piece = min(end - offset, _READ_SIZE)
                if window is not None:
                    sock.settimeout(min(max(window.left(), 0.001), FLOOR_CHECK))
                handle.seek(offset)
                try:
                    sent = sock.sendfile(handle, offset=offset, count=piece)
                except TimeoutError:  # no room in the send buffer for a while: what moved?
                    sent = handle.tell() - offset
                offset += sent
                handed += sent
                if window is not None:
                    # The floor judges what the client received: the kernel takes megabytes
                    # into a send buffer at once and wakes a sender only when half of it is
                    # free, so bytes handed to it said nothing of a client reading meanwhile.
                    taken = handed - _unsent(sock)
                    if taken > judged:
                        window.moved(taken - judged, "answer")
                        judged = taken
                    else:
                        window.moved(0, "answer")
        finally:
            if window is not None:
                window.close()
            sock.settimeout(self.write_timeout)

    def count_upload(self, key: str, size: int) -> None:
        """Called for every uploaded chunk (``lfs:<oid>``, ``file:<path>``, ``path:<path>``)."""

    def count_commit(self) -> None:
        """Called after every commit."""

    def connection_changed(self, delta: int) -> None:
        """Called when a connection starts (+1) or stops (-1) holding a thread."""

    def waiting_connections(self) -> int:
        """Connections accepted and waiting for a thread (their client's, or any)."""
        return self._httpd.waiting_count()

    def sign(self, repo: RepoRef, oid: str, size: int) -> str:
        """The signature of an upload of ``oid`` (``size`` bytes) for ``repo``."""
        message = f"{repo.kind}/{repo.namespace}/{repo.name}:{oid}:{size}"
        return hmac.new(self._secret, message.encode(), hashlib.sha256).hexdigest()

    def valid_token(self, token: str | None) -> bool:
        """Whether ``token`` is one of the endpoint's (never, when it has none; never an empty
        one, which no endpoint takes)."""
        return bool(token) and any(hmac.compare_digest(token.encode("utf-8", "replace"),
                                                             known.encode())
                                         for known in self.tokens)

    def authorized(self, token: str | None) -> bool:
        """Whether ``token`` may write: any request when the endpoint has no tokens."""
        return not self.tokens or self.valid_token(token)

    def may_read(self, repo: RepoRef, token: str | None) -> bool:
        """Whether a request with ``token`` reads ``repo`` (which exists): a public repo, or a
        private one with a valid token."""
        return not self.store.is_private(repo) or self.valid_token(token)


class _Claims:
    """Descriptors the running endpoints of this process may use for their connections: each
    endpoint fits its connections to what the others left (two once each sized theirs to
    everything free, together past the process's limit)."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.claimed = 0

    def release(self, count: int) -> None:
        with self.guard:
            self.claimed -= count


_DESCRIPTORS = _Claims()


def _fit_descriptors(served: int, waiting: int) -> tuple[int, int, int]:
    """(served, waiting) connections lowered to fit the process's descriptors (see
    :data:`SERVED_DESCRIPTORS`), after raising the soft limit to the hard one where allowed,
    beside what the process's other running endpoints claimed; and the descriptors they claim
    (released by ``_DESCRIPTORS.release`` when the endpoint stops)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows: no such limit
        return served, waiting, 0
    with _DESCRIPTORS.guard:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
                soft = wanted
        if soft == resource.RLIM_INFINITY:
            return served, waiting, 0
        try:
            in_use = len(os.listdir("/proc/self/fd"))
        except OSError:
            in_use = 32
        free = max(0, soft - in_use - DESCRIPTOR_MARGIN - _DESCRIPTORS.claimed)
        served = max(1, min(served, free // (SERVED_DESCRIPTORS + 1)))
        waiting = max(0, min(waiting, free - SERVED_DESCRIPTORS * served))
        claim = SERVED_DESCRIPTORS * served + waiting
        _DESCRIPTORS.claimed += claim
        return served, waiting, claim


def _unsent(sock: socket.socket) -> int:
    """Bytes of ``sock``'s send queue its peer has not acknowledged (SIOCOUTQ); 0 where the
    system does not say (the floor then judges bytes handed to the kernel)."""
    try:
        import fcntl
        import termios

        queued = bytearray(4)
        fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, queued)
        return int.from_bytes(queued, sys.byteorder, signed=True)
    except (ImportError, OSError, AttributeError):  # pragma: no cover - not Linux
        return 0


def token_problem(token: object) -> str | None:
    """Why ``token`` cannot be one of the endpoint's, or None: a bearer token is printable
    ASCII without spaces (RFC 6750), and never empty, which anyone can send (``Bearer `` with
    nothing after it) and an unset variable gives (``--token "$UNSET"``)."""
    if not isinstance(token, str) or not token:
        return ("it is empty, which anyone can send: give each --token a value (an unset "
                "variable gives an empty one)")
    if not all("!" <= ch <= "~" for ch in token):
        return ("a bearer token is printable ASCII without spaces or control characters: "
                "choose one that is (e.g. `openssl rand -hex 32`)")
    return None


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection served: at most ``limit`` at once, and ``per_client`` for one
    client address. A connection beyond either waits, accepted but without a thread, and is
    served when one ends: first the waiting connection whose client is served least (so a
    client that holds many waits behind one that holds none), oldest first. Bounded waiting:
    beyond :data:`MAX_CLIENT_WAITING` for a client or ``waiting`` in all, a new connection is
    closed at once; out of descriptors anyway, the accept loop pauses instead of spinning."""

    daemon_threads = True
    request_queue_size = 128  # the accept loop never blocks: only bursts queue in the kernel

    def __init__(self, address: Any, handler: Any, limit: int, per_client: int,
                 waiting: int = MAX_WAITING):
        # Before the socket is bound: a bind that fails (a port in use) closes the server at
        # once, and server_close reads these.
        self.limit, self.per_client, self.max_waiting = limit, per_client, waiting
        self._guard = threading.Lock()
        self._served: dict[str, int] = {}
        self._total = 0
        self._waiting: dict[str, list[tuple[Any, Any]]] = {}
        self._waiting_total = 0
        super().__init__(address, handler)

    def get_request(self) -> Any:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                time.sleep(ACCEPT_PAUSE)  # the socket stays readable: never spin on it
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        client = client_address[0]
        with self._guard:
            if self._total < self.limit and self._served.get(client, 0) < self.per_client:
                self._start(request, client_address)
                return
            queue = self._waiting.setdefault(client, [])
            if len(queue) < MAX_CLIENT_WAITING and self._waiting_total < self.max_waiting:
                queue.append((request, client_address))
                self._waiting_total += 1
                return
            if not queue:
                del self._waiting[client]
        self.shutdown_request(request)  # too many waiting already: closed, unanswered
        log = getattr(self.RequestHandlerClass, "hub").log
        if log is not None:
            log(f'{client} "-" dropped: too many connections from this client waiting')

    def _start(self, request: Any, client_address: Any) -> None:
        """Caller holds ``_guard``."""
        client = client_address[0]
        self._served[client] = self._served.get(client, 0) + 1
        self._total += 1
        thread = threading.Thread(target=self.process_request_thread,
                                  args=(request, client_address), daemon=True)
        try:
            thread.start()
        except BaseException:
            self._ended(client)
            self.shutdown_request(request)
            raise

    def _ended(self, client: str) -> None:
        """Caller holds ``_guard``: a connection of ``client`` ended; serve the next waiting."""
        self._total -= 1
        self._served[client] -= 1
        if not self._served[client]:
            del self._served[client]
        ready = [other for other, queue in self._waiting.items()
                 if queue and self._served.get(other, 0) < self.per_client]
        if ready and self._total < self.limit:
            chosen = min(ready, key=lambda other: self._served.get(other, 0))
            queue = self._waiting[chosen]
            request, address = queue.pop(0)
            if not queue:
                del self._waiting[chosen]
            self._waiting_total -= 1
            self._start(request, address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._guard:
                self._ended(client_address[0])

    def waiting_count(self) -> int:
        with self._guard:
            return self._waiting_total

    def crowded(self) -> bool:
        """Whether connections wait for a thread: then an answer closes its connection, so an
        idle keep-alive connection holds no thread another client waits for."""
        return self._waiting_total > 0

    def handle_error(self, request: Any, client_address: Any) -> None:
        """What escaped a connection's handler (a client gone while its answer was written):
        one log line, never a traceback on the console."""
        error = sys.exc_info()[1]
        log = getattr(self.RequestHandlerClass, "hub").log
        if log is not None:
            log(f'{client_address[0]} "-" dropped: {type(error).__name__}: '
                f'{shown(str(error), 200)}')

    def server_close(self) -> None:
        super().server_close()
        with self._guard:
            waiting = [request for queue in self._waiting.values() for request, _ in queue]
            self._waiting.clear()
            self._waiting_total = 0
        for request in waiting:
            self.shutdown_request(request)


class _BodyBudget:
    """The memory of bodies read into memory, shared by every request (see
    :data:`MAX_BODIES_BYTES`): ``total`` bytes in all, ``per_client`` for one address."""

    def __init__(self, total: int, per_client: int):
        self.total, self.per_client = total, per_client
        self._guard = threading.Condition()
        self._held = 0
        self._by_client: dict[str, int] = {}
        self._waiting: dict[str, set[tuple[float, int]]] = {}  # (since, number) of waiters
        self._numbers = itertools.count()

    def reserve(self, client: str, count: int, wait: float, since: float = 0.0) -> bool:
        """Take ``count`` bytes for ``client``, waiting up to ``wait`` seconds for them; False
        when they never fit (more than a client's share never does). ``since``: when the
        request's body began. A request waits for its client's own share only while no older
        request of that client waits for it too: two bodies of one client, each holding part
        of its share and waiting for the rest, would wait each other out; the younger gives up
        (503) and the older is read."""
        if count <= 0:
            return True
        me = (since, next(self._numbers))

        def fits() -> bool:
            return (self._held + count <= self.total
                    and self._by_client.get(client, 0) + count <= self.per_client)

        def yields() -> bool:
            return self._by_client.get(client, 0) + count > self.per_client and any(
                other < me for other in self._waiting.get(client, ()))

        with self._guard:
            if count > self.per_client:
                return False
            waiting = self._waiting.setdefault(client, set())
            waiting.add(me)
            self._guard.notify_all()  # a younger request of this client may now give up
            try:
                if not self._guard.wait_for(lambda: fits() or yields(), wait) or not fits():
                    return False
            finally:
                waiting.discard(me)
                if not waiting:
                    del self._waiting[client]
            self._held += count
            self._by_client[client] = self._by_client.get(client, 0) + count
            return True

    def release(self, client: str, count: int) -> None:
        if count <= 0:
            return
        with self._guard:
            self._held -= count
            left = self._by_client.get(client, 0) - count
            if left > 0:
                self._by_client[client] = left
            else:
                self._by_client.pop(client, None)
            self._guard.notify_all()

    def held(self) -> int:
        with self._guard:
            return self._held


class _Floor:
    """The rate floor: fewer than ``limit`` bytes/s over a window of ``seconds`` is a stall.
    A client's transfers in one direction (by address: its uploads, its downloads) are judged
    together, as the client judges a push or a pull whole: its parallel requests share one
    link, each moving a share of its rate, and a link above the floor never stalls however
    many share it."""

    def __init__(self, limit: float, seconds: float):
        self.limit, self.seconds = limit, seconds
        self._guard = threading.Lock()
        self._groups: dict[Any, _Group] = {}

    def window(self, key: Any = None) -> _Window:
        """A transfer's window: in the group of ``key``'s transfers in progress (None: alone).
        Close it when the transfer ends."""
        with self._guard:
            group = self._groups.get(key) if key is not None else None
            if group is None:
                group = _Group(self, key)
                if key is not None:
                    self._groups[key] = group
            elif time.monotonic() - group.opened >= self.seconds and \
                    group.count < self.limit * self.seconds:
                # Its window stalled, and its transfers are dropped at their next look; this
                # one starts a new window instead of being judged by one it had no part in.
                group.stalled, group.count = group.count, 0
                group.generation += 1
                group.opened = time.monotonic()
            group.members += 1
            return _Window(group)

    def _left(self, group: _Group) -> None:
        with self._guard:
            group.members -= 1
            if not group.members and self._groups.get(group.key) is group:
                del self._groups[group.key]


class _Group:
    """Transfers judged together: a window opens; each time they have moved ``limit *
    seconds`` bytes in all a new one opens; a window still open after ``seconds`` has stalled,
    and every transfer that was in it is dropped (a later one starts a new window)."""

    def __init__(self, floor: _Floor, key: Any):
        self.floor, self.key = floor, key
        self.members = 0
        self.opened, self.count, self.generation = time.monotonic(), 0, 0
        self.stalled = 0  # bytes the last stalled window moved


class _Window:
    """One transfer's view of its group's window."""

    def __init__(self, group: _Group):
        self._group, self._floor = group, group.floor
        self._generation = group.generation
        self._closed = False

    def left(self) -> float:
        """Seconds until the open window is judged (0: it stalled)."""
        with self._floor._guard:
            if self._generation != self._group.generation:
                return 0.0
            return self._group.opened + self._floor.seconds - time.monotonic()

    def moved(self, count: int, phase: str) -> None:
        """Count ``count`` bytes moved; raise :class:`RequestDeadline` if the window stalled."""
        floor, group = self._floor, self._group
        with floor._guard:
            if self._generation != group.generation:  # judged stalled by another transfer
                raise RequestDeadline(phase, floor.seconds, stalled=(group.stalled, floor))
            group.count += count
            now = time.monotonic()
            if group.count >= floor.limit * floor.seconds:
                group.opened, group.count = now, 0
            elif now - group.opened >= floor.seconds:
                group.stalled = group.count
                group.generation += 1
                group.opened, group.count = now, 0
                raise RequestDeadline(phase, floor.seconds, stalled=(group.stalled, floor))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._floor._left(self._group)


class RequestDeadline(Exception):
    """A request, or the wait for the next one, missed its deadline, or a transfer fell below
    the rate floor (``stalled``: bytes moved in the window, and the floor), or the client went
    away mid-request (``gone``): the connection is dropped, with one log line."""

    def __init__(self, phase: str, seconds: float = 0.0,
                 stalled: tuple[int, _Floor] | None = None, gone: str | None = None):
        if gone is not None:
            text = gone
        elif stalled is not None:
            count, floor = stalled
            text = (f"{phase} moved {count} byte{'s' if count != 1 else ''} in "
                    f"{floor.seconds:g} s (under {floor.limit:g} bytes/s)")
        else:
            text = f"{phase} not received within {seconds:g} s"
        super().__init__(text)
        self.phase = phase


class _DeadlineReader(io.RawIOBase):
    """The socket's read side against one deadline at a time. Each read may block only until
    the deadline (a socket timeout alone restarts with every byte, so a byte every few seconds
    would hold the connection forever); writes keep their own timeout."""

    def __init__(self, sock: socket.socket, write_timeout: float):
        super().__init__()
        self._sock, self._write_timeout = sock, write_timeout
        self.phase, self.seconds, self.deadline = "request head", 0.0, math.inf
        self._then: tuple[str, float] | None = None
        self._window: _Window | None = None
        #: Whether connections wait for a thread (the server's): an idle keep-alive connection
        #: then closes instead of holding its thread for the rest of ``idle_timeout``, and so
        #: does a new one silent for SILENT_WHEN_CROWDED seconds.
        self.crowded: Callable[[], bool] | None = None
        #: When a new connection was accepted, until its first byte arrives (None after).
        self.silent_since: float | None = None

    def expect(self, phase: str, seconds: float, then: tuple[str, float] | None = None,
               floor: _Floor | None = None, group: Any = None) -> None:
        """From now, ``phase`` must arrive within ``seconds``; with ``then``, the first byte
        starts that (phase, seconds) deadline instead (an idle connection's next request);
        with ``floor``, each window of it must also move its bytes (together with the other
        transfers of ``group``)."""
        self.phase, self.seconds, self._then = phase, seconds, then
        self.deadline = time.monotonic() + seconds
        self.end_window()
        self._window = floor.window(group) if floor is not None else None

    def end_window(self) -> None:
        """The transfer judged by the floor ended: it leaves its group."""
        if self._window is not None:
            self._window.close()
            self._window = None

    def allow(self, seconds: float) -> None:
        """Extend the current deadline (a chunked body, as each chunk's size arrives)."""
        self.seconds += seconds
        self.deadline += seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        window = self._window
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise RequestDeadline(self.phase, self.seconds)
            if window is not None:
                remaining = min(remaining, max(window.left(), 0.001))
            idle = self.phase == "next request" and self.crowded is not None
            silent = self.silent_since is not None and self.crowded is not None
            if idle or silent:  # look up now and then: an idle connection yields to waiting ones
                remaining = min(remaining, IDLE_CHECK)
            self._sock.settimeout(remaining)
            try:
                count = self._sock.recv_into(buffer)
                break
            except TimeoutError:
                if window is not None and window.left() <= 0:
                    window.moved(0, self.phase)  # raises: the window stalled
                if idle and self.crowded():
                    raise RequestDeadline(self.phase, self.seconds) from None  # closed quietly
                if silent and self.crowded() and \
                        time.monotonic() - self.silent_since >= SILENT_WHEN_CROWDED:
                    raise RequestDeadline("first request", SILENT_WHEN_CROWDED) from None
            except ConnectionError as exc:
                raise RequestDeadline(self.phase, gone=f"{self.phase}: the client went away "
                                                       f"({type(exc).__name__})") from None
            finally:
                self._sock.settimeout(self._write_timeout)
        if count:
            self.silent_since = None
        if window is not None:
            window.moved(count, self.phase)
        if count and self._then is not None:
            self.expect(*self._then)
        return count


def _handler_for(hub: LocalHub) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.hub = hub
    return Handler


class _Handler(BaseHTTPRequestHandler):
    hub: LocalHub
    protocol_version = "HTTP/1.1"
    server_version = "cubepack-localhub/1"

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # reads go through the deadline instead
        self._reader = _DeadlineReader(self.connection, self.hub.write_timeout)
        self._reader.crowded = self.server.crowded
        self.rfile = io.BufferedReader(self._reader)
        self.connection.settimeout(self.hub.write_timeout)
        # An answer goes out as two writes (headers, then body): with Nagle's algorithm the
        # second waits for the client's delayed ACK of the first, 40 ms per answer on a
        # keep-alive connection. Send each write at once.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._served = 0
        self.hub.connection_changed(+1)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.hub.connection_changed(-1)

    def handle_one_request(self) -> None:
        """One request, within its deadlines: the first on a connection must arrive within
        ``head_timeout``; a later one must start within ``idle_timeout``, then take at most
        ``head_timeout``. A request that misses a deadline is dropped: connection closed,
        one log line (a keep-alive connection that simply stays idle closes silently)."""
        hub = self.hub
        if self._served:
            self._reader.expect("next request", hub.idle_timeout,
                                then=("request head", hub.head_timeout))
        else:
            self._reader.expect("request head", hub.head_timeout)
            self._reader.silent_since = time.monotonic()
        self.requestline, self.command, self.path = "", None, None  # never the last request's
        try:
            super().handle_one_request()
        except RequestDeadline as missed:
            self.close_connection = True
            if missed.phase not in ("next request", "first request") and hub.log is not None:
                hub.log(f'{self.client_address[0]} "{_header_text(self.requestline or "-")}" '
                        f'dropped: {missed}')
        self._served += 1

    def send_response(self, code: int, message: str | None = None) -> None:
        """Every answer names a request id, as the Hub's do (the client quotes it in errors)."""
        super().send_response(code, message)
        self.send_header("X-Request-Id", secrets.token_hex(12))

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the stdlib's own lines go to stderr unformatted; we log requests ourselves

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        if self.hub.log is not None:  # a malformed request line has no command and path
            what = f"{self.command} {self.path}" if self.path else self.requestline or "-"
            # The request line is the client's: escaped, no terminal control sequence reaches
            # the log of ``cubepack hub serve``.
            self.hub.log(f'{self.client_address[0]} "{_header_text(what)}" {code}')

    # --- plumbing --------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        # One handler serves every request of a keep-alive connection: reset per request.
        self._body_read = False
        self._id_span: tuple[int, int] | None = None  # where the path names its repo
        self._form_expand = False
        self._reserved = 0  # of hub.bodies, released once this request is answered
        self._body_since: float | None = None  # when its body's first share was asked for
        self.route: Route | None = None
        split = urlsplit(self.path)
        self.query = parse_qs(split.query)
        path = split.path
        if not self.hub.before_request(self, method, path):
            return
        try:
            self._answer(method, path)
        finally:
            self._reader.end_window()
            self.hub.bodies.release(self.client_address[0], self._reserved)
            self._reserved = 0

    def _answer(self, method: str, path: str) -> None:
        try:
            # Checked first, on every route (RFC 9112: a 400, the connection's last answer):
            # a route that reads no body would otherwise leave it to be read as a request.
            self._declared_length()
            self._route(method, path)
        except StoreError as exc:
            try:
                self._drain()
                self._send_error(exc.status, str(exc), exc.code, exc.headers)
            except OSError:  # the client went away before its answer: logged once, above
                self.close_connection = True
        except RequestDeadline:
            raise  # dropped by handle_one_request, unanswered
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - a server must answer, not die
            # A bug, not the request's fault (those are StoreErrors): the log gets the details,
            # the client a sentence without them.
            if self.hub.log is not None:
                self.hub.log(f"{self.client_address[0]} \"{method} {shown(path)}\" failed: "
                             f"{type(exc).__name__}: {shown(str(exc), 300)}")
            try:
                self._drain()
                self._send_error(500, f"Internal error ({type(exc).__name__}); the endpoint's "
                                      "log has the details.")
            except OSError:
                self.close_connection = True

    def _token(self) -> str | None:
        header = self.headers.get("Authorization", "")
        return header[7:] if header.startswith("Bearer ") else None

    def _body(self) -> bytes:
        """The request body, at most ``max_body_bytes`` of it (else 413, connection closed)."""
        if getattr(self, "_body_read", False):
            return b""
        return b"".join(self._chunks(self._body_limit()))

    def _body_limit(self) -> int:
        """The largest body this request may have read into memory: on an endpoint with
        tokens, a request without a valid one (a read of a public repo, an upload's verify)
        has the free first SMALL_BODY_BYTES, never a share of the budget the team's commits
        need (two such requests once held it all)."""
        if self.hub.tokens and not self.hub.valid_token(self._token()):
            return min(self.hub.max_body_bytes, SMALL_BODY_BYTES)
        return self.hub.max_body_bytes

    def _declared_length(self) -> int:
        """The Content-Length, digits only (``int`` would also take ``-5``, `` 5`` and
        ``5_0``: a body whose end the client and this endpoint disagree on)."""
        declared = self.headers.get("Content-Length")
        if declared is None:
            return 0
        if not re.fullmatch(r"[0-9]{1,18}", declared):
            self.close_connection = True  # where this body ends is anyone's guess
            raise StoreError(400, f"Invalid Content-Length {shown(declared)}.")
        return int(declared)

    def _too_large(self, limit: int) -> StoreError:
        self.close_connection = True  # the rest of the body is never read
        return StoreError(413, f"Request body larger than {limit} bytes.")

    def _chunks(self, limit: int, *, upload: bool = False):
        """The request body in pieces of at most 1 MiB, never more than ``limit`` bytes in all:
        a declared length or chunk size beyond what is left is refused before it is read. A
        body read into memory must arrive within ``body_timeout`` + its length /
        ``min_body_rate``; an ``upload`` (streamed to disk) is held to the rate floor instead,
        whatever its size."""
        self._body_read = True
        hub = self.hub
        if upload:
            self._reader.expect("upload", math.inf, floor=hub.floor,
                                group=(self.client_address[0], "upload"))
            yield from self._read_exactly(self._upload_length(limit))
            return
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self._reader.expect("request body", hub.body_timeout)
            left = limit
            while True:
                size = self._chunk_size()
                if size == 0:
                    self._chunk_trailer()
                    return
                if size > left:
                    raise self._too_large(limit)
                self._reader.allow(size / hub.min_body_rate)
                yield from self._read_held(size, limit - left)
                left -= size
                if self.rfile.readline(_MAX_CHUNK_LINE) not in (b"\r\n", b"\n"):
                    self.close_connection = True
                    raise StoreError(400, "Malformed chunked body.")
        length = self._declared_length()
        if length > limit:
            raise self._too_large(limit)
        self._reader.expect("request body", hub.body_timeout + length / hub.min_body_rate)
        yield from self._read_held(length, 0)

    def _read_held(self, count: int, before: int):
        """``count`` bytes of a body read into memory, ``before`` bytes of it already read:
        each piece's share of the bodies' memory is held before the piece is read, so a
        request holds what it was sent (and one piece more), never what it announced."""
        while count > 0:
            piece = min(count, _READ_SIZE)
            self._hold_body(before + piece)
            yield from self._read_exactly(piece)
            before += piece
            count -= piece

    def _hold_body(self, length: int) -> None:
        """Hold this request's share of the bodies' memory for a body of ``length`` bytes so
        far (the first SMALL_BODY_BYTES are free), before they are read; when it does not fit,
        wait up to BODY_BUDGET_WAIT seconds for others to free it (the body's deadline moves
        by the wait), then 503 (the rest is never read: the connection closes)."""
        wanted = max(0, length - SMALL_BODY_BYTES) - self._reserved
        if wanted <= 0:
            return
        started = time.monotonic()
        if self._body_since is None:
            self._body_since = started
        held = self.hub.bodies.reserve(self.client_address[0], wanted, BODY_BUDGET_WAIT,
                                       self._body_since)
        self._reader.allow(time.monotonic() - started)
        if not held:
            self.close_connection = True
            raise StoreError(503, (
                f"The endpoint holds {self.hub.bodies.total} bytes of request bodies at most "
                f"(at most {self.hub.bodies.per_client} for one client) and they are in use: "
                "retry in a few seconds, or commit large files through LFS uploads, which go "
                "to disk."), headers={"Retry-After": "5"})
        self._reserved += wanted

    def _upload_length(self, size: int) -> int:
        """An upload's length: its signed ``size``, declared (not chunked: the clients send a
        length, and a length is what the floor and the cap are checked against)."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise StoreError(411, "An upload declares its Content-Length.")
        length = self._declared_length()
        if length > size:
            raise self._too_large(size)
        return length

    def _read_exactly(self, count: int):
        total = count
        while count > 0:
            piece = self.rfile.read(min(count, _READ_SIZE))
            if not piece:  # the client closed its side: nobody is waiting for an answer
                raise RequestDeadline(self._reader.phase, gone=(
                    f"{self._reader.phase} ended after {total - count} of {total} bytes (the "
                    "client went away)"))
            count -= len(piece)
            yield piece

    def _chunk_size(self) -> int:
        line = self.rfile.readline(_MAX_CHUNK_LINE + 1)
        match = re.fullmatch(rb"([0-9a-fA-F]{1,16})(;[^\r\n]*)?\r?\n", line)
        if match is None:
            self.close_connection = True
            raise StoreError(400, "Malformed chunk size in a chunked body.")
        return int(match.group(1), 16)

    def _chunk_trailer(self) -> None:
        for _ in range(64):  # trailer fields, then an empty line
            line = self.rfile.readline(_MAX_CHUNK_LINE + 1)
            if line in (b"\r\n", b"\n"):
                return
            if not line.endswith(b"\n"):
                break
        self.close_connection = True
        raise StoreError(400, "Malformed chunked body trailer.")

    def drain(self) -> None:
        """Read and discard the rest of the request body (so the connection can be reused)."""
        self._drain()

    def _drain(self) -> None:
        try:
            length = self._declared_length()
        except StoreError:  # no telling where the body ends: this answer is the last
            self.close_connection = True
            return
        if self._body_read or length > MAX_DRAIN_BYTES \
                or self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            # Never wait for bytes already consumed, nor read a large body only to discard it:
            # the answer goes out now and the connection closes.
            self.close_connection = True
            return
        try:
            for _ in self._chunks(MAX_DRAIN_BYTES):
                pass
        except (StoreError, OSError):  # draining a broken body is best effort
            self.close_connection = True

    def _send(self, status: int, body: bytes, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self._end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _end_headers(self) -> None:
        """End an answer's headers, closing its connection when connections wait for a thread
        (an idle keep-alive connection would hold one)."""
        if self.server.crowded():
            self.close_connection = True
        if self.close_connection:  # say so, or the client reuses a socket about to close
            self.send_header("Connection", "close")
        self.end_headers()

    def send_json(self, data: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(data).encode(), "application/json", headers)

    def _send_error(self, status: int, message: str, code: str | None = None,
                    headers: dict[str, str] | None = None) -> None:
        # A message may quote the request (a revision, a path): in a header, anything but
        # printable ASCII is escaped, so no CR/LF can add a header and no character can fail
        # the latin-1 encoding of http.server half-way through an answer. The body keeps it all.
        headers = {"X-Error-Message": _header_text(message), **(headers or {})}
        if code:
            headers["X-Error-Code"] = code
        self.send_json({"error": message}, status, headers)

    # --- routing ---------------------------------------------------------------------------------
    def _route(self, method: str, path: str) -> None:
        for route in ROUTES:
            match = route.pattern.match(path)
            if match is None or method not in route.methods:
                continue
            if route.auth and not self.hub.authorized(self._token()):
                raise StoreError(401, "You must be authenticated to write to this endpoint "
                                 "(pass a token).")
            self.route = route
            raw = {key: unquote(value) for key, value in match.groupdict().items()
                   if value is not None}
            params: dict[str, Any] = {}
            if route.signed:  # an upload names its repo in its signed URL, and carries no token
                signed_for = repo_ref(raw.pop("kind"), raw.pop("namespace"), raw.pop("name"))
            if route.repo is not None:  # the repo first: a missing or private one is all it says
                self._id_span = (match.start("namespace"), match.end("name"))
                kind = raw.pop("kind", None) or ("datasets" if raw.pop("datasets", None)
                                                 else "models")
                params["repo"] = self._repo(kind, raw.pop("namespace"), raw.pop("name"),
                                            write=route.repo == "write")
            # The edge: every id of the path parsed into its type before the handler runs...
            params.update({key: SEGMENTS[key].parse(value) for key, value in raw.items()})
            if route.signed:  # the signed size and repo are the upload's authorization
                params["size"] = self._signed(signed_for, params["oid"])
                params["repo"] = self._uploading_to(signed_for)
            if callable(route.body):  # ... and the body, into its typed value
                params["body"] = route.body(self._body(), self.headers.get("Content-Type", ""))
            return getattr(self, route.handler)(**params)
        unknown = _REPO_PREFIX.match(path)
        if unknown:  # a route of a repo that is not here (as the Hub answers): typed
            self._id_span = (unknown.start("namespace"), unknown.end("name"))
            self._repo(unknown["kind"], unquote(unknown["namespace"]), unquote(unknown["name"]))
        if bare := _NO_NAMESPACE_FILE.match(path):
            self._no_namespace("models", unquote(bare["name"]))
        raise StoreError(404, f"No route for {method} {shown(path)}.")

    def _repo(self, kind: str, namespace: str, name: str, *, write: bool = False) -> RepoRef:
        repo = self.hub.store.find(repo_ref(kind, namespace, name))
        token = self._token()
        if write and not self.hub.authorized(token):
            raise StoreError(401, "You must be authenticated to write to this endpoint "
                             "(pass a token).")
        if not self.hub.store.exists(repo):
            self._moved(repo, token)
            raise StoreError(404, f"Repository {repo.repo_id} not found.", "RepoNotFound")
        # A private repo needs a valid token; without tokens nobody reads one.
        if not self.hub.may_read(repo, token):
            raise StoreError(401, f"Repository {repo.repo_id} not found" + (
                " (it may be private: pass a token)." if self.hub.tokens else "."),
                "RepoNotFound")
        return repo

    def _moved(self, repo: RepoRef, token: str | None) -> None:
        """A moved repo's old id, to someone who may read the repo now: a read is redirected
        (307, the path with the new id, as the Hub does), a write told where it went."""
        target = self.hub.store.moved_to(repo)
        if target is None or not self.hub.may_read(target, token):
            return  # as any missing repo (a private repo's new id stays hidden)
        if self.command in ("GET", "HEAD") and self._id_span is not None:
            start, end = self._id_span
            split = urlsplit(self.path)
            location = (split.path[:start] + f"{quote(target.namespace, safe='')}/"
                        f"{quote(target.name, safe='')}" + split.path[end:]
                        + (f"?{split.query}" if split.query else ""))
            raise StoreError(307, f"Repository {repo.repo_id} was moved to {target.repo_id}.",
                             headers={"Location": location})
        raise StoreError(404, f"Repository {repo.repo_id} not found (it was moved to "
                              f"{target.repo_id}).", "RepoNotFound")

    def _uploading_to(self, repo: RepoRef) -> RepoRef:
        """The repo an upload URL was signed for, as stored: 404 when it is gone."""
        stored = self.hub.store.find(repo)
        if not self.hub.store.exists(stored):
            raise StoreError(404, f"Repository {repo.repo_id} not found.", "RepoNotFound")
        return stored

    def _may_read(self) -> Callable[[RepoRef], bool]:
        """This request's reach, for a commit that names other repos' objects."""
        token = self._token()

        def may_read(other: RepoRef) -> bool:
            try:
                return self.hub.may_read(other, token)
            except OSError:  # deleted meanwhile
                return False

        return may_read

    def _no_private_repos(self) -> None:
        """A server without tokens keeps no repo private: refuse to make one."""
        if not self.hub.tokens:
            raise StoreError(403, "This endpoint was started without --token, so no repo on it "
                                  "can be private: restart it with --token to keep private "
                                  "repos, or make this one public.")

    # --- account and repos -----------------------------------------------------------------------
    def _validate_yaml(self, body: None) -> None:
        self.send_json({"errors": [], "warnings": []})

    def _whoami(self) -> None:
        if self.hub.tokens and not self.hub.authorized(self._token()):
            raise StoreError(401, "Invalid credentials in Authorization header")
        self.send_json({"type": "user", "name": self.hub.user, "fullname": self.hub.user,
                        "orgs": [], "emailVerified": True,
                        "auth": {"type": "access_token",
                                 "accessToken": {"displayName": self.hub.user, "role": "write"}}})

    def _delete_repo(self, body: bodies.RepoName) -> None:
        repo = self._repo(body.kind, body.namespace or self.hub.user, body.name, write=True)
        self.hub.store.delete(repo)
        self.send_json({})

    def _no_namespace(self, kind: str, namespace: str) -> None:
        raise StoreError(404, f"Repository {shown(namespace)} not found (repo ids here are "
                         "namespace/name).", "RepoNotFound")

    def _no_xet(self, repo: RepoRef, xet: str) -> None:
        raise StoreError(404, "This endpoint does not support Xet storage.")

    # --- repo info, refs, settings ---------------------------------------------------------------
    def _repo_info(self, repo: RepoRef, revision: Revision | str = "main") -> None:
        self.send_json(self._info(repo, revision))

    def _list_repos(self, kind: str) -> None:
        """``list_models(...)`` / ``list_datasets(...)``: the repos of ``kind`` this request
        may read (a private one only with a valid token, as every route), filtered, sorted and
        paged as :mod:`._listing` says; a page's ``Link`` header names the next."""
        query = ListQuery.parse(kind, self.query)
        token, store = self._token(), self.hub.store

        def readable():
            for repo in store.repos(kind):
                try:
                    if self.hub.may_read(repo, token):
                        yield store.listed(repo)
                except (OSError, StoreError):  # deleted or moved meanwhile: not listed
                    continue

        entries, link = page(query, selected(query, readable()), self.hub.list_page_size,
                             f"{self._base()}/api/{kind}", self.query)
        self.send_json(entries, headers={"Link": link} if link else None)

    def _auth_check(self, repo: RepoRef) -> None:
        """The repo is readable with this request's credentials (the routing checked it)."""
        self.send_json({})

    def _refs(self, repo: RepoRef) -> None:
        refs = self.hub.store.refs(repo)
        self.send_json({
            "branches": [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": c}
                         for n, c in sorted(refs["branches"].items())],
            "tags": [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": c}
                     for n, c in sorted(refs["tags"].items())],
            "converts": [],
            "pullRequests": [{"name": f"refs/pr/{n}", "ref": f"refs/pr/{n}", "targetCommit": c}
                             for n, c in sorted(refs["pulls"].items(), key=lambda i: int(i[0]))]})

    def _create_tag(self, repo: RepoRef, revision: Revision, body: str) -> None:
        self.hub.store.create_ref(repo, "tag", body, revision)
        self.send_json({})

    def _create_branch(self, repo: RepoRef, branch: str, body: Revision | None) -> None:
        self.hub.store.create_ref(repo, "branch", branch, body or "main")
        self.send_json({})

    def _delete_ref(self, repo: RepoRef, ref_kind: str, ref: str) -> None:
        self.hub.store.delete_ref(repo, ref_kind, ref)
        self.send_json({})

    def _settings(self, repo: RepoRef, body: bodies.RepoSettings) -> None:
        """Privacy only: a setting this endpoint does not serve is refused, never answered 200
        and dropped (asking for what already holds, gated=false or xetEnabled=false, is
        taken)."""
        if body.gated:
            raise StoreError(422, f"This endpoint does not serve gated repos (gated="
                                  f"{shown(body.gated)} is refused): its repos are public or "
                                  "private.")
        if body.xet:
            raise StoreError(422, "This endpoint does not serve Xet storage (xetEnabled=true "
                                  "is refused).")
        if body.private:
            self._no_private_repos()
        if body.private is not None:  # the new privacy; None: left as it is
            self.hub.store.set_private(repo, body.private)
        self.send_json({"private": self.hub.store.is_private(repo)})

    # --- handlers --------------------------------------------------------------------------------
    def _move_repo(self, body: bodies.MoveRepo) -> None:
        repo = self._repo(body.kind, *body.source, write=True)
        self.hub.store.move(repo, body.target)
        return self.send_json({})

    def _create_repo(self, body: bodies.NewRepo) -> None:
        if body.private:
            self._no_private_repos()
        namespace = body.namespace or self.hub.user
        repo = self.hub.store.find(new_repo_ref(body.kind, namespace, body.name))
        created = self.hub.store.create(repo, body.private)
        prefix = "datasets/" if body.kind == "datasets" else ""
        answer = {"url": f"{self._base()}/{prefix}{repo.repo_id}", "name": repo.repo_id}
        if not created:  # the client reads url from the 409 too; error says why, as the Hub's
            answer["error"] = f"A {repo.repo_type} repository called {repo.repo_id} already exists."
        self.send_json(answer, 200 if created else 409)

    def _base(self) -> str:
        host = self.headers.get("Host") or "{}:{}".format(*self.server.server_address[:2])
        return f"http://{host}"

    def _entry(self, path: str, entry: dict[str, Any],
               last: dict[str, Any] | None = None) -> dict[str, Any]:
        data = {"type": "file", "path": path, "oid": entry["git_oid"], "size": entry["size"]}
        if entry.get("lfs"):
            data["lfs"] = {"oid": entry["sha256"], "size": entry["size"],
                           "pointerSize": entry.get("pointer_size", 134)}
        if last is not None:  # expand=true: the last commit that changed the file
            data["lastCommit"] = {"id": last["id"], "title": last["title"], "date": last["date"]}
        return data

    @staticmethod
    def _folder(path: str, last: dict[str, Any] | None) -> dict[str, Any]:
        data = {"type": "directory", "path": path, "oid": hashlib.sha1(path.encode()).hexdigest(),
                "size": 0}
        if last is not None:  # expand=true: the last commit that changed anything below it
            data["lastCommit"] = {"id": last["id"], "title": last["title"], "date": last["date"]}
        return data

    def _last_commits(self, repo: RepoRef, revision: Revision | str) -> dict[str, dict[str, Any]]:
        expand = self.query.get("expand", ["false"])[0].lower() == "true" or self._form_expand
        return self.hub.store.last_commits(repo, revision) if expand else {}

    def _info(self, repo: RepoRef, revision: Revision | str) -> dict[str, Any]:
        commit_id = self.hub.store.resolve(repo, revision)
        commit = self.hub.store.commit(repo, commit_id)
        siblings = []
        for path, entry in sorted(commit["tree"].items()):
            sibling: dict[str, Any] = {"rfilename": path}
            if "blobs" in self.query or self.query.get("blobs") == ["true"]:
                sibling.update(size=entry["size"], blobId=entry["git_oid"])
                if entry.get("lfs"):
                    sibling["lfs"] = {"sha256": entry["sha256"], "size": entry["size"],
                                      "pointerSize": entry.get("pointer_size", 134)}
            siblings.append(sibling)
        card = self.hub.store.card(repo, commit_id)
        return {"_id": repo.repo_id, "id": repo.repo_id, "sha": commit_id,
                "private": self.hub.store.is_private(repo), "disabled": False, "gated": False,
                "lastModified": commit["date"], "siblings": siblings,
                "tags": card_tags(repo.kind, card), "downloads": 0, "likes": 0,
                "author": repo.namespace, "cardData": card}

    def _tree(self, repo: RepoRef, revision: Revision, path: str = "") -> None:
        prefix = path
        commit = self.hub.store.commit(repo, self.hub.store.resolve(repo, revision))
        last = self._last_commits(repo, revision)
        recursive = self.query.get("recursive", ["false"])[0].lower() == "true"
        base = prefix.rstrip("/") + "/" if prefix else ""
        entries, folders = [], set()
        for path, entry in sorted(commit["tree"].items()):
            if not path.startswith(base):
                continue
            rest = path[len(base):]
            if "/" in rest:
                parts = rest.split("/")
                for depth in range(1, len(parts) if recursive else 2):
                    folders.add(base + "/".join(parts[:depth]))
                if not recursive:
                    continue
            entries.append(self._entry(path, entry, last.get(path)))
        if prefix and not entries and not folders:
            raise StoreError(404, f"{shown(prefix)} not found at {revision}.", "EntryNotFound")
        listing = [self._folder(f, last.get(f)) for f in sorted(folders)] + entries
        self.send_json(listing)

    def _paths_info(self, repo: RepoRef, revision: Revision, body: bodies.PathsInfo) -> None:
        self._form_expand = body.expand
        commit = self.hub.store.commit(repo, self.hub.store.resolve(repo, revision))
        last = self._last_commits(repo, revision)
        result, folders = [], None
        for path in body.paths:  # keys of the tree, never file names
            if path in commit["tree"]:
                result.append(self._entry(path, commit["tree"][path], last.get(path)))
                continue
            if folders is None:  # once per request: a scan of the tree per path asked about
                folders = _folders(commit["tree"])  # made 100,000 paths a CPU-bound DoS
            if path.rstrip("/") in folders:
                result.append(self._folder(path, last.get(path.rstrip("/"))))
        self.send_json(result)

    def _commits(self, repo: RepoRef, revision: Revision | str = "main") -> None:
        formatted = "formatted" in self.query.get("expand[]", [])
        self.send_json([{"id": c["id"], "title": c["title"], "message": c["message"],
                         "authors": [{"user": self.hub.user}], "date": c["date"],
                         **({"formatted": {"title": html.escape(c["title"]),
                                           "message": html.escape(c["message"])}}
                            if formatted else {})}
                        for c in self.hub.store.history(repo, revision)])

    def _preupload(self, repo: RepoRef, revision: Revision, body: bodies.Preupload) -> None:
        try:
            tree = self.hub.store.commit(repo, self.hub.store.resolve(repo, revision))["tree"]
        except StoreError:
            tree = {}
        if len(body.files) > MAX_PREUPLOAD_FILES:
            raise StoreError(400, f"A preupload names at most {MAX_PREUPLOAD_FILES} files, not "
                                  f"{len(body.files)} (the client sends 256 at a time).")
        # The .gitignore this upload commits, if any, else the repo's (as the Hub honours it).
        ignore_patterns = _patterns(_bounded(body.git_ignore, ".gitignore")
                                    if body.git_ignore is not None
                                    else _repo_text(self.hub.store, tree, ".gitignore"))
        lfs_patterns = _lfs_patterns(_bounded(body.git_attributes, ".gitattributes")
                                     if body.git_attributes is not None
                                     else _repo_text(self.hub.store, tree, ".gitattributes"))
        ignore_patterns = list(dict.fromkeys(ignore_patterns))  # each compiled once
        lfs_patterns = list(dict.fromkeys(lfs_patterns))
        patterns = ignore_patterns + lfs_patterns
        work = len(patterns) * sum(len(item.path) + 1 for item in body.files) + \
            PATTERN_CHAR_WORK * sum(len(pattern) for pattern in patterns)
        if work > MAX_MATCH_WORK:
            raise StoreError(400, (
                f"This preupload asks for {work:,} units of pattern work (pattern x "
                f"path-character matches, plus {PATTERN_CHAR_WORK:,} per character of the "
                f"patterns compiled: {len(ignore_patterns)} .gitignore and {len(lfs_patterns)} "
                f".gitattributes patterns, {len(body.files)} paths); this endpoint does at "
                f"most {MAX_MATCH_WORK:,}: send fewer files at a time or a shorter "
                ".gitignore."))
        ignored, tracked = _matcher(ignore_patterns), _matcher(lfs_patterns)
        files = []
        for item in body.files:
            path = item.path
            lfs = _is_lfs(path, item.size, item.sample) or tracked(path)
            result = {"path": path, "uploadMode": "lfs" if lfs else "regular",
                      "shouldIgnore": ignored(path)}
            if path in tree:
                existing = tree[path]
                result["oid"] = existing["sha256"] if lfs else existing["git_oid"]
            files.append(result)
        self.send_json({"files": files, "commitOid": self.hub.store.resolve(repo, revision)
                         if tree else None})

    def _lfs_batch(self, repo: RepoRef, body: list[tuple[str, int]]) -> None:
        """Per repo: an object this repo holds needs no upload; any other (another repo's
        included) is uploaded, for this repo, by URLs signed for it."""
        objects = []
        where = f"{repo.kind}/{repo.namespace}/{repo.name}"
        for oid, size in body:
            entry: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if size > self.hub.max_upload_bytes:  # refused before a byte is sent
                entry["error"] = {"code": 422, "message": (
                    f"Object {oid} is {size} bytes; this endpoint takes uploads of at most "
                    f"{self.hub.max_upload_bytes} bytes (cubepack hub serve "
                    "--max-upload-size).")}
            elif not self.hub.store.holds(repo, oid, size):
                query = f"size={size}&sig={self.hub.sign(repo, oid, size)}"
                entry["actions"] = {
                    action: {"href": f"{self._base()}/lfs/{action}/{where}/{oid}?{query}"}
                    for action in ("upload", "verify")}
            objects.append(entry)
        self._send(200, json.dumps({"transfer": "basic", "objects": objects, "hash_algo": "sha256"})
                   .encode(), "application/vnd.git-lfs+json")

    def _signed(self, repo: RepoRef, oid: str) -> int:
        """The size an upload or verify URL was signed for (for ``repo``); 403 unless the URL
        is one this endpoint signed (the query is the client's: a size that is no number, or a
        signature that is not ASCII, is a bad signature, not a crash)."""
        size, signature = self.query.get("size", [""])[0], self.query.get("sig", [""])[0]
        if not re.fullmatch(r"[0-9]{1,16}", size) or not hmac.compare_digest(
                signature.encode("utf-8", "replace"),
                self.hub.sign(repo, oid, int(size)).encode()):
            raise StoreError(403, "Invalid or missing upload signature.")
        return int(size)

    def _lfs_upload(self, repo: RepoRef, oid: str, size: int) -> None:
        if size > self.hub.max_upload_bytes:  # signed before the maximum was lowered
            raise self._too_large(self.hub.max_upload_bytes)
        counted = self._counting(self._chunks(size, upload=True), f"lfs:{oid}")
        self.hub.store.put_blob(repo, oid, size, counted)
        self.send_json({})

    def _counting(self, chunks, key: str):
        for chunk in chunks:
            self.hub.count_upload(key, len(chunk))
            yield chunk

    def _lfs_verify(self, repo: RepoRef, oid: str, size: int, body: tuple[str, int]) -> None:
        if body != (oid, size):
            raise StoreError(400, f"The body names {body[0]} ({body[1]} bytes), not the object "
                                  f"this URL verifies, {oid} ({size} bytes).")
        if not self.hub.store.holds(repo, oid, size):
            raise StoreError(404, f"Object {oid} was not uploaded.")
        self.send_json({})

    def _commit(self, repo: RepoRef, revision: Revision, body: bodies.Commit) -> None:
        create_pr = self.query.get("create_pr", ["0"])[0] not in ("0", "false", "")
        for operation in body.operations:
            if isinstance(operation, AddFile):
                self.hub.count_upload(f"file:{operation.path}", len(operation.content))
        fields = dict(title=body.summary, message=body.description, parent=body.parent,
                      operations=body.operations, author=self.hub.user,
                      may_read=self._may_read())
        number = None
        if create_pr:  # the commit goes to a new refs/pr/N; the branch stays where it is
            commit_id, number = self.hub.store.open_pull_request(repo, revision, **fields)
        else:
            commit_id = self.hub.store.apply_commit(repo, revision, **fields)
        self.hub.count_commit()
        url = self._repo_url(repo)
        self.send_json({"commitOid": commit_id, "commitUrl": f"{url}/commit/{commit_id}",
                        "pullRequestUrl": f"{url}/discussions/{number}" if number else None})

    def _repo_url(self, repo: RepoRef) -> str:
        prefix = "datasets/" if repo.kind == "datasets" else ""
        return f"{self._base()}/{prefix}{repo.repo_id}"

    # --- discussions and pull requests -----------------------------------------------------------
    def _summary(self, repo: RepoRef, record: dict[str, Any]) -> dict[str, Any]:
        return {"num": record["num"], "title": record["title"], "status": record["status"],
                "createdAt": record["createdAt"], "isPullRequest": record["isPullRequest"],
                "author": {"name": record["author"]}, "pinned": False,
                "numComments": sum(e["type"] == "comment" for e in record["events"]),
                "repo": {"name": repo.repo_id, "type": repo.repo_type}}

    def _discussions(self, repo: RepoRef) -> None:
        """Newest first, 50 a page (``p``), filtered by type, status and author as on the Hub."""
        kind = self.query.get("type", ["all"])[0]
        status = self.query.get("status", ["all"])[0]
        author = self.query.get("author", [None])[0]
        items = [d for d in reversed(self.hub.store.discussions(repo))
                 if kind in ("all", "pull_request" if d["isPullRequest"] else "discussion")
                 and (status == "all" or (d["status"] == "open") == (status == "open"))
                 and author in (None, d["author"])]
        try:
            page = max(0, int(self.query.get("p", ["0"])[0]))
        except ValueError:
            raise StoreError(400, "Invalid page number.") from None
        listed = items[page * 50:(page + 1) * 50]
        self.send_json({"discussions": [self._summary(repo, d) for d in listed],
                        "count": len(items), "start": page * 50,
                        "numClosedDiscussions": sum(d["status"] != "open" for d in items)})

    def _discussion(self, repo: RepoRef, num: int) -> None:
        store = self.hub.store
        record = store.discussion(repo, num)
        details = {**self._summary(repo, record), "events": record["events"]}
        if record["isPullRequest"]:
            details["changes"] = {"base": f"refs/heads/{record['base']}",
                                  "mergeCommitId": record.get("mergeCommitId")}
            details["filesWithConflicts"] = store.conflicts(repo, num)
        self.send_json(details)

    def _create_discussion(self, repo: RepoRef, body: bodies.NewDiscussion) -> None:
        number = self.hub.store.create_discussion(
            repo, title=body.title, description=body.description, author=self.hub.user,
            pull_request=body.pull_request)
        self.send_json({"num": number, "url": f"{self._repo_url(repo)}/discussions/{number}"})

    def _comment(self, repo: RepoRef, num: int, body: str) -> None:
        self.send_json({"newMessage": self.hub.store.comment(repo, num, body, self.hub.user)})

    def _rename(self, repo: RepoRef, num: int, body: str) -> None:
        self.send_json({"newTitle": self.hub.store.rename(repo, num, body, self.hub.user)})

    def _set_status(self, repo: RepoRef, num: int, body: bodies.StatusChange) -> None:
        event = self.hub.store.set_status(repo, num, body.status, self.hub.user, body.comment)
        self.send_json({"newStatus": event})

    def _merge(self, repo: RepoRef, num: int, body: str | None) -> None:
        self.hub.store.merge(repo, num, self.hub.user, body)
        self.send_json({})

    def _edit_comment(self, repo: RepoRef, num: int, event: str, body: str) -> None:
        self.send_json({"updatedComment": self.hub.store.edit_comment(repo, num, event, body)})

    def _resolve(self, repo: RepoRef, revision: Revision, path: str) -> None:
        store = self.hub.store
        commit_id = store.resolve(repo, revision)
        entry = store.commit(repo, commit_id)["tree"].get(path)
        if entry is None:
            raise StoreError(404, f"{shown(path)} not found at {revision}.", "EntryNotFound")
        blob = store.blob_path(entry["sha256"])
        size = blob.stat().st_size
        etag = entry["sha256"] if entry.get("lfs") else entry["git_oid"]
        headers = {"X-Repo-Commit": commit_id, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        if entry.get("lfs"):
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(entry["size"])})
        start, end, status = 0, size - 1, 200
        if wanted := self.headers.get("Range"):
            span = _byte_range(wanted, size)
            if span is None:
                return self._send_error(416, f"Range {shown(wanted)} is not satisfiable for "
                                             f"{size} bytes.",
                                        headers={"Content-Range": f"bytes */{size}"})
            start, end = span
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = max(0, end - start + 1)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        for key, value in headers.items():
            self.send_header(key, value)
        self._end_headers()
        if self.command == "HEAD":
            return
        self.wfile.flush()
        with open(blob, "rb") as handle:
            self.hub.send_file(self, handle, start, length)


def _header_text(text: str) -> str:
    """``text`` with every character but printable ASCII escaped (``\\r``, ``\\xe9``): fit
    for a header or a log line."""
    return "".join(ch if " " <= ch <= "~" else ascii(ch)[1:-1] for ch in text)


def _folders(tree: dict[str, Any]) -> set[str]:
    """Every folder of a commit's tree (``a`` and ``a/b`` for ``a/b/c.txt``)."""
    found: set[str] = set()
    for path in tree:
        folder = path.rpartition("/")[0]
        while folder and folder not in found:
            found.add(folder)
            folder = folder.rpartition("/")[0]
    return found


def _is_lfs(path: str | None, size: int, sample: bytes) -> bool:
    """Classify like the Hub: binary-looking or large files go to LFS, text stays in git."""
    if path and path.endswith(_BINARY_SUFFIXES):
        return True
    return size >= LFS_THRESHOLD or b"\0" in sample


def _byte_range(header: str, size: int) -> tuple[int, int] | None:
    """(first, last) byte of a single ``Range: bytes=...`` header, or None when unsatisfiable.

    ``a-b``, ``a-`` (to the end) and ``-n`` (the last n bytes), as RFC 9110 defines them.
    """
    match = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", header)
    if not match or not (match.group(1) or match.group(2)):
        return None
    if not match.group(1):  # a suffix: the last n bytes
        count = int(match.group(2))
        return (max(0, size - count), size - 1) if count and size else None
    start = int(match.group(1))
    end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
    if start >= size or start > end:
        return None
    return start, end


def _repo_text(store: HubStore, tree: dict[str, Any], path: str) -> str:
    """A small text file of the tree (``.gitignore``, ``.gitattributes``); "" when absent.
    One larger than MAX_PATTERNS_BYTES is refused (400), never read into memory, nor cut."""
    entry = tree.get(path)
    if entry is None:
        return ""
    if entry["size"] > MAX_PATTERNS_BYTES:
        raise _too_many_patterns(f"The repo's {path}")
    with open(store.blob_path(entry["sha256"]), "rb") as handle:
        return handle.read(MAX_PATTERNS_BYTES).decode("utf-8", errors="replace")


def _bounded(text: str, what: str) -> str:
    """The ``.gitignore`` or ``.gitattributes`` a preupload sends, at most MAX_PATTERNS_BYTES."""
    if len(text.encode("utf-8")) > MAX_PATTERNS_BYTES:
        raise _too_many_patterns(f"The {what} of this upload")
    return text


def _too_many_patterns(subject: str) -> StoreError:
    return StoreError(400, f"{subject} has more than {MAX_PATTERNS_BYTES} bytes of patterns, "
                           "more than this endpoint matches.")


def _lfs_patterns(text: str) -> list[str]:
    """The patterns a ``.gitattributes`` tracks by LFS (``*.png filter=lfs ...``): such files
    are LFS files whatever their size, as on the Hub."""
    return [fields[0] for fields in (line.split() for line in text.splitlines())
            if len(fields) > 1 and not fields[0].startswith("#") and "filter=lfs" in fields[1:]]


def _patterns(text: str) -> list[str]:
    """The patterns of a ``.gitignore``'s text (blank lines and comments dropped)."""
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _matcher(patterns: list[str]) -> Callable[[str], bool]:
    """Whether a path matches one of ``patterns`` (a ``.gitignore``'s or a ``.gitattributes``'s):
    the path or its name matches one as ``fnmatch`` does, or the path is below a folder one
    names. The patterns are compiled once into one regular expression, so a path costs one
    match, not one ``fnmatch`` per pattern (1,000 patterns x 40,000 files once held a thread
    for minutes). The caller bounds the patterns (:func:`_bounded`, :data:`MAX_MATCH_WORK`,
    compiling counted)."""
    return _compiled(tuple(pattern.rstrip("/").lstrip("/") for pattern in patterns))


@functools.lru_cache(maxsize=64)
def _compiled(bare: tuple[str, ...]) -> Callable[[str], bool]:
    if not bare:
        return lambda path: False
    whole = re.compile("|".join(f"(?:{fnmatch.translate(pattern)})" for pattern in bare))
    folders = frozenset(bare)

    def matches(path: str) -> bool:
        if whole.match(path) or whole.match(path.rsplit("/", 1)[-1]):
            return True
        at = path.find("/")
        while at != -1:  # a folder a pattern names, whole (``build`` for ``build/x.o``)
            if path[:at] in folders:
                return True
            at = path.find("/", at + 1)
        return False

    return matches

