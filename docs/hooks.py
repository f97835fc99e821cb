"""mkdocs hooks: make this checkout's ``cubepack`` importable for mkdocs-click (the CLI
reference is generated from ``cubepack.cli:cli``) without installing it into the docs
environment; ``import cubepack.cli`` imports click and PyYAML only, never torch."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
