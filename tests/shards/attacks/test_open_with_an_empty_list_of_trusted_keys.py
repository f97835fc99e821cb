"""``open(..., trusted_keys=[])`` asks for a signer and names none: refused (a UsageError or a
SignatureError), never a cube opened as if signed, nor unsigned silently."""

from __future__ import annotations

import pytest

import cubepack


def test_an_empty_key_list_is_refused(hub, cube, remote):
    remote.push(hub, cube)
    with pytest.raises((cubepack.UsageError, cubepack.SignatureError)):
        remote.open(hub, trusted_keys=[])
