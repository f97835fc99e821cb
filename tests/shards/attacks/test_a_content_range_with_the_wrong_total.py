"""A 206 whose Content-Range names the range asked for but another total (the file the
server holds is not the one the lock lists), or malformed ones: each refused before a byte is
used."""

from __future__ import annotations

import pytest

from cubepack.errors import HubError


@pytest.mark.parametrize("forge", [
    lambda first, last, total: f"bytes {first}-{last}/{total + 1}",
    lambda first, last, total: f"bytes {first}-{last}/*",
    lambda first, last, total: f"bytes {first}-{last}/{total}, bytes 0-1/{total}",
    lambda first, last, total: f"bytes {first}-{last + 1}/{total}",
    lambda first, last, total: "",
], ids=["total+1", "star", "two", "one-more", "none"])
def test_a_forged_content_range_is_refused(hub, cube, remote, models, monkeypatch, forge):
    remote.push(hub, cube)
    opened = remote.open(hub)
    opened.entry("item-001")
    original = type(opened)._get

    def forged(self, path, headers, **kwargs):
        response = original(self, path, headers, **kwargs)
        first, last, total = map(int, response.headers["Content-Range"][6:].replace(
            "/", "-").split("-"))
        response.headers["Content-Range"] = forge(first, last, total)
        return response
    monkeypatch.setattr(type(opened), "_get", forged)
    with pytest.raises(HubError, match="not the range asked for"):
        opened.load("item-001", models["a"])
