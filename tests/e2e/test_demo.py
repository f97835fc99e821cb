"""``make demo`` runs, shows the bug, the refusal and the pinned load, and prints commands that
ran as printed (memos environment: the demo drives the real MemoryOS package)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")


def test_the_demo_shows_why_and_the_fix(tmp_path):
    done = subprocess.run([sys.executable, "-m", "cubepack.demo", str(tmp_path / "demo-out")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    plain, pinned = re.findall(r"top-1 tokens agree on (\d+) of (\d+) steps", out)
    assert int(plain[0]) < int(plain[1])          # plain MemOS: B's answers changed, silently
    assert pinned[0] == pinned[1]                 # the pinned cube: A's cache, A's answers
    assert "refused: KV cache" in out and "weights_digest: expected" in out
    commands = re.findall(r"^\$ (cubepack .*)$", out, flags=re.MULTILINE)
    assert [c.split()[1] for c in commands] == ["hub", "pack", "push", "pull"]
    assert "export HF_ENDPOINT=" in out and "memos" not in done.stderr.lower()
