"""mkdocs hooks.

- Make this checkout's ``cubepack`` importable for mkdocs-click (the CLI reference is generated
  from ``cubepack.cli:cli``) without installing it into the docs environment; ``import
  cubepack.cli`` imports click and PyYAML only, never torch.
- Generate the module map (``<!-- module-map -->`` on a page) from the code: the layers are
  ``LAYERS`` in tests/test_architecture.py (the rule the import test enforces), each module's
  line the first sentence of its own docstring. Read with ``ast``, nothing imported, so the map
  cannot drift from the package and the docs environment needs no torch.
- In the CLI reference, an option without a default shows none (not click's UNSET sentinel).
- Include a file of the repository's root into a page (``--8<-- "SECURITY.md"``, where GitHub
  shows it) with its relative links made relative to the page: written for the root, a link to
  ``docs/explanation/proof-bound.md`` would lead nowhere from ``explanation/threat-model.md``.
  Done here, before pymdownx.snippets would include the file as is.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cubepack"
DOCS = ROOT / "docs"
MODULE_MAP_MARK = "<!-- module-map -->"


def on_config(config):
    # Done here, not at import: mkdocs puts the hook's own folder first on sys.path while it
    # imports the hook and then deletes sys.path[0], which would take this entry with it.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return config


def on_page_content(html, page, config, files):
    # click 8.3 gives an option with no default the sentinel UNSET, which mkdocs-click 0.9
    # prints as its repr in the CLI reference's Default column: show no default instead.
    return html.replace("<td><code>Sentinel.UNSET</code></td>", "<td></td>")


def on_page_markdown(markdown, page, config, files):
    if MODULE_MAP_MARK in markdown:
        markdown = markdown.replace(MODULE_MAP_MARK, module_map())
    return ROOT_INCLUDE.sub(lambda match: root_file(match[1], page.file.src_uri), markdown)


ROOT_INCLUDE = re.compile(r'^--8<-- "([^"/]+\.md)"$', re.MULTILINE)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def root_file(name: str, page: str) -> str:
    """The root file ``name`` as the page ``page`` (relative to docs/) includes it: each link
    into docs/ made relative to the page (others are left for mkdocs to judge)."""
    text = (ROOT / name).read_text(encoding="utf-8")
    folder = (DOCS / page).parent

    def relink(match: re.Match) -> str:
        target = match[1]
        path, _, anchor = target.partition("#")
        if re.match(r"[a-z]+:", target) or not path:
            return match[0]
        resolved = (ROOT / path).resolve()
        if DOCS not in resolved.parents:
            return match[0]
        relative = Path(os.path.relpath(resolved, folder)).as_posix()
        return f"]({relative}{'#' + anchor if anchor else ''})"

    return _LINK.sub(relink, text)


def layers() -> list[list[str]]:
    """``LAYERS`` of tests/test_architecture.py, floor first: each layer's part names."""
    tree = ast.parse((ROOT / "tests" / "test_architecture.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "LAYERS"
                                                for target in node.targets):
            return [sorted(ast.literal_eval(layer)) for layer in node.value.elts]
    raise LookupError("tests/test_architecture.py defines no LAYERS")


def _summary(path: Path) -> str:
    """The first sentence of a module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    if ". " in text:
        text = text.split(". ")[0] + "."
    text = re.sub(r":\w+:`~?\.*(?:[\w.]+\.)?(\w+)`", r"`\1`", text)  # :class:`~a.B`, :mod:`._b`
    return text.replace("``", "`").replace("|", "\\|")


def _modules(part: str) -> list[tuple[str, Path]]:
    """(dotted name, file) of a part: a subpackage's modules (its own subpackages' too, such
    as ``format.sections``), or one module."""
    name = part.removeprefix("cubepack").lstrip(".")
    folder = PACKAGE / name if name else None
    if folder is not None and folder.is_dir():
        found = []
        for path in sorted(folder.rglob("*.py")):
            inner = path.relative_to(folder).with_suffix("").parts
            found.append((".".join([part, *(inner[:-1] if inner[-1] == "__init__" else inner)]),
                          path))
        return found
    path = PACKAGE / f"{name}.py" if name else PACKAGE / "__init__.py"
    return [(part, path)] if path.is_file() else []


def module_map() -> str:
    """The module map as Markdown: one table per layer, floor first."""
    out = []
    for number, parts in enumerate(layers()):
        out.append(f"**Layer {number}**: " + ", ".join(f"`{part}`" for part in parts) + "\n")
        out.append("| module | what it is |\n|---|---|")
        for part in parts:
            for dotted, path in _modules(part):
                out.append(f"| `{dotted}` | {_summary(path)} |")
        out.append("")
    return "\n".join(out)
