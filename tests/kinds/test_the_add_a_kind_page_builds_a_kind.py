"""The "Add a memory kind" page is a contract: its toy kind, added to a copy of the package
exactly as the page shows (its blocks, at the places it names), packs and verifies a cube, and
refuses what the page says it refuses. Each command runs in a process of its own, against the
copy."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import cubepack

PACKAGE = Path(cubepack.__file__).parent
PAGE = PACKAGE.parent / "docs" / "how-to" / "add-a-memory-kind.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)


def _edit(path: Path, after: str, text: str) -> None:
    source = path.read_text(encoding="utf-8")
    assert after in source, f"the page names a place {path.name} does not have: {after!r}"
    path.write_text(source.replace(after, after + text, 1), encoding="utf-8")


def _copy_with_the_toy_kind(root: Path) -> Path:
    """The package and its checks page, copied to ``root``, with the page's blocks added."""
    shutil.copytree(PACKAGE, root / "cubepack", ignore=shutil.ignore_patterns("__pycache__"))
    if (PACKAGE.parent / "templates").is_dir():  # the card's template, beside a checkout's
        shutil.copytree(PACKAGE.parent / "templates", root / "templates")
    (root / "docs" / "reference").mkdir(parents=True)
    shutil.copy(PACKAGE.parent / "docs" / "reference" / "checks.md",
                root / "docs" / "reference" / "checks.md")
    entry, face, kind, registry = _blocks("python")
    # 1. the check, after ADAPTER's entry (the page's place); its row, after adapter's row
    checks = root / "cubepack" / "_util" / "checks.py"
    adapter = next(line + "\n" for line in checks.read_text().splitlines()
                   if line.strip().startswith("ADAPTER = "))
    _edit(checks, adapter, entry)
    page = (root / "docs" / "reference" / "checks.md")
    row = next(line + "\n" for line in page.read_text().splitlines()
               if line.startswith("| `adapter` |"))
    _edit(page, row, _blocks("markdown")[0])
    # 2. the folder
    (root / "cubepack" / "kinds" / "notes").mkdir()
    (root / "cubepack" / "kinds" / "notes" / "__init__.py").write_text(face)
    (root / "cubepack" / "kinds" / "notes" / "_kind.py").write_text(kind)
    # 3. the registry: the page's import and KINDS line in place of today's
    registry_file = root / "cubepack" / "kinds" / "__init__.py"
    source = registry_file.read_text()
    importing, _, kinds_line = registry.strip().partition("\n\n")
    source = re.sub(r"^KINDS: tuple\[Kind, \.\.\.\] = .*$", kinds_line.strip(), source,
                    flags=re.M)
    source = source.replace("from .vectors import KIND as _VECTORS\n",
                            f"from .vectors import KIND as _VECTORS\n{importing.strip()}\n")
    registry_file.write_text(source)
    return root


def _run(copy: Path, where: Path, *args: str, code: int = 0) -> str:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    done = subprocess.run([sys.executable, "-m", "cubepack", *args], cwd=where, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == code, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_the_page_s_toy_kind_packs_verifies_and_refuses_what_it_says(tmp_path):
    copy = _copy_with_the_toy_kind(tmp_path / "tree")
    where = tmp_path / "work"
    (where / "bundle" / "notes").mkdir(parents=True)
    (where / "bundle" / "notes" / "hello.md").write_text("# hello\n")
    _run(copy, where, "pack", "bundle", "--cube-id", "me/notes")
    assert "  notes:\n  - notes/hello.md" in (where / "bundle" / "cubepack.yaml").read_text()
    assert re.search(r"ok +note .*the 1 intact notes have a title",
                     _run(copy, where, "verify", "bundle"))
    # changed after packing: the file checks refuse it, and the note is never read
    (where / "bundle" / "notes" / "hello.md").write_text("no title\n")
    refused = _run(copy, where, "verify", "bundle", code=1)
    assert "size differs" in refused and not re.search(r"^\S+ +note ", refused, re.M)
    # packed without a title: the kind's own check refuses it, with its fix
    _run(copy, where, "pack", "bundle", "--cube-id", "me/notes")
    refused = _run(copy, where, "verify", "bundle", code=1)
    assert "has no title line" in refused and "give each note a title line" in refused
    # the architecture holds: nothing of the kind is in ops, the checks page lists its check
    test = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(Path(__file__).parent / "test_ops_holds_no_kind.py")],
        env={**os.environ, "PYTHONPATH": str(copy)}, capture_output=True, text=True,
        timeout=600, cwd=PACKAGE.parent)
    assert test.returncode == 0, test.stdout[-2000:]
