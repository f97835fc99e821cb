"""Adversary (issue #38, item 3): the endpoint's rate floor drops a download whose client
receives at four times the floor.

The promise (docs/reference/local-hub.md, Limits): "An upload and a download are held to a rate
floor instead, whatever size they announce: fewer than 1 KiB/s over a window of 30 s (cubepack's
own client's low-speed rule) drops them." So a download the client receives at more than the
floor is never dropped; and docs/reference/environment-stall.md: "A link that moves at least the
limit never stalls".

The attack (none: an honest client): one download of a 4 MiB file read steadily at 64 KiB/s,
four times a floor scaled to 16 KiB/s over 2 s (the defaults' rule, scaled so the test takes
seconds), on loopback, by a socket with the kernel's default buffers (at twice the floor it is
dropped the same way).

What happened: the endpoint counts the bytes `sendfile` hands to the kernel, not the bytes the
client receives. The kernel grows the socket's send buffer (to megabytes on loopback or a fast
LAN) and wakes a blocked sender only when half of it is free, so after the first burst no
`sendfile` returns within a window while the client drains the buffer at 4x the floor. The
download is dropped after two windows ("dropped: answer moved 0 bytes in 2 s (under 16384
bytes/s)"), while the client received ~128 KiB in those 2 s. At the defaults a client reading
at a few KiB/s from a multi-megabyte send buffer is dropped the same way; a pull's parallel
downloads over a shared link get a share of its rate each, and lose it sooner.
"""

from __future__ import annotations

import os
import socket
import time

from huggingface_hub import CommitOperationAdd

from cubepack.testing.hub import InstrumentedHub

from hub_users import api_for

LIMIT = 16 * 1024
TIME = 2.0
RATE = 4 * LIMIT  # the client's steady reading rate
READ_FOR = 4 * TIME  # long enough for two windows past the first burst


def test_a_download_received_at_4x_the_floor_is_not_dropped(tmp_path, monkeypatch):
    log = []
    with InstrumentedHub(tmp_path / "root", log=log.append, low_speed_limit=LIMIT,
                         low_speed_time=TIME) as hub:
        api = api_for(hub.url, None, monkeypatch)
        api.create_repo("team/cube", repo_type="dataset")
        api.create_commit("team/cube", [CommitOperationAdd("big.safetensors",
                                                           os.urandom(4 << 20))],
                          commit_message="push", repo_type="dataset")
        reader = socket.socket()
        reader.connect(hub._httpd.server_address[:2])
        reader.sendall(b"GET /datasets/team/cube/resolve/main/big.safetensors HTTP/1.1\r\n"
                       b"Host: x\r\n\r\n")
        started, received, step = time.monotonic(), 0, RATE // 8
        try:
            while time.monotonic() - started < READ_FOR:  # RATE bytes/s, in 8 steps a second
                due = started + received / RATE
                time.sleep(max(0.0, due - time.monotonic()))
                data = reader.recv(step)
                if not data:
                    break
                received += len(data)
        finally:
            reader.close()
        elapsed = time.monotonic() - started
    dropped = [line for line in log if "dropped" in line]
    assert received / elapsed > 2 * LIMIT  # the client did receive well above the floor
    assert not dropped, (f"received {received} bytes in {elapsed:.1f} s "
                         f"({received / elapsed:,.0f} bytes/s, floor {LIMIT:,}): {dropped}")
