"""Talking to the Hub: one client object carrying endpoint and token, and one translation of
whatever the ``huggingface_hub`` client raises into a :class:`~cubepack.errors.HubError` sentence.

Works with huggingface_hub 0.36 (HTTP through ``requests``) and 2.x (``httpx``), against the Hub or
any compatible endpoint such as ``cubepack hub serve``. ``HF_ENDPOINT``, ``HF_TOKEN``,
``HF_HUB_OFFLINE`` and ``HF_HUB_CACHE`` are honoured through huggingface_hub itself.
"""

from __future__ import annotations

import contextlib
import errno
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from .._util import atomic, constants
from .._util.revision import check_ref_name, looks_like_commit
from ..errors import CubepackError, HubError, UsageError
from ..identity._hub import lfs_sha256  # noqa: F401 - the one reading of the Hub's LFS sha256
from ._deadline import Deadline
from ._stall import LowSpeed

T = TypeVar("T")

REPO_TYPES = ("dataset", "model")
#: huggingface_hub's module constants a commit overrides (see HubClient.commit_settings): the
#: values saved on first entry, and one entry per commit running (does it need Xet off?).
_SETTINGS_LOCK = threading.Lock()
_SETTINGS_SAVED: list[Any] = []
_SETTINGS_USERS: list[bool] = []
#: Exactly owner/name in the characters the Hub allows (ASCII letters, digits, ``_.-``).
_OWNER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,96}/[A-Za-z0-9_.-]{1,96}")


def parse_repo_spec(spec: str, revision: str | None = None) -> tuple[str, str | None]:
    """``"ns/name@rev"`` -> ("ns/name", "rev"); a separate ``revision`` must agree.

    Raises:
        UsageError: two different revisions, an empty one, a revision that is neither a commit
            nor a valid ref name, or not a valid ``owner/name`` repo id (as huggingface_hub's
            own validator defines it).
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    repo_id, at, at_revision = spec.partition("@")
    if at and not at_revision:
        raise UsageError(f"{spec!r} ends with '@' but names no revision: give a branch, tag or "
                         f"commit after it ({repo_id}@main), or drop the '@'.")
    if at_revision and revision and at_revision != revision:
        raise UsageError(f"Two revisions given for {repo_id}: @{at_revision} and --revision "
                         f"{revision}; give one.")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise UsageError(f"{spec!r} is not a repo id of the form owner/name[@revision].") from exc
    if not _OWNER_NAME.fullmatch(repo_id):  # huggingface_hub 0.36's check takes "a/b\n", "é/b"
        raise UsageError(f"{spec!r} is not a repo id of the form owner/name[@revision].")
    wanted = at_revision or revision
    if wanted is not None and not looks_like_commit(wanted):
        check_ref_name(wanted)  # before any work: a name the Hub and git would refuse
    return repo_id, wanted


def cache_repo_dir(repo_id: str, repo_type: str, cache_dir: str | Path | None = None) -> Path:
    """``<HF cache>/<type>s--ns--name``: where huggingface_hub keeps this repo's blobs and refs."""
    from huggingface_hub import constants as hub_constants
    from huggingface_hub.file_download import repo_folder_name

    root = Path(cache_dir or hub_constants.HF_HUB_CACHE)
    return root / repo_folder_name(repo_id=repo_id, repo_type=repo_type)


def offline_requested(offline: bool | None = None) -> bool:
    """Offline when asked, or when ``HF_HUB_OFFLINE`` is set (even after huggingface_hub read it)."""
    from huggingface_hub import constants as hub_constants

    return bool(offline or constants.hub_offline() or hub_constants.HF_HUB_OFFLINE)


class HubClient:
    """An endpoint plus credentials, the way ``HfApi`` carries them, for every cubepack Hub call,
    and optionally one deadline for all of them.

    Args:
        endpoint: the Hub URL (default: ``HF_ENDPOINT`` or huggingface.co).
        token: a token, ``False`` for none, or None for ``HF_TOKEN`` / the stored login.
        timeout: seconds everything run through :meth:`run` may take (None: no deadline); with
            a deadline, each request is also judged by the low-speed rule
            (``CUBEPACK_LOW_SPEED_LIMIT`` / ``CUBEPACK_LOW_SPEED_TIME``, see ``_stall``).
        action, outcome: what the deadline bounds and what holds after it, for its message.
        cached: what this client fetches can come from disk, so an unreachable endpoint's
            message offers ``HF_HUB_OFFLINE=1`` (a pull, a lock to follow): True for the HF
            cache, or the words naming where (a pull: its folder or the HF cache); never for
            what only the endpoint can do (a push, its metadata).
    """

    def __init__(self, endpoint: str | None = None, token: str | bool | None = None, *,
                 timeout: float | None = None, action: str = "request", outcome: str = "",
                 cached: bool | str = False):
        from huggingface_hub import HfApi
        from huggingface_hub import constants as hub_constants

        self.endpoint = (endpoint or hub_constants.ENDPOINT).rstrip("/")
        self.token = token
        self.cached = cached
        self.api = HfApi(endpoint=self.endpoint, token=token)
        # The low-speed rule goes with the deadline: what runs under one is judged by both.
        self.deadline = Deadline(timeout, self.endpoint, action, outcome,
                                 low_speed=LowSpeed.from_environment()) \
            if timeout is not None else None

    # --- the deadline ----------------------------------------------------------------------------
    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, which talks to the endpoint, within the deadline (if any).

        Raises:
            HubError: the deadline passed; the message names the endpoint and what was slow.
        """
        if self.deadline is None:
            return fn(*args, **kwargs)
        return self.deadline.run(fn, *args, **kwargs)

    def bind(self, fn: Callable[..., T]) -> Callable[..., T]:
        """``fn`` for a pool thread of something :meth:`run` runs: its requests keep the
        deadline, and once it passed no new call starts."""
        return fn if self.deadline is None else self.deadline.bind(fn)

    # --- errors ----------------------------------------------------------------------------------
    def error(self, exc: Exception, repo_id: str, repo_type: str,
              revision: str | None) -> HubError:
        """One clear sentence for each way the Hub says no."""
        from huggingface_hub.errors import (
            EntryNotFoundError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        where = self.endpoint
        if isinstance(exc, RevisionNotFoundError):
            return HubError(f"The {repo_type} repo {repo_id} has no branch, tag or commit named "
                            f"{revision!r} at {where}.")
        if isinstance(exc, RepositoryNotFoundError):
            return HubError(f"The {repo_type} repo {repo_id} was not found at {where}, or it is "
                            "private and no valid token was given (set HF_TOKEN or pass --token).")
        if isinstance(exc, LocalEntryNotFoundError):  # a subclass of EntryNotFoundError in 2.x
            return HubError(f"{repo_id}@{revision} could not be downloaded from {where} and is not "
                            "complete in the HF cache (connection failed or offline).")
        if isinstance(exc, EntryNotFoundError):
            return HubError(f"A file of {repo_id}@{revision} was not found at {where}.")
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            return HubError(f"{where} refused the request for {repo_id} ({status}): pass a token "
                            "with write access (HF_TOKEN or --token).")
        unreachable = _unreachable(exc)
        if unreachable is not None:
            where_cached = self.cached if isinstance(self.cached, str) else "the HF cache"
            offline = f"; HF_HUB_OFFLINE=1 uses what {where_cached} already holds" \
                if self.cached else ""
            return HubError(f"Cannot reach {where} ({unreachable}) for {repo_id}: check that "
                            "the address is right (HF_ENDPOINT, or endpoint= in Python), that "
                            f"it is serving and that this machine's network reaches it{offline}.")
        text = str(exc).strip()
        first_line = text.splitlines()[0] if text else type(exc).__name__
        return HubError(f"The request for {repo_id}@{revision or 'main'} to {where} failed: "
                        f"{first_line}")

    @contextlib.contextmanager
    def translated(self, repo_id: str, repo_type: str, revision: str | None) -> Iterator[None]:
        """Turn whatever the client raises (its typed errors, or the HTTP library's) into one
        :class:`HubError` sentence; cubepack's own errors pass through."""
        try:
            yield
        except CubepackError:
            raise
        except OSError as exc:
            if exc.errno in atomic.TARGET_ERRNOS:  # our disk, not the Hub
                problem = atomic.cache_problem(exc)  # the HF cache: the setting that moves it
                if problem is not None:
                    raise problem from exc
                raise  # the caller's target names it
            raise self.error(exc, repo_id, repo_type, revision) from exc
        except Exception as exc:
            raise self.error(exc, repo_id, repo_type, revision) from exc

    # --- uploads ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def commit_settings(self, *, xet: bool) -> Iterator[None]:
        """Settings huggingface_hub reads from module constants during a commit.

        - Xet: 2.x uploads through Xet whenever hf_xet is installed and fails (no LFS fallback)
          on an endpoint without it; we turn it off for endpoints that do not offer it.
        - 0.36 parses the returned commit URL against ``constants.ENDPOINT``, not the endpoint
          the call used.

        Commits of one process may overlap (pushes in threads): the constants are saved by the
        first to enter and restored by the last to leave, and Xet stays off while any commit
        running needs it off, so no commit sees another's restore.
        """
        from huggingface_hub import constants as hub_constants

        with _SETTINGS_LOCK:
            if not _SETTINGS_USERS:
                _SETTINGS_SAVED[:] = [hub_constants.ENDPOINT, hub_constants.HF_HUB_DISABLE_XET]
            _SETTINGS_USERS.append(not xet)
            hub_constants.ENDPOINT = self.endpoint
            hub_constants.HF_HUB_DISABLE_XET = _SETTINGS_SAVED[1] or any(_SETTINGS_USERS)
        try:
            yield
        finally:
            with _SETTINGS_LOCK:
                _SETTINGS_USERS.remove(not xet)
                if _SETTINGS_USERS:
                    hub_constants.HF_HUB_DISABLE_XET = _SETTINGS_SAVED[1] or any(_SETTINGS_USERS)
                else:
                    hub_constants.ENDPOINT, hub_constants.HF_HUB_DISABLE_XET = _SETTINGS_SAVED

    def xet_supported(self, repo_id: str, repo_type: str, branch: str) -> bool:
        """Does the endpoint hand out Xet write tokens for this repo? (Only asked when hf_xet is
        installed, since otherwise the client never tries Xet.)"""
        try:
            import hf_xet  # noqa: F401
        except ImportError:
            return False
        from urllib.parse import quote

        from huggingface_hub.utils import build_hf_headers, get_session

        url = (f"{self.endpoint}/api/{repo_type}s/{repo_id}/xet-write-token/"
               f"{quote(branch, safe='')}")
        try:
            response = get_session().get(url, headers=build_hf_headers(token=self.token))
        except Exception:  # noqa: BLE001 - any failure means "do not use Xet"
            return False
        return response.status_code == 200

    def create_commit(self, repo_id: str, operations: list[Any], *, repo_type: str, branch: str,
                      message: str, parent_commit: str | None = None,
                      create_pr: bool = False) -> Any:
        """Exactly one commit of explicit operations, with Xet only where the endpoint has it
        (``create_pr``: proposed to ``branch`` as a pull request, starting at ``parent_commit``)."""
        with self.commit_settings(xet=self.xet_supported(repo_id, repo_type, branch)):
            return self.api.create_commit(repo_id, operations=operations, commit_message=message,
                                          repo_type=repo_type, revision=branch,
                                          parent_commit=parent_commit, create_pr=create_pr)

    # --- downloads -------------------------------------------------------------------------------
    def download(self, repo_id: str, filename: str, *, repo_type: str, revision: str,
                 cache_dir: str | Path | None = None,
                 local_dir: str | Path | None = None) -> Path:
        """One file of one revision: through the HF cache, or with ``local_dir`` into that
        folder only (huggingface_hub's local-dir mode, as ``hf download --local-dir``: its
        records in ``local_dir/.cache/huggingface/``; a file the HF cache already holds is
        copied from it)."""
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id, filename, repo_type=repo_type, revision=revision,
                                    token=self.token, endpoint=self.endpoint,
                                    cache_dir=cache_dir, local_dir=local_dir))


#: The connection failures of the HTTP libraries huggingface_hub uses (requests/urllib3 in
#: 0.x, httpx in 1.x and 2.x), by class name: none of them need be importable here.
_CONNECTION_FAILURES = frozenset({
    "ConnectionError", "ConnectError", "ConnectTimeout", "NewConnectionError", "MaxRetryError",
    "NameResolutionError", "ProtocolError", "RemoteDisconnected", "NetworkError",
    "ProxyError", "SSLError"})
_NETWORK_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH,
                             errno.ENETUNREACH, errno.ETIMEDOUT, errno.ECONNABORTED})


def _unreachable(exc: BaseException) -> str | None:
    """Why the endpoint could not be reached, in a few words (the innermost reason of the
    chain: "Connection refused", "the host name does not resolve"), or None when ``exc`` is
    not a connection failure. Never the libraries' repr of a retry pool."""
    import socket

    seen: set[int] = set()
    pending: list[Any] = [exc]
    found, reason = False, None
    while pending:
        current = pending.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if any(cls.__name__ in _CONNECTION_FAILURES for cls in type(current).__mro__):
            found = True
        if isinstance(current, socket.gaierror):
            found, reason = True, "the host name does not resolve"
        elif isinstance(current, OSError) and current.errno in _NETWORK_ERRNOS:
            found, reason = True, reason or current.strerror
        pending += [current.__cause__, current.__context__, getattr(current, "reason", None),
                    *[arg for arg in current.args if isinstance(arg, BaseException)]]
    if not found:
        return None
    if reason is None:  # the libraries' text, whose last "[Errno N] ..." is the reason
        match = re.findall(r"\[Errno -?\d+\] ([^'\")\]]+)", str(exc))
        reason = match[-1].strip() if match else "the connection failed"
    return reason
