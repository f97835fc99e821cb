"""tools/memos_own_tests.py takes the MemOS checkout as an argument, never a folder of ours."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "memos_own_tests.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True)


def test_without_a_checkout_it_says_how_to_get_one():
    done = _run()
    assert done.returncode == 2
    assert "checkout" in done.stderr and "Traceback" not in done.stderr


def test_a_checkout_that_is_not_a_folder_is_refused_with_the_clone_command(tmp_path):
    done = _run(str(tmp_path / "absent"))
    assert done.returncode == 2
    assert "git clone https://github.com/MemTensor/MemOS" in done.stderr
    assert "Traceback" not in done.stderr
