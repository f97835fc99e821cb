"""What every benchmark needs: a plain hashlib pass (the baseline), and timers. Benchmarks are
run as scripts, so this folder is on ``sys.path`` and ``import _common`` finds it."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Callable


def hashlib_file(path: Path) -> str:
    """sha256 of a file with plain hashlib in 8 MiB reads: the baseline cubepack is held to."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(8 * 1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def best_of(action: Callable[[], object], repeats: int) -> float:
    return min(timed(action) for _ in range(repeats))
