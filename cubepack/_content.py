"""What a packed cube may hold: the one rule ``pack`` and ``verify`` both apply.

``pack`` refuses to write a cube that ``verify`` would refuse, so every cube cubepack writes
verifies: both call :func:`file_problem` on every file.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from . import _constants as constants

#: File suffixes of pickle-based formats (torch.save checkpoints are zips of pickles).
PICKLE_SUFFIXES = (".pickle", ".pkl", ".pt", ".pth", ".bin", ".ckpt", ".joblib")


def is_activation_path(name: str) -> bool:
    """True for ``activations/<id>.kv.safetensors``: a file the lock lists as an activation."""
    return name.startswith(constants.ACTIVATIONS_DIR + "/") and name.endswith(constants.KV_SUFFIX)


def file_problem(path: Path, name: str) -> str | None:
    """Why the file ``name`` (at ``path``) may not ship in a cube, or None when it may."""
    return pickle_evidence(path, name)


def pickle_evidence(path: Path, name: str) -> str | None:
    """Why the file at ``path`` is (or holds) a pickle, or None. Reads at most its zip index."""
    if name.lower().endswith(PICKLE_SUFFIXES):
        return f"has a pickle-format suffix ({Path(name).suffix}); cubes must not carry pickles"
    with open(path, "rb") as handle:
        head = handle.read(4)
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "starts with a pickle protocol header; cubes must not carry pickles"
    if head == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path) as archive:
                if any(entry.endswith((".pkl", ".pickle")) for entry in archive.namelist()):
                    return ("is a zip archive holding a pickle (torch.save format); cubes must "
                            "not carry pickles")
        except (zipfile.BadZipFile, OSError, ValueError):
            return None
    return None
