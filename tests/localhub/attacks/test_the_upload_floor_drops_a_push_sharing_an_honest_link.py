"""Adversary (issue #38, items 3 and 5): the endpoint judges each upload alone by its rate
floor, so a push whose parallel uploads share an honest link above the floor is dropped.

The promise: docs/reference/environment-stall.md, "a push uploads up to 5 (huggingface_hub's LFS
upload threads [...]), so one link is shared by several requests, each moving a share of its
rate. A link that moves at least the limit never stalls, however many requests share it";
docs/reference/local-hub.md, Limits: uploads are "held to a rate floor [...] (cubepack's own
client's low-speed rule)".

The attack (none: an honest team): a push of 4 LFS files through a link that moves 3x the
limit from the client to the endpoint, shared by the client's parallel uploads (3/4 of the
limit each). The link is a throttling TCP proxy in front of the endpoint; the rule is scaled
to 16 KiB/s over 2 s so the test takes seconds (the defaults' 1 KiB/s over 30 s: a 3 KB/s
link, the docs' own example).

What happened: the client's rule was made aggregate (issue #38, item 5) but the endpoint's is
not: it drops every upload ("dropped: upload moved 24576 bytes in 2 s (under 16384 bytes/s)"),
each retry of the client too, and the push fails ("Error while uploading 'part0.safetensors' to
the Hub", after ~50 s of retries), on a link moving three times the limit.
"""

from __future__ import annotations

import os
import socket
import threading

from huggingface_hub import CommitOperationAdd

from cubepack.testing.hub import InstrumentedHub, Link

from hub_users import api_for

TOKEN = "writer"
LIMIT = 16 * 1024
TIME = 2.0
FILES = {f"part{i}.safetensors": os.urandom(96 * 1024) for i in range(4)}


class UploadLink:
    """A TCP proxy whose upstream bytes (client -> endpoint), over all connections, share one
    link of ``rate`` bytes/s; answers pass at once."""

    def __init__(self, upstream, rate):
        self.upstream, self.link = upstream, Link(rate)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pipe, args=(client, server, self.link),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, None), daemon=True).start()

    def _pipe(self, source, target, link):
        try:
            while not self.stopping.is_set():
                data = source.recv(1024)
                if not data:
                    break
                if link is not None and not link.wait_for(len(data), self.stopping):
                    break
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.stopping.set()
        self.listener.close()


def test_a_push_sharing_a_link_above_the_floor_is_not_dropped(tmp_path, monkeypatch):
    log = []
    monkeypatch.setenv("CUBEPACK_LOW_SPEED_LIMIT", str(LIMIT))  # the client's rule, alike
    monkeypatch.setenv("CUBEPACK_LOW_SPEED_TIME", str(TIME))
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN], log=log.append,
                         low_speed_limit=LIMIT, low_speed_time=TIME) as hub:
        api_for(hub.url, TOKEN, monkeypatch).create_repo("team/cube", repo_type="dataset")
        proxy = UploadLink(hub._httpd.server_address[:2], rate=3 * LIMIT)
        try:
            api = api_for(f"http://127.0.0.1:{proxy.port}", TOKEN, monkeypatch)
            try:
                api.create_commit("team/cube", [CommitOperationAdd(p, d) for p, d in FILES.items()],
                                  commit_message="push", repo_type="dataset", num_threads=4)
                failed = None
            except Exception as exc:  # noqa: BLE001 - reported below
                failed = exc
        finally:
            proxy.close()
    dropped = [line for line in log if "dropped" in line]
    assert failed is None and not dropped, (repr(failed)[:300], dropped)
