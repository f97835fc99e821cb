"""Environment-driven defaults, read in one place.

cubepack honours the Hub's own variables (``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HUB_OFFLINE``,
``HF_HUB_CACHE``) through huggingface_hub itself, and adds a few of its own:

- ``CUBEPACK_CACHE``: where the weight-hash cache lives (default ``$XDG_CACHE_HOME/cubepack``).
- ``CUBEPACK_NO_PROGRESS=1`` (or ``HF_HUB_DISABLE_PROGRESS_BARS=1``): no progress bars.
- ``CUBEPACK_VERBOSE=1`` (the CLI's ``--verbose``): show third-party libraries' warnings and
  log lines (hidden in cubepack's commands and MemOS hook calls otherwise, see ``_util.quiet``).
- ``CUBEPACK_HUB_TIMEOUT``: seconds a pull or push may take talking to the endpoint.
- ``CUBEPACK_LOW_SPEED_LIMIT`` and ``CUBEPACK_LOW_SPEED_TIME``: a request of a pull or push that
  moves fewer than LIMIT bytes/s for TIME seconds is a stall, and ends the operation (as curl's
  ``--speed-limit`` / ``--speed-time``; ``CUBEPACK_LOW_SPEED_LIMIT=0`` turns the rule off).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import UsageError

KV_FORMAT_NAME = "cubepack.kv"
#: Version 2 added the compute config and the behavioural tokenizer digest to the producer;
#: version 3 a checksum of every tensor (``checksums``, see ``kv._checksum``), checked at every
#: load. Version 1 files are still read (``inspect``, ``upgrade``) but never loaded into a
#: model; version 2 files load, unchecked, and say so.
KV_FORMAT_VERSION = 3
KV_READABLE_VERSIONS = (1, 2, 3)
#: The first KV format whose producer identity can be checked against a live model.
KV_CHECKABLE_VERSION = 2
#: The first KV format whose header records a checksum per tensor.
KV_CHECKSUM_VERSION = 3
KV_METADATA_KEY = "cubepack"
LOCK_FILENAME = "cubepack.lock"
#: Version 2 pins identities with a compute config (see KV_FORMAT_VERSION); version 3 adds the
#: optional ``adapters`` (parametric memory) and ``lineage`` (derived from which cube) sections;
#: version 4 closes every key set (a key the format does not define is refused, not ignored).
#: Versions 2 and 3 are still read as written (see ``format._lock.SECTIONS``).
LOCK_VERSION = 4
#: The lock version of a sharded cube (its ``shards`` section: format/sections/shards.py).
SHARDED_LOCK_VERSION = 6
#: The lock version of a sharded cube after an incremental pack (ranges that overlap, dead
#: bytes: format/sections/shards.py); ``compact`` brings it back to 6.
APPENDED_LOCK_VERSION = 7
CONFIG_FILENAME = "cubepack.yaml"
#: MemOS's cube config, a cube's ``config.json``: which memories it holds, their backends and
#: models (read by MemOS's own load; cubepack checks it, never runs what it names).
MEMOS_CONFIG = "config.json"
#: A transformers (or MLX) model folder's config: the same name as MemOS's, another file.
MODEL_CONFIG = "config.json"
CONFIG_SCHEMA_VERSION = 1
SIGNATURE_FILENAME = "cubepack.sig"
#: The cube's signed in-toto attestation (a DSSE envelope whose subject is the lock's digest):
#: beside the signature, not in the lock (it names the lock), covered by ``cubepack.sig``.
ATTESTATION_FILENAME = "cubepack.intoto.json"
#: A derived cube's ancestors' attestations, parent first (``{"envelopes": [...]}``), copied
#: by ``migrate`` from the parent; listed in the lock like any file.
ANCESTORS_FILENAME = "lineage/ancestors.intoto.json"
CARD_FILENAME = "README.md"
ACTIVATIONS_DIR = "activations"
KV_SUFFIX = ".kv.safetensors"
#: A vLLM activation memory's prompts (vLLM prefills them on its server: no tensors to ship).
PROMPTS_FILE = "activations/prompts.json"
PROMPTS_FORMAT = "cubepack.prompts"
#: Parametric memory: each LoRA adapter in PEFT's layout, ``parametric/<name>/`` holding
#: ``adapter_config.json`` and ``adapter_model.safetensors`` (and whatever else PEFT wrote).
PARAMETRIC_DIR = "parametric"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: An adapter's name (its folder's): a plain name, as the lock's ``adapters`` keys.
ADAPTER_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"

_TRUE = {"1", "true", "yes", "on"}
#: Seconds a pull or push may take talking to the endpoint, unless told otherwise: an hour
#: moves ~10 GB at 25 Mbit/s, more than any cube we have seen, yet a stalled or trickling
#: endpoint cannot keep a job (or CI) waiting forever.
DEFAULT_HUB_TIMEOUT = 3600.0
#: The low-speed rule's defaults (see :func:`low_speed`). 1 KiB/s is 8 kbit/s, under any link
#: that works at all (GPRS does ~40 kbit/s) and ~2,000x a hostile byte every 2 s; 30 s rides out
#: what honest endpoints and links do (a few TCP retransmissions backing off 1+2+4+8 s, a Wi-Fi
#: roam, a slow first byte from object storage), and ends a trickle within a minute, where the
#: overall deadline (an hour, sized for large honest transfers) would let it run for an hour.
DEFAULT_LOW_SPEED_LIMIT = 1024.0
DEFAULT_LOW_SPEED_TIME = 30.0


def env_flag(name: str) -> bool:
    """True when the environment variable ``name`` is set to 1/true/yes/on."""
    return os.environ.get(name, "").strip().lower() in _TRUE


def cache_dir() -> Path:
    explicit = os.environ.get("CUBEPACK_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cubepack"


def cubes_dir() -> Path:
    """Where the MemOS hook places the cubes it pulls (``$CUBEPACK_CACHE/cubes``): one folder
    per repo and commit, reused by later loads, instead of a temporary folder per load."""
    return cache_dir() / "cubes"


def hash_cache_path() -> Path:
    return cache_dir() / "file-hashes.sqlite3"


def progress_enabled() -> bool:
    """Progress bars only on a terminal: never in a log, a pipe or CI."""
    if env_flag("CUBEPACK_NO_PROGRESS") or env_flag("HF_HUB_DISABLE_PROGRESS_BARS"):
        return False
    stream = sys.stderr
    return bool(stream is not None and getattr(stream, "isatty", lambda: False)())


def verbose() -> bool:
    """``CUBEPACK_VERBOSE=1``: let third-party warnings and log lines through."""
    return env_flag("CUBEPACK_VERBOSE")


def hub_offline() -> bool:
    return env_flag("HF_HUB_OFFLINE")


def hub_timeout(seconds: float | None = None) -> float:
    """The deadline of a pull or push: ``seconds`` if given, else ``CUBEPACK_HUB_TIMEOUT``,
    else :data:`DEFAULT_HUB_TIMEOUT`.

    Raises:
        UsageError: not a positive number of seconds.
    """
    source = "--timeout"
    if seconds is None:
        text = os.environ.get("CUBEPACK_HUB_TIMEOUT", "").strip()
        if not text:
            return DEFAULT_HUB_TIMEOUT
        source = "CUBEPACK_HUB_TIMEOUT"
        try:
            seconds = float(text)
        except ValueError:
            raise UsageError(f"CUBEPACK_HUB_TIMEOUT={text!r} is not a number of seconds.") from None
    if not seconds > 0 or seconds == float("inf"):
        raise UsageError(f"{source} must be a positive number of seconds, not {seconds!r}.")
    return float(seconds)


def low_speed() -> tuple[float, float] | None:
    """The low-speed rule of a pull or push: ``(bytes_per_second, seconds)`` from
    ``CUBEPACK_LOW_SPEED_LIMIT`` and ``CUBEPACK_LOW_SPEED_TIME`` (defaults
    :data:`DEFAULT_LOW_SPEED_LIMIT`, :data:`DEFAULT_LOW_SPEED_TIME`), or None when the limit is
    0 (the rule is off). The rule itself is :class:`cubepack.hub._stall.LowSpeed`.

    Raises:
        UsageError: a limit that is not a number >= 0, a time that is not a number > 0.
    """
    limit = _env_number("CUBEPACK_LOW_SPEED_LIMIT", DEFAULT_LOW_SPEED_LIMIT, "bytes per second")
    seconds = _env_number("CUBEPACK_LOW_SPEED_TIME", DEFAULT_LOW_SPEED_TIME, "seconds")
    if not limit >= 0 or limit == float("inf"):
        raise UsageError(f"CUBEPACK_LOW_SPEED_LIMIT must be a number of bytes per second >= 0 "
                         f"(0 turns the low-speed rule off), not {limit!r}.")
    if not seconds > 0 or seconds == float("inf"):
        raise UsageError(f"CUBEPACK_LOW_SPEED_TIME must be a positive number of seconds, not "
                         f"{seconds!r}.")
    return None if limit == 0 else (limit, seconds)


def _env_number(name: str, default: float, unit: str) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"{name}={text!r} is not a number of {unit}.") from None
