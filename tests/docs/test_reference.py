"""The reference pages state what the code decides, and a test checks each statement against
the code (the error tree's table is checked in tests/test_architecture.py); every relative link
of the README and the docs leads to a file that is there (``mkdocs build --strict`` checks the
site's links and anchors too)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from docs_pages import DOCS, ROOT, pages

from envs import once

pytestmark = once


def _rows(page: str) -> list[list[str]]:
    """Every table row of a docs page, as its cells (header and rule rows included)."""
    text = (DOCS / page).read_text(encoding="utf-8")
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            for line in text.splitlines() if line.startswith("|")]


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_checks_page_lists_every_check_in_order_with_its_basis():
    from cubepack._util.checks import Catalogue

    table = [(_ticked(row[0])[0], _ticked(row[1])[0]) for row in _rows("reference/checks.md")
             if len(row) == 3 and _ticked(row[0]) and _ticked(row[1])
             and _ticked(row[1])[0] in ("proved", "signed", "claimed")]
    assert [name for name, _ in table] == list(Catalogue)
    assert dict(table) == {entry.value: str(entry.basis) for entry in Catalogue}


def test_the_trust_policy_page_states_what_each_consumer_honours():
    from cubepack.trust._policy import HONOURED, TrustPolicy

    every = {field.name for field in dataclasses.fields(TrustPolicy)}
    rows = {_ticked(row[0])[0]: row for row in _rows("reference/trust-policy.md")
            if len(row) == 3 and _ticked(row[0]) and _ticked(row[0])[0] in HONOURED}
    assert set(rows) == set(HONOURED)
    for consumer, (honoured, _) in HONOURED.items():
        applies = {name for name in _ticked(rows[consumer][1]) if name in every}
        refuses = {name for name in _ticked(rows[consumer][2]) if name in every}
        if len(honoured) < len(every) // 2:
            assert applies == set(honoured), consumer
        else:
            assert refuses == every - set(honoured), consumer


def test_the_trust_policy_page_maps_every_cli_option():
    from cubepack.cli import _POLICY_OPTIONS

    mapped = {_ticked(row[1])[0] for row in _rows("reference/trust-policy.md")
              if len(row) == 2 and _ticked(row[0]) and _ticked(row[0])[0].startswith("--")
              and _ticked(row[1])}
    assert mapped == set(_POLICY_OPTIONS)


def test_the_lock_page_lists_every_section_of_the_registry():
    from cubepack.format._lock import SECTIONS

    table = {}
    for row in _rows("reference/lock.md"):
        if len(row) == 5 and _ticked(row[0]) and row[1].isdigit():
            table[_ticked(row[0])[0]] = (int(row[1]), row[2] == "yes",
                                         (_ticked(row[4]) or [None])[0])
    assert table == {section.key: (section.since, section.required, section.attest)
                     for section in SECTIONS}


def test_the_lock_page_states_the_lock_version_written():
    from cubepack._util import constants

    text = (DOCS / "reference/lock.md").read_text()
    assert f"| **{constants.LOCK_VERSION}** | yes; written |" in text


def test_the_attestation_page_names_the_predicate_written():
    from cubepack.format._envelope import PREDICATE_TYPE, PREDICATE_TYPE_V1

    text = (DOCS / "reference/attestation.md").read_text()
    assert f'"predicateType": "{PREDICATE_TYPE}"' in text and PREDICATE_TYPE_V1 in text


def test_the_environment_page_lists_every_variable_the_code_reads():
    read = set()
    for folder in ("cubepack", "tests", "tools", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            read |= set(re.findall(r"[\"'](CUBEPACK_[A-Z_]+)[\"']", path.read_text()))
    listed = {name for row in _rows("reference/environment.md") for name in _ticked(row[0])
              if name.startswith("CUBEPACK_")}
    assert read == listed


def test_the_architecture_page_names_every_part_on_its_layer():
    """The module map's layers are tests/test_architecture.py's LAYERS, part for part."""
    text = (DOCS / "explanation/architecture.md").read_text()
    source = (ROOT / "tests" / "test_architecture.py").read_text()
    layers = re.search(r"LAYERS = \[(.*?)\n\]", source, re.DOTALL)[1]
    for part in re.findall(r'"cubepack\.(\w+)"', layers):
        if part in ("__main__", "_version"):
            continue
        assert re.search(rf"\b{part}\b", text), part


_LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", pages(), ids=str)
def test_every_relative_link_leads_to_a_file(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # links in code are code
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        if not (ROOT / page).parent.joinpath(path).exists():
            broken.append(target)
    assert broken == []


def test_the_site_includes_the_security_policy_from_the_repository_root():
    text = (DOCS / "explanation/threat-model.md").read_text()
    assert '--8<-- "SECURITY.md"' in text and (ROOT / "SECURITY.md").is_file()


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 160


def test_the_module_map_is_generated_from_every_module_on_its_layer():
    """docs/hooks.py writes the module map into the architecture page at build time; it names
    every module of the package, under the layer LAYERS gives its part."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    assert hooks.MODULE_MAP_MARK in (DOCS / "explanation/architecture.md").read_text()
    generated = hooks.module_map()
    listed = set(re.findall(r"^\| `(cubepack[\w.]*)` \|", generated, re.MULTILINE))
    package = ROOT / "cubepack"
    modules = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert listed == modules
