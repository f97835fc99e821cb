"""mkdocs hooks: make this checkout's ``cubepack`` importable for mkdocs-click (the CLI
reference is generated from ``cubepack.cli:cli``) without installing it into the docs
environment; ``import cubepack.cli`` imports click and PyYAML only, never torch."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def on_config(config):
    # Done here, not at import: mkdocs puts the hook's own folder first on sys.path while it
    # imports the hook and then deletes sys.path[0], which would take this entry with it.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return config
