"""The fresh-clone promise, checked: ``fresh_clone.py PYTHON...``.

A user's clone has no ``../shared`` beside it (CI's checkout does). This copies the checkout's
files (``git ls-files``: what a clone holds, with this working tree's edits) into a new
temporary folder, where no ``shared/`` sits beside it, and with each interpreter given:

- collects the whole suite there (a module that reads ``../shared`` at import fails here), and
- runs every test module that uses MemOS's example cubes (``EXAMPLES``): their tests of the
  examples must skip with a reason, the rest pass.

The copy's own ``cubepack`` is imported (``PYTHONPATH``), not the checkout's editable install.
Standard library only. Exit status: non-zero when any step fails.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The name tests/support/data.py gives MemOS's example cubes in ../shared.
FIXTURES_NAME = "EXAMPLES"


def tracked_files() -> list[str]:
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], cwd=ROOT, capture_output=True, check=True)
    return [name for name in listing.stdout.decode().split("\0")
            if name and (ROOT / name).is_file()]


def main(pythons: list[str]) -> int:
    pythons = [str(Path(python).absolute()) for python in pythons]
    if not pythons:
        sys.stderr.write("usage: fresh_clone.py PYTHON...\n")
        return 2
    with tempfile.TemporaryDirectory(prefix="cubepack-fresh-") as parent:
        clone = Path(parent) / "clone" / "cubepack"
        for name in tracked_files():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
        assert not (clone.parent.parent / "shared").exists()
        env = {**os.environ, "PYTHONPATH": str(clone)}
        # One thread per interpreter (each mostly waits on its pytest); outputs kept apart.
        with concurrent.futures.ThreadPoolExecutor(len(pythons)) as pool:
            outcomes = list(pool.map(lambda python: _check(python, clone, env), pythons))
        for lines, _ in outcomes:
            sys.stdout.write(lines)
        failed = sum(bad for _, bad in outcomes)
        return 1 if failed else 0


def _check(python: str, clone: Path, env: dict[str, str]) -> tuple[str, int]:
    """(what to print, how many steps failed) for one interpreter."""
    lines, failed = "", 0
    for what, extra in (("collects", ["--collect-only"]),
                        ("skips without ../shared", ["-rs", *_present(clone)])):
        command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra]
        done = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True)
        last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
        lines += f"fresh clone, {Path(python).parts[-3]}: {what}: {last}\n"
        if done.returncode != 0:
            failed += 1
            lines += done.stdout[-6000:] + done.stderr[-3000:]
    return lines, failed


def _present(clone: Path) -> list[str]:
    """Every test module that uses ../shared's fixtures (found, not listed)."""
    return sorted(str(path.relative_to(clone)) for path in (clone / "tests").rglob("test_*.py")
                  if FIXTURES_NAME in path.read_text(encoding="utf-8"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
