"""Promise 3: "a pull's deadline (``--timeout``) covers its checks too" (budget.py: "a cube
crafted to be slow to check must not outlive --timeout").

The budget is checked cooperatively, between steps: once per adapter. Inside one adapter,
``read_adapter`` matches every LoRA module of the header against every ``rank_pattern`` key
(``_pattern_rank``), each match re-parsing the key for its shape and bounded by 50 ms, but
their number is not bounded: modules x keys. A pusher re-seals a cube whose adapter has a few
thousand one-element modules and a hundred long keys that match none of them; it *verifies*
(every check passes), only slowly, and a pull with ``timeout=5`` runs for minutes.
"""

from __future__ import annotations

import time

import pytest

import cubepack
from cubepack.errors import CubepackError
from cubepack.testing.hub import InstrumentedHub, upload_folder

from slow_adapter import slow_adapter_cube

TIMEOUT = 5
GRACE = 30


def test_local_verify_of_the_cube_passes_it_only_slowly(zoo, tmp_path):
    cube = slow_adapter_cube(zoo["a"], tmp_path / "cube", modules=600, keys=40)
    start = time.monotonic()
    assert cubepack.verify(cube).ok  # a valid cube, as far as verify is concerned
    assert time.monotonic() - start > 3  # ~0.3 ms per (module, key): quadratic work


def test_pull_with_a_timeout_returns_near_its_deadline(zoo, tmp_path):
    cube = slow_adapter_cube(zoo["a"], tmp_path / "cube", modules=4000, keys=100)
    with InstrumentedHub(tmp_path / "hub-root") as hub:
        sha = upload_folder(hub.url, "mallory/slow", cube, repo_type="dataset")
        start = time.monotonic()
        try:
            cubepack.pull(f"mallory/slow@{sha}", local_dir=tmp_path / "out", endpoint=hub.url,
                          cache_dir=tmp_path / "hf", timeout=TIMEOUT)
        except CubepackError:
            pass  # a deadline refusal is the promised outcome
        elapsed = time.monotonic() - start
    assert elapsed < TIMEOUT + GRACE, (
        f"pull --timeout {TIMEOUT} ran {elapsed:.0f} s: the checks of one adapter outlived "
        "the deadline")
