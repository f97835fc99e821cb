"""An overall deadline per pull and per push, however slowly a hostile endpoint answers: the
operation ends with one HubError naming the endpoint and what was slow, the pull places
nothing, and no request it made goes on in the background. Run under huggingface_hub 2.x
(httpx) and 0.36 (requests) alike.

A test that checks what the message names makes the deadline pass once the endpoint holds
that request (an event: :meth:`Deadline.expire <cubepack.hub._deadline.Deadline.expire>`, what
a deadline does when its time is up), never after a number of seconds: on a loaded machine the
steps before that request can take longer than any such number."""

from __future__ import annotations

import json
import re
import threading

import pytest

from cubepack import HubError, UsageError
from cubepack.hub import _deadline, pull, push
from cubepack.testing.hub import InstrumentedHub

from helpers import tree_bytes
from hub_deadlines import HANG, KEPT, SHORT, cubepack_cli, nothing_left_running, published


@pytest.fixture(scope="module")
def big_cube(packed_cube_factory):
    """A cube with one ~4 MB activation: a trickled download of it never completes."""
    return packed_cube_factory({"big": list(range(4, 402)), "small": [5, 6, 7]})


@pytest.fixture
def hub(tmp_path):
    with InstrumentedHub(tmp_path / "hub") as server:
        yield server


@pytest.fixture
def target(tmp_path):
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "kept.txt").write_bytes(KEPT["kept.txt"])
    return folder


class Deadlines:
    """The :class:`~cubepack.hub._deadline.Deadline` of every pull and push a test starts, and
    the requests each has in flight, for a test to wait on."""

    def __init__(self):
        self._flying: dict[_deadline.Deadline, dict[int, _deadline._Transfer]] = {}
        self._changed = threading.Condition()

    def update(self, deadline, begun=None, ended=None):
        with self._changed:
            flying = self._flying.setdefault(deadline, {})
            if begun is not None:
                flying[id(begun)] = begun
            if ended is not None:
                flying.pop(id(ended), None)
            self._changed.notify_all()

    def wait_until(self, action: str, ready) -> _deadline.Deadline:
        """Block until ``ready(transfers)`` holds for the requests the deadline of ``action``
        ("pull of ns/slow") has in flight (each with ``method``, ``url``, ``answered``: its
        headers in the client's hands); return that deadline."""
        def found():
            return next((deadline for deadline, flying in self._flying.items()
                         if deadline.action == action and ready(list(flying.values()))), None)

        with self._changed:
            assert self._changed.wait_for(found, HANG), action
            return found()


@pytest.fixture
def deadlines(monkeypatch):
    """Every deadline a pull or push makes (see :class:`Deadlines`)."""
    from cubepack.hub import _client

    seen = Deadlines()

    class Recorded(_deadline.Deadline):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.update(self)

        def begin(self, *args, **kwargs):
            transfer = super().begin(*args, **kwargs)
            seen.update(self, begun=transfer)
            return transfer

        def answered(self, *args, **kwargs):
            super().answered(*args, **kwargs)
            seen.update(self)

        def end(self, transfer):
            super().end(transfer)
            seen.update(self, ended=transfer)

    monkeypatch.setattr(_client, "Deadline", Recorded)
    return seen


def in_background(work):
    """``work()`` in a thread (joined, and its failure raised, by the returned function)."""
    failures = []

    def run():
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread by join
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()

    def join():
        thread.join(HANG)
        assert not thread.is_alive()
        if failures:
            raise failures[0]
    return join


def test_a_trickled_download_ends_at_the_deadline_naming_file_and_bytes(hub, big_cube, target,
                                                                         tmp_path, deadlines):
    sha = published(hub, big_cube)
    trickle = hub.add_fault("trickle", path=r"/resolve/.*big\.kv", method="GET", times=100,
                            seconds=0.05)
    # The deadline passes once the trickled answer is the one request left in flight.
    joined = in_background(lambda: deadlines.wait_until("pull of ns/slow", lambda flying: [
        (t.method, t.answered, re.search(r"/resolve/.*big\.kv", t.url) is not None)
        for t in flying] == [("GET", True, True)]).expire())
    try:
        with pytest.raises(HubError) as caught:
            pull(f"ns/slow@{sha}", endpoint=hub.url, local_dir=target, force=True,
                 cache_dir=tmp_path / "c", timeout=HANG)
    finally:
        joined()
    message = str(caught.value)
    assert message.startswith(f"The pull of ns/slow did not finish within {HANG} s")
    assert hub.url in message and "still downloading activations/big.kv.safetensors (" in message
    assert "bytes arrived" in message and "Nothing was placed" in message
    assert "\n" not in message
    assert tree_bytes(target) == KEPT
    assert trickle.abandoned.wait(HANG)  # the client hung up on the trickle
    nothing_left_running()
    trickle.times = 0  # an honest endpoint again: the same pull succeeds
    assert pull(f"ns/slow@{sha}", endpoint=hub.url, local_dir=target, force=True,
                cache_dir=tmp_path / "c", timeout=HANG).report.ok


def test_an_api_call_that_never_answers_ends_at_the_deadline_naming_it(hub, big_cube, target,
                                                                        tmp_path, deadlines):
    published(hub, big_cube)
    held = hub.add_fault("hold", path=r"/api/datasets/ns/slow/revision/", method="GET")

    def expire_while_held():
        deadlines.wait_until("pull of ns/slow", lambda flying: any(
            "/api/datasets/ns/slow/revision/" in t.url for t in flying)).expire()
        held.release()  # answered now, too late: the answer is refused

    joined = in_background(expire_while_held)
    try:
        with pytest.raises(HubError) as caught:
            pull("ns/slow@main", endpoint=hub.url, local_dir=target, force=True,
                 cache_dir=tmp_path / "c", timeout=HANG)
    finally:
        joined()
    message = str(caught.value)
    assert hub.url in message and f"within {HANG} s" in message
    assert "still waiting for GET /api/datasets/ns/slow/revision/main (no answer yet)" in message
    assert tree_bytes(target) == KEPT
    nothing_left_running()


def test_a_push_whose_upload_is_never_answered_ends_at_the_deadline(hub, big_cube):
    held = hub.add_fault("hold", path=r"^/lfs/upload/", method="PUT", times=100)
    with pytest.raises(HubError) as caught:
        push(big_cube, "ns/slow", endpoint=hub.url, allow_local_paths=True, timeout=SHORT)
    # In whichever step the deadline fell (which one: the next test).
    message = str(caught.value)
    assert message.startswith(f"The push to ns/slow did not finish within {SHORT} s") and hub.url in message
    assert "push again" in message and "\n" not in message
    assert hub.stats.commits == 0
    nothing_left_running()
    held.times = 0
    held.release()
    assert push(big_cube, "ns/slow", endpoint=hub.url, allow_local_paths=True).changed


def test_a_deadline_passing_during_the_upload_names_the_files_being_uploaded(hub, big_cube,
                                                                            deadlines):
    held = hub.add_fault("hold", path=r"^/lfs/upload/", method="PUT", times=100)

    def expire_while_held():
        deadlines.wait_until("push to ns/slow", lambda flying: flying and all(
            t.method == "PUT" and "/lfs/upload/" in t.url for t in flying)).expire()
        held.release()  # the held uploads are answered now, too late: the answers are refused

    joined = in_background(expire_while_held)
    try:
        with pytest.raises(HubError) as caught:
            push(big_cube, "ns/slow", endpoint=hub.url, allow_local_paths=True, timeout=HANG)
    finally:
        joined()
    message = str(caught.value)
    assert message.startswith(f"The push to ns/slow did not finish within {HANG} s")
    assert hub.url in message
    assert "still uploading activations/" in message and "push again" in message
    assert hub.stats.commits == 0
    nothing_left_running()
    held.times = 0
    assert push(big_cube, "ns/slow", endpoint=hub.url, allow_local_paths=True).changed


def test_the_guard_does_not_outlive_the_call(hub, big_cube, tmp_path):
    import huggingface_hub

    if hasattr(huggingface_hub, "configure_http_backend"):  # 0.36
        from huggingface_hub.utils import _http

        before = _http._GLOBAL_BACKEND_FACTORY
        state = lambda: _http._GLOBAL_BACKEND_FACTORY
    else:
        hooks = huggingface_hub.get_session().event_hooks
        before = {kind: list(found) for kind, found in hooks.items()}
        state = lambda: {kind: list(found) for kind, found in hooks.items()}
    sha = published(hub, big_cube)
    assert pull(f"ns/slow@{sha}", endpoint=hub.url, local_dir=tmp_path / "out",
                cache_dir=tmp_path / "c", timeout=HANG).report.ok
    assert state() == before
    assert _deadline._ACTIVE == []


def test_the_default_deadline_is_an_hour_unless_told_otherwise(monkeypatch):
    from cubepack._util import constants

    monkeypatch.delenv("CUBEPACK_HUB_TIMEOUT", raising=False)
    assert constants.hub_timeout() == 3600
    monkeypatch.setenv("CUBEPACK_HUB_TIMEOUT", "90")
    assert constants.hub_timeout() == 90 and constants.hub_timeout(5) == 5


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")])
def test_a_timeout_must_be_a_positive_number_of_seconds(big_cube, tmp_path, value):
    with pytest.raises(UsageError, match="--timeout must be a positive number of seconds"):
        pull("ns/x", local_dir=tmp_path / "x", timeout=value)
    with pytest.raises(UsageError, match="--timeout must be a positive number of seconds"):
        push(big_cube, "ns/x", timeout=value)


@pytest.mark.parametrize("how", ["--timeout", "CUBEPACK_HUB_TIMEOUT"])
def test_the_cli_reports_the_deadline_as_a_hub_error_in_json(hub, big_cube, target, tmp_path,
                                                             how):
    published(hub, big_cube)
    hub.add_fault("hold", path=r"/revision/", method="GET", times=100)
    args = ("pull", "ns/slow", "--local-dir", target, "--force", "--json")
    if how == "--timeout":
        code, out, _ = cubepack_cli(hub, tmp_path, *args, "--timeout", "1")
    else:
        code, out, _ = cubepack_cli(hub, tmp_path, *args, env={"CUBEPACK_HUB_TIMEOUT": "1"})
    error = json.loads(out)["error"]
    assert code == 3 and error["type"] == "HubError" and error["exit_code"] == 3
    assert "within 1 s" in error["message"] and hub.url in error["message"]
    assert tree_bytes(target) == KEPT


def test_the_cli_refuses_a_bad_timeout_as_a_usage_error(hub, big_cube, tmp_path):
    code, out, _ = cubepack_cli(hub, tmp_path, "push", big_cube, "ns/x", "--timeout", "0",
                                "--json")
    assert code == 2 and json.loads(out)["error"]["type"] == "UsageError"
    code, out, _ = cubepack_cli(hub, tmp_path, "pull", "ns/x", "--json",
                                env={"CUBEPACK_HUB_TIMEOUT": "soon"})
    assert code == 2 and "CUBEPACK_HUB_TIMEOUT='soon' is not a number" in out
