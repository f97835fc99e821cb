"""Large, valid data files for benchmarks, written fast and without torch.

A cube may only hold files of kinds ``verify`` accepts, so benchmark payloads are real
safetensors files (one ``U8`` tensor), not arbitrary bytes.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path


def write_safetensors_blob(path: str | Path, nbytes: int, *, seed: int = 0,
                           block: bytes | None = None) -> Path:
    """Write a safetensors file holding one ``U8`` tensor ``data`` of ``nbytes`` bytes.

    ``seed`` makes the first bytes differ between files (so no two share a blob); ``block`` is
    the repeated filler (random by default).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = json.dumps({"data": {"dtype": "U8", "shape": [nbytes],
                                  "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    block = block or os.urandom(8 * 1024 * 1024)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header)
        first = seed.to_bytes(8, "little")[: min(8, nbytes)]
        handle.write(first)
        written = len(first)
        while written < nbytes:
            chunk = block[: min(len(block), nbytes - written)]
            handle.write(chunk)
            written += len(chunk)
    return path
