"""What every benchmark needs: a plain hashlib pass (the baseline), timers, and a report with
no progress bar ("Loading weights", "Fetching N files") or library warning in it, even on a
terminal (set when this module is imported; every benchmark imports it). Benchmarks are run as
scripts, so this folder is on ``sys.path`` and ``import _common`` finds it."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def needs(environment: str, run: str, *, modules: tuple[str, ...] = (),
          variables: tuple[str, ...] = ()) -> None:
    """Decline, in one line naming the environment and how to run the benchmark there, when a
    module it imports or a variable it reads is missing (it died with ``No module named 'mlx'``
    or ``KeyError: 'CUBEPACK_LLAMACPP_CONVERT'``); exit status 2, no traceback. Called before
    the benchmark imports anything of that environment."""
    missing = [f"the {name} package" for name in modules if importlib.util.find_spec(name) is None]
    missing += [name for name in variables if not os.environ.get(name)]
    if missing:
        script = Path(sys.argv[0]).name
        print(f"bench/{script} needs the {environment} environment ({', '.join(missing)} "
              f"missing here): run {run}", file=sys.stderr)
        raise SystemExit(2)


# Every benchmark imports this module first: an interpreter without cubepack and torch (the
# system python, say) declines here, in one line, instead of a traceback.
needs("latest", f".venv/latest/bin/python bench/{Path(sys.argv[0]).name} (make setup builds "
      "it)", modules=("cubepack", "torch", "transformers"))

from cubepack._util.quiet import quiet_libraries  # noqa: E402 (after the check above)

_QUIET = quiet_libraries(progress=False)  # kept: for the benchmark's whole process
_QUIET.__enter__()


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


def paired_ratios(baseline: Callable[[], object], actions: dict[str, Callable[[], object]],
                  rounds: int) -> dict[str, list[float]]:
    """Each action's time over the baseline's, measured in the same round (baseline, then
    each action, ``rounds`` times): on a shared machine whose speed drifts by tens of percent
    over a minute, a ratio of two runs made seconds apart is what can be compared; a best-of
    baseline taken once, before runs that last minutes, is not."""
    ratios: dict[str, list[float]] = {name: [] for name in actions}
    for _ in range(rounds):
        base = timed(baseline)
        for name, action in actions.items():
            ratios[name].append(timed(action) / base)
    return ratios


def llama_config(layers: int, hidden: int):
    """The benchmarks' Llama shape: ``layers`` layers of width ``hidden``, 8 query heads over 4
    KV heads, the tiny tokenizer's vocabulary (transformers imported here: the hashing
    benchmarks never load it)."""
    from transformers import LlamaConfig

    from cubepack.testing import tiny

    return LlamaConfig(vocab_size=tiny.VOCAB_SIZE, hidden_size=hidden,
                       intermediate_size=hidden * 2, num_hidden_layers=layers,
                       num_attention_heads=8, num_key_value_heads=4,
                       max_position_embeddings=4096)


def sha256_limit(cores: int, elapsed: bool = False) -> float:
    """Bytes a second ``cores`` cores can sha256, from ``openssl speed`` at 16 KiB blocks for
    one second (one core's figure times ``cores``; openssl's counts are 1000s of bytes).
    ``openssl speed`` divides by the CPU time it was given, not the wall clock: on a shared
    machine that is the cores' speed unloaded. ``elapsed``: ``cores`` processes at once
    (``-multi``) over the wall clock (``-elapsed``), what the machine gives now, under the same
    load as what it is compared with."""
    command = ["openssl", "speed", "-evp", "sha256", "-bytes", "16384", "-seconds", "1"]
    if elapsed:
        command[2:2] = ["-elapsed"] + (["-multi", str(cores)] if cores > 1 else [])
        cores = 1  # -multi reports the processes' sum
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    found = re.search(r"^sha256\s+([0-9.]+)k\s*$", out, re.MULTILINE | re.IGNORECASE)
    if found is None:
        raise SystemExit(f"cannot read openssl speed's output:\n{out}")
    return float(found.group(1)) * 1000 * cores
