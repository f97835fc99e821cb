"""The documentation's pages and their code blocks, read the one way every docs test reads
them: ``README.md`` and every page under ``docs/``.

A code block is a fenced block (```` ```python ````, ```` ```bash ````; others, such as
``text``, ``json`` or ``yaml``, show output or a format and are not code to run). It may be
inside a list item (indented). An HTML comment on the line right before its fence marks it:

- ``<!-- not-run: WHY -->``: the docs test does not run it; WHY says why (required);
- ``<!-- docs-test: setup NAME ... -->`` anywhere on a page: what the docs test lays out in the
  page's folder before its first block (see ``tests/docs/test_code_blocks.py``), the same the
  page tells its reader to have.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUNNABLE = ("python", "bash")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
_MARK = re.compile(r"^\s*<!--\s*not-run:(?P<why>.*?)-->\s*$")
_SETUP = re.compile(r"<!--\s*docs-test:\s*setup\s+(?P<names>[\w\s,-]+?)\s*-->")


@dataclass(frozen=True)
class Block:
    page: Path        # relative to the repository root
    line: int         # of the opening fence, 1-based
    lang: str
    code: str
    not_run: str | None  # the reason given, or None (the block runs)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """README.md and every Markdown page of the site, relative to the repository root."""
    found = [Path("README.md")]
    found += sorted(path.relative_to(ROOT) for path in DOCS.rglob("*.md"))
    return found


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        lang = (opening["info"].strip().split() or [""])[0].strip("{}.").lower()
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not (lines[end].strip().startswith(fence)
                                        and lines[end].strip().strip(fence[0]) == ""):
            line = lines[end]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            end += 1
        before = index - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        mark = _MARK.match(lines[before]) if before >= 0 else None
        found.append(Block(page, index + 1, lang, "\n".join(body) + "\n",
                           mark["why"].strip() if mark else None))
        index = end + 1
    return found


def code_blocks(page: Path) -> list[Block]:
    """The blocks of ``page`` that are code (Python or shell)."""
    return [block for block in blocks(page) if block.lang in RUNNABLE]


def setups(page: Path) -> list[str]:
    """The setups ``page`` asks of the docs test (``<!-- docs-test: setup ... -->``)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    return [name for match in _SETUP.finditer(text)
            for name in re.split(r"[\s,]+", match["names"]) if name]


def python_code(page_list: list[Path] | None = None) -> str:
    """Every Python block of the given pages (default: all), joined."""
    return "\n".join(block.code for page in (page_list or pages()) for block in blocks(page)
                     if block.lang == "python")
