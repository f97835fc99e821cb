"""The README's first Python example is ``examples/quickstart.py`` and runs as written, in
every environment: A's cache loads into A and is refused for B, naming the field."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "quickstart.py"


def test_the_readme_shows_the_example_file():
    first = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL).group(1)
    assert first == EXAMPLE.read_text()


def test_the_quickstart_runs_as_written(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loaded 5 positions" in done.stdout
    assert re.search(r"refused: .*weights_digest: expected sha256:\w+, found sha256:\w+",
                     done.stdout)
    assert "deprecated" not in done.stderr
