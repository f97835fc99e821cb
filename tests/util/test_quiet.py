"""``quiet_libraries``: the libraries' switches are moved for the block only, then put back
exactly, also when blocks nest or overlap across threads; cubepack's own warnings pass."""

from __future__ import annotations

import importlib
import logging
import os
import threading
import warnings

import huggingface_hub.utils as hub_utils
from transformers.utils import logging as transformers_logging

from cubepack._util import quiet

hub_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")  # the module, not the class


def state():
    return {"filters": list(warnings.filters),
            "levels": {name: logging.getLogger(name).level for name in quiet.THIRD_PARTY_LOGGERS},
            "hub bars": dict(hub_tqdm.progress_bar_states),
            "transformers bars": transformers_logging.is_progress_bar_enabled(),
            "environment": {k: os.environ.get(k) for k in (
                "TRANSFORMERS_VERBOSITY", "HF_HUB_VERBOSITY", "TRANSFORMERS_NO_ADVISORY_WARNINGS",
                "HF_HUB_DISABLE_PROGRESS_BARS")}}


def test_the_block_hides_library_output_and_restores_every_switch(monkeypatch, caplog):
    monkeypatch.setattr(quiet.constants, "progress_enabled", lambda: False)
    before = state()
    with quiet.quiet_libraries(verbose=False):
        assert logging.getLogger("transformers").getEffectiveLevel() == logging.ERROR
        assert logging.getLogger("memos.mem_cube.general").getEffectiveLevel() == logging.ERROR
        assert hub_utils.are_progress_bars_disabled()
        assert not transformers_logging.is_progress_bar_enabled()
        with warnings.catch_warnings(record=True) as seen:
            warnings.warn("a library's warning", UserWarning)
        assert seen == []
        with caplog.at_level(logging.WARNING, logger="cubepack"):
            logging.getLogger("cubepack.memos").warning("cubepack: dropped activation x")
        assert "cubepack: dropped activation x" in caplog.text
    assert state() == before


def test_verbose_leaves_warnings_and_levels_alone(monkeypatch):
    monkeypatch.setattr(quiet.constants, "progress_enabled", lambda: False)
    before = state()
    with quiet.quiet_libraries(verbose=True):
        assert logging.getLogger("transformers").level == before["levels"]["transformers"]
        assert list(warnings.filters) == before["filters"]
        assert hub_utils.are_progress_bars_disabled()  # bars follow the terminal, not --verbose
    assert state() == before


def test_overlapping_blocks_in_threads_restore_once_the_last_ends(monkeypatch):
    monkeypatch.setattr(quiet.constants, "progress_enabled", lambda: False)
    before = state()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def first():
        with quiet.quiet_libraries(verbose=False):
            first_in.set()
            second_in.wait(10)
        first_out.set()

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(10)
    with quiet.quiet_libraries(verbose=False):
        second_in.set()
        first_out.wait(10)
        thread.join(10)
        # the first block ended while this one is open: still quiet
        assert logging.getLogger("huggingface_hub").level == logging.ERROR
    assert state() == before
