"""Adversary tests (round 29): helpers in this folder are importable by name."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
