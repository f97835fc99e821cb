"""What every compatibility-fixture writer shares (tools/make_compat_fixtures.py and the older
commits' writers beside this file): where fixtures go, the fixed inputs, how a fixture is
described. No cubepack import: an older writer runs with an older cubepack first on its path."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "compat"
KEYS = OUT / "keys"
#: Where inputs are built; fixed, because some of its paths are written into fixtures (a pin's
#: model name, MemOS's config.json).
WORK = Path(tempfile.gettempdir()) / "cubepack-compat-fixtures"
#: The token ids of lone KV files (as tests/support/data.py's prompt).
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
#: The MemOS dump every cube with activations is packed from.
MEMOS_DUMP = OUT / "memos-pickle" / "cube"


def env_name() -> str:
    """``latest`` (transformers 5) or ``memos`` (transformers 4.57)."""
    import transformers

    return "latest" if int(transformers.__version__.split(".")[0]) >= 5 else "memos"


def model_folders() -> dict[str, Path]:
    """The tiny models (built by ``make_compat_fixtures.py --models`` with today's
    ``cubepack.testing.tiny``) as this environment's transformers saved them."""
    root = WORK / f"models-{env_name()}"
    return {"a": root / "model-a", "b": root / "model-b", "e": root / "encoder-e"}


def fresh(name: str, artefact: str = "cube") -> Path:
    """An empty fixture folder ``name``; returns the path of its artefact (not made)."""
    folder = OUT / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder / artefact


def describe(name: str, *, what: str, commit: str, how: str, expect: dict) -> None:
    """Write ``name``'s ``fixture.json`` (read by tests/format/test_compat_fixtures.py) and its
    one-line README."""
    folder = OUT / name
    spec = {"what": what, "writer": {"commit": commit, "how": how}, **expect}
    (folder / "fixture.json").write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
    (folder / "README.md").write_text(
        f"# {name}\n\n{what} Written by cubepack commit {commit[:10]}: {how}\n")
