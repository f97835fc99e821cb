"""An endpoint that cannot be reached is one sentence naming it, HF_ENDPOINT and what to do:
never the HTTP library's repr of its retry pool (``MaxRetryError(HTTPConnectionPool(...``)."""

from __future__ import annotations

import socket

import pytest

import cubepack
from cubepack import HubError


def refused_endpoint() -> str:
    """A loopback port nothing listens on (bound, then closed: refused at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize("endpoint, reason", [
    (None, "Connection refused"),
    ("http://no-such-host.invalid", "the host name does not resolve")])
@pytest.mark.parametrize("call", ["pull", "push"])
def test_an_unreachable_endpoint_is_one_sentence(tmp_path, endpoint, reason, call,
                                                 packed_cube_factory):
    endpoint = endpoint or refused_endpoint()
    with pytest.raises(HubError) as caught:
        if call == "pull":
            cubepack.pull("me/cube", endpoint=endpoint, local_dir=tmp_path / "cube",
                          cache_dir=tmp_path / "hf")
        else:
            cubepack.push(packed_cube_factory(), "me/cube", endpoint=endpoint, token="t",
                          allow_local_paths=True)
    message = str(caught.value)
    assert message.startswith(f"Cannot reach {endpoint} ({reason}) for me/cube: "), message
    assert "HF_ENDPOINT" in message and "\n" not in message
    # The HF cache can stand in for a pull, never for a push.
    assert ("HF_HUB_OFFLINE=1" in message) == (call == "pull"), message
    for raw in ("MaxRetryError", "HTTPConnectionPool", "NewConnectionError", "Errno"):
        assert raw not in message
    assert not (tmp_path / "cube").exists()
