"""Fixtures shared by the endpoint's tests: an endpoint that takes one token, and the real
huggingface_hub client pointed at it."""

from __future__ import annotations

import pytest
from huggingface_hub import HfApi
from huggingface_hub import constants as hub_constants

from cubepack.testing.hub import InstrumentedHub

TOKEN = "writer"


@pytest.fixture
def hub(tmp_path):
    with InstrumentedHub(tmp_path / "root", tokens=[TOKEN]) as server:
        yield server


@pytest.fixture
def api(hub, monkeypatch):
    monkeypatch.setattr(hub_constants, "HF_HUB_DISABLE_XET", True)
    import huggingface_hub

    if huggingface_hub.__version__.startswith("0."):  # 0.36 parses returned URLs with it
        monkeypatch.setattr(hub_constants, "ENDPOINT", hub.url)
    return HfApi(endpoint=hub.url, token=TOKEN)
