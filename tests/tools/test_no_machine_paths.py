"""No path of our own machines in the project (#31 item 6): a user's clone has none of them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Folders that exist only on the machines this project was built on.
MACHINE_PATHS = re.compile(r"/work/(?:main|wt-|\.mirror|\.library|shared)|/root/")


def test_no_tracked_file_names_a_folder_of_our_machines():
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    found = []
    for name in filter(None, listing):
        path = ROOT / name
        if not path.is_file() or name == "tests/tools/test_no_machine_paths.py":
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{name}:{n}: {line.strip()}" for n, line in
                  enumerate(text.splitlines(), 1) if MACHINE_PATHS.search(line)]
    assert found == []
