"""What third-party libraries print while cubepack works: the CLI's and the MemOS hook's output.

Two rules, applied by :func:`quiet_libraries` for one block:

- **progress bars** (huggingface_hub's "Fetching N files", transformers' "Loading weights" /
  "Writing model shards", cubepack's own) only when stderr is a terminal and neither
  ``CUBEPACK_NO_PROGRESS`` nor ``HF_HUB_DISABLE_PROGRESS_BARS`` is set
  (:func:`~cubepack._util.constants.progress_enabled`), so a log never holds a ``\\r`` bar;
- **third-party warnings** (Python warnings, which cubepack itself never raises, and records
  below ERROR from the libraries' loggers, :data:`THIRD_PARTY_LOGGERS`) are hidden unless verbose
  (``CUBEPACK_VERBOSE=1``, the CLI's ``--verbose``). cubepack's own warnings (its ``cubepack.*``
  loggers: "unverified", "dropped activation", ...) always show; errors always show.

Every switch moved is put back when the last block open in the process ends (blocks nest and
may overlap across threads: the first to open applies the rules, the last to close restores
them; while one is open the rules hold process-wide, as Python's warning filters and logger
levels are process state). A library imported inside a block keeps the settings it read at its
import (environment variables), which is why the CLI, whose process is cubepack's, sets them.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from . import constants

#: Loggers of the libraries cubepack calls (and their children).
THIRD_PARTY_LOGGERS = ("transformers", "huggingface_hub", "memos", "accelerate", "torch",
                       "safetensors", "urllib3", "httpx", "httpcore", "filelock", "tokenizers",
                       "qdrant_client", "chonkie", "sentence_transformers", "model_signing",
                       "sigstore", "tuf", "datasets")
#: Read by the libraries when they are imported (after the block opens, e.g. in the CLI).
_QUIET_ENVIRONMENT = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_VERBOSITY": "error",
                      "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
_NO_BARS_ENVIRONMENT = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}

_lock = threading.RLock()
_depth = 0
_undo: list[Any] = []


@contextlib.contextmanager
def quiet_libraries(verbose: bool | None = None, *, progress: bool | None = None,
                    import_first: tuple[str, ...] = ()) -> Iterator[None]:
    """Apply the two rules above for the block (the first block to open sets them for all
    that overlap it).

    Args:
        verbose: let third-party warnings through (default: ``CUBEPACK_VERBOSE``).
        progress: allow progress bars (default: only on a terminal, see above; ``False`` for
            output that is a report, such as the benchmarks' and the test models' builds).
        import_first: modules to import (if not yet imported) before the rules are applied,
            with all logging and warnings off: libraries that log at import (MemOS does) and
            configure their loggers then, so the levels set here are not overwritten later.
    """
    global _depth
    verbose = constants.verbose() if verbose is None else verbose
    with _lock:
        if _depth == 0:
            _undo.clear()
            try:
                _apply(verbose, constants.progress_enabled() if progress is None else progress,
                       import_first)
            except BaseException:
                _restore()
                raise
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _restore()


def _apply(verbose: bool, bars: bool, import_first: tuple[str, ...]) -> None:
    if verbose and bars:
        return
    if not verbose:
        catcher = warnings.catch_warnings()
        catcher.__enter__()
        _undo.append(lambda: catcher.__exit__(None, None, None))
        warnings.simplefilter("ignore")  # cubepack itself warns through its loggers only
    _import_silently(import_first)
    environment = {**({} if bars else _NO_BARS_ENVIRONMENT),
                   **({} if verbose else _QUIET_ENVIRONMENT)}
    for name, value in environment.items():
        previous = os.environ.get(name)
        os.environ[name] = value
        _undo.append(lambda name=name, previous=previous: _set_env(name, previous))
    if not bars:
        _no_bars()
    if not verbose:
        _quiet_loggers()


def _restore() -> None:
    while _undo:
        undo = _undo.pop()
        with contextlib.suppress(Exception):
            undo()


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _import_silently(names: tuple[str, ...]) -> None:
    missing = [name for name in names if name not in sys.modules]
    if not missing:
        return
    disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in missing:
                with contextlib.suppress(ImportError):
                    importlib.import_module(name)
    finally:
        logging.disable(disabled)


def _no_bars() -> None:
    """Bars off in huggingface_hub and transformers, if imported (else the environment
    variable set above turns them off at their import). Restored in reverse: transformers'
    switch first (it turns huggingface_hub's on too), then huggingface_hub's exact states."""
    if "huggingface_hub" in sys.modules:
        with contextlib.suppress(Exception):
            hub_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")  # the module
            states = dict(hub_tqdm.progress_bar_states)
            hub_tqdm.disable_progress_bars()
            _undo.append(lambda: (hub_tqdm.progress_bar_states.clear(),
                                  hub_tqdm.progress_bar_states.update(states)))
    if "transformers" in sys.modules:
        with contextlib.suppress(Exception):
            from transformers.utils import logging as transformers_logging

            if transformers_logging.is_progress_bar_enabled():
                transformers_logging.disable_progress_bar()
                _undo.append(transformers_logging.enable_progress_bar)


def _quiet_loggers() -> None:
    """Each third-party logger that decides (its own level, or none and its parent's) at
    ERROR; children that set a level of their own too."""
    for name in THIRD_PARTY_LOGGERS:
        _raise_level(logging.getLogger(name))
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if (isinstance(logger, logging.Logger) and logger.level != logging.NOTSET
                and name.split(".")[0] in THIRD_PARTY_LOGGERS and "." in name):
            _raise_level(logger)


def _raise_level(logger: logging.Logger) -> None:
    previous = logger.level
    if previous == logging.NOTSET or previous < logging.ERROR:
        logger.setLevel(logging.ERROR)
        _undo.append(lambda: logger.setLevel(previous))


def quietly(*, import_first: tuple[str, ...] = ()) -> Any:
    """Decorator: run the function inside :func:`quiet_libraries` (the MemOS hook's entry
    points: a user's one call, whose third-party output is cubepack's to keep tidy)."""
    import functools

    def decorate(function: Any) -> Any:
        @functools.wraps(function)
        def quiet_call(*args: Any, **kwargs: Any) -> Any:
            with quiet_libraries(import_first=import_first):
                return function(*args, **kwargs)
        return quiet_call
    return decorate


def terminal_bars(function: Any) -> Any:
    """Decorator for the Python API's entry points (push, pull, pack, ...): the first rule for
    the call, progress bars only on a terminal (``cubepack.push`` from a script drew
    huggingface_hub's "Upload 0 LFS files: 0it" into its log). The libraries' warnings stay as
    the caller configured them: hiding those is the CLI's and the MemOS hook's choice."""
    import functools

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        with quiet_libraries(verbose=True):
            return function(*args, **kwargs)
    return call
