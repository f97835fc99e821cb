"""mkdocs hooks.

- Make this checkout's ``cubepack`` importable for mkdocs-click (the CLI reference is generated
  from ``cubepack.cli:cli``) without installing it into the docs environment; ``import
  cubepack.cli`` imports click and PyYAML only, never torch.
- Generate the module map (``<!-- module-map -->`` on a page) from the code: the layers are
  ``LAYERS`` in tests/test_architecture.py (the rule the import test enforces), each module's
  line the first sentence of its own docstring. Read with ``ast``, nothing imported, so the map
  cannot drift from the package and the docs environment needs no torch.
- In the CLI reference, an option without a default shows none (not click's UNSET sentinel).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cubepack"
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
    return markdown


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
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?(\w+)`", r"`\1`", text)  # :class:`~a.B` -> `B`
    return text.replace("``", "`").replace("|", "\\|")


def _modules(part: str) -> list[tuple[str, Path]]:
    """(dotted name, file) of a part: a subpackage's modules, or one module."""
    name = part.removeprefix("cubepack").lstrip(".")
    folder = PACKAGE / name if name else None
    if folder is not None and folder.is_dir():
        return [(f"{part}.{path.stem}" if path.stem != "__init__" else part, path)
                for path in sorted(folder.glob("*.py"))]
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
