"""``make docs`` is strict, and the site it builds reads the way the README says.

Each test runs the Makefile's own targets (``make docs``, ``make docs-serve``) in a copy of this
checkout, with the docs environment found beside the running one (``make test``'s environments
and ``make docs``'s are siblings under ``.venv/``) or mkdocs in the running environment; it skips,
saying so, where there is neither. The copy is what a newcomer has: the tree as it is, so a
broken link in the real docs fails the clean build here as in CI.

- The tree builds with no warning.
- Each thing mkdocs' ``validation`` settings can catch is planted (a broken link, a broken
  anchor, an absolute link, a folder link, a page missing from the nav, a nav entry with no page,
  an absolute nav entry): the build fails and names every plant in a WARNING line. Strict mode
  fails a build on any WARNING, so each plant alone fails it too; the sweep is over the
  ``validation`` keys mkdocs.yml sets (a key added there needs a plant here).
- The Python API page renders its cross-references (no raw ``:func:`` text anywhere on the
  site; a reference to an object the site documents is a link).
- ``make docs-serve`` serves the site the README points to: pages at their folder URLs, and the
  search index (opened as files, the site has neither).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from docs_pages import ROOT

from envs import once


def _mkdocs() -> Path | None:
    """mkdocs in the running environment, else in the docs environment beside it."""
    for candidate in (Path(sys.executable).with_name("mkdocs"),
                      Path(sys.prefix).parent / "docs" / "bin" / "mkdocs"):
        if candidate.is_file():
            return candidate
    return None


MKDOCS = _mkdocs()
pytestmark = [
    once,
    pytest.mark.skipif(MKDOCS is None, reason="mkdocs is not installed in this environment, nor "
                                              "in a docs environment beside it (make docs "
                                              "builds .venv/docs)"),
    pytest.mark.skipif(shutil.which("make") is None, reason="the docs targets need make"),
]

_COPIED = shutil.ignore_patterns(".git", ".venv", "site", "__pycache__", "*.egg-info",
                                 ".pytest_cache", ".hypothesis", "demo-out")
ROLE = re.compile(r":(?:func|class|meth|data|mod|attr|exc|obj):(?:`|<code>)")


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A ``VENV`` for the Makefile whose docs environment is the mkdocs found (made ready)."""
    root = tmp_path_factory.mktemp("venv")
    (root / "docs" / "bin").mkdir(parents=True)
    (root / "docs" / "bin" / "mkdocs").symlink_to(MKDOCS)
    (root / "docs" / ".ready").touch()
    return root


def checkout(folder: Path) -> Path:
    return Path(shutil.copytree(ROOT, folder / "checkout", ignore=_COPIED, symlinks=True))


def make(repo: Path, venv: Path, *args: str,
         **kwargs) -> subprocess.Popen | subprocess.CompletedProcess:
    """``make ARGS`` in ``repo`` with the docs environment above (never rebuilt)."""
    argv = ["make", "-s", "-C", str(repo), f"VENV={venv}", "-o", f"{venv}/docs/.ready", *args]
    if kwargs.pop("background", False):
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True, **kwargs)
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False,
                          **kwargs)


@pytest.fixture(scope="module")
def built(tmp_path_factory, venv) -> tuple[Path, subprocess.CompletedProcess]:
    repo = checkout(tmp_path_factory.mktemp("clean"))
    return repo, make(repo, venv, "docs")


def test_make_docs_builds_the_tree_with_no_warning(built):
    repo, done = built
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "WARNING" not in output, output
    assert (repo / "site" / "index.html").is_file()


# What each validation setting catches, planted: (setting, where, what, text of its warning).
PAGE = "docs/tutorials/index.md"
PLANTS = [
    ("links.not_found", PAGE, "[planted](no-such-page.md)", "no-such-page.md"),
    ("links.anchors", PAGE, "[planted](index.md#no-such-anchor)", "no-such-anchor"),
    ("links.absolute_links", PAGE, "[planted](/reference/cli.md)", "'/reference/cli.md'"),
    ("links.unrecognized_links", PAGE, "[planted](../reference/)", "'../reference/'"),
    ("nav.omitted_files", "docs/planted-orphan.md", "# Planted", "planted-orphan.md"),
    ("nav.not_found", "mkdocs.yml", "planted-missing.md", "'planted-missing.md'"),
    ("nav.absolute_links", "mkdocs.yml", "/planted-absolute.md", "'/planted-absolute.md'"),
]


def test_the_plants_cover_every_validation_setting_and_each_warns():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    settings = {f"{group}.{key}": value
                for group, keys in config["validation"].items() for key, value in keys.items()}
    assert sorted(settings) == sorted(setting for setting, *_ in PLANTS)
    assert set(settings.values()) == {"warn"}, settings  # strict fails on WARNING, not INFO
    assert config.get("strict") is True


def _plant(repo: Path) -> None:
    for _, where, what, _ in PLANTS:
        path = repo / where
        if where == "mkdocs.yml":
            text = path.read_text(encoding="utf-8")
            last = "  - Development: development.md\n"
            assert last in text
            path.write_text(text.replace(last, f"{last}  - Planted: {what}\n"), encoding="utf-8")
        elif path.exists():
            path.write_text(path.read_text(encoding="utf-8") + f"\n{what}\n", encoding="utf-8")
        else:
            path.write_text(f"{what}\n", encoding="utf-8")


def test_make_docs_fails_naming_each_planted_break(tmp_path, venv):
    repo = checkout(tmp_path)
    _plant(repo)
    done = make(repo, venv, "docs")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    warnings = "\n".join(block for block in re.split(r"\n(?=[A-Z]+ +-  )", output)
                         if block.startswith("WARNING"))
    missed = [setting for setting, _, _, says in PLANTS if says not in warnings]
    assert not missed, f"no WARNING for {missed}:\n{output}"


# --- the API reference ------------------------------------------------------------------------

def _pages(site: Path) -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in site.rglob("*.html")}


def test_no_page_shows_a_raw_cross_reference_role(built):
    repo, done = built
    assert done.returncode == 0, done.stdout + done.stderr
    raw = {str(path.relative_to(repo / "site")): sorted(set(ROLE.findall(text)))
           for path, text in _pages(repo / "site").items() if ROLE.search(text)}
    assert not raw, raw


def test_a_reference_to_an_object_the_site_documents_is_a_link(built):
    """Every role of the docstrings is a link (docs/griffe_roles.py), except one naming a
    private helper, shown as code: autorefs leaves an optional reference it cannot resolve as
    a span titled with its identifier. A public one it cannot resolve fails the build."""
    repo, done = built
    assert done.returncode == 0, done.stdout + done.stderr
    api = (repo / "site" / "reference" / "python-api" / "index.html").read_text(encoding="utf-8")
    links = re.findall(r'<a class="autorefs autorefs-internal docstring-role"[^>]*'
                       r'href="[^"]*#([\w.]+)"', api)
    assert len(links) >= 20, links  # dozens of roles: links, not one by chance
    assert {"cubepack.ModelIdentity", "cubepack.verify", "cubepack.trust.TrustPolicy",
            "cubepack.memos.install"} <= set(links)
    assert re.search(r"The model's <a [^>]*href=\"#cubepack\.ModelIdentity\"><code>"
                     r"ModelIdentity</code></a>", api)
    shown_as_code = re.findall(r'<span title="([\w.]+)"><code>', api)
    public = [name for name in shown_as_code
              if not any(part.startswith("_") for part in name.split("."))]
    assert shown_as_code and not public, public


# --- reading the site -------------------------------------------------------------------------

def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        return error.code, ""


def test_the_readme_way_to_open_the_site_serves_pages_and_search(tmp_path, venv):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    port_default = re.search(r"^DOCS_PORT\s*\?=\s*(\d+)$", makefile, re.MULTILINE)
    assert port_default, "the Makefile sets DOCS_PORT"
    assert "make docs-serve" in readme
    assert f"http://127.0.0.1:{port_default[1]}/" in readme

    from cubepack.testing import free_port

    port = free_port()
    repo = checkout(tmp_path)
    server = make(repo, venv, "docs-serve", f"DOCS_PORT={port}", background=True)
    base = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, server.stdout.read()
            try:
                status, home = _get(base)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                status = None
            if status == 200:
                break
            assert time.monotonic() < deadline, "make docs-serve did not answer"
            time.sleep(1)
        assert "<title>cubepack</title>" in home
        status, page = _get(base + "tutorials/first-cube/")
        assert status == 200 and "Your first cube" in page and "Directory listing" not in page
        status, index = _get(base + "search/search_index.json")
        assert status == 200
        assert any(doc["location"].startswith("tutorials/first-cube/")
                   for doc in json.loads(index)["docs"])
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
