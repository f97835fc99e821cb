"""The tests mirror the code (issue #39 item 6): a rule's tests sit under the folder of the part
that owns it, and a reproduction of an attack sits in that part's ``attacks/`` folder
(``tests/<part>/attacks/test_<the attack>.py``), named after the attack. Nothing is filed by
the round or the issue that found it: such a folder says when a test was written, not what it
holds, and a new rule's author never looks there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from envs import once

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
#: A test file or folder named in prose (``tests/kv/attacks/test_x.py``), less its full stop.
NAMED = re.compile(r"\btests/[\w/.-]*[\w/]")

#: Folder names that file tests by who found them or when, not by what they hold.
#: (a number of its own: ``30``, ``issue_37``, ``adv30``, ``r2``; ``e2e`` is a word).
BY_ROUND = re.compile(r"^\d|[_-]\d|\d{2,}|round|adversar|^(adv|issue|r|rd)\d|^(adv|issues?)$")
#: A test file named after a round (``test_adv30d.py``, ``test_round_30.py``), not its attack.
FILE_BY_ROUND = re.compile(r"^test_(adv|adversary|round|issue|r)_?\d")


def misfiled(relative: Path) -> str | None:
    """Why the test file at ``relative`` (to tests/) is filed by round, or None."""
    for folder in relative.parent.parts:
        if BY_ROUND.search(folder):
            return f"under a folder named for a round or a number: {folder}/"
    if FILE_BY_ROUND.match(relative.name):
        return "named for a round, not for what it checks"
    return None


@once
@pytest.mark.parametrize("path", ["adversary/test_a_cache_is_laundered.py",
                                  "round30/test_a_cache_is_laundered.py",
                                  "kv/adv30/test_a_cache_is_laundered.py",
                                  "kv/attacks/issue_37/test_a_cache_is_laundered.py",
                                  "kv/test_adv30d.py", "hub/test_round_2.py"])
def test_the_rule_refuses_a_test_filed_by_round(path):
    assert misfiled(Path(path)) is not None


@once
@pytest.mark.parametrize("path", ["kv/attacks/test_a_checksum_seals_format_2_damage.py",
                                  "localhub/attacks/test_unfinished_commits_hold_64_mib_each.py",
                                  "test_architecture.py", "private/test_age_ssh.py"])
def test_the_rule_takes_tests_filed_by_part(path):
    assert misfiled(Path(path)) is None


@once
def test_no_test_file_is_filed_by_the_round_that_found_it():
    found = {str(path.relative_to(TESTS)): misfiled(path.relative_to(TESTS))
             for path in TESTS.rglob("test_*.py")}
    assert {path: why for path, why in found.items() if why} == {}


@once
def test_there_is_no_adversary_folder():
    """Attack reproductions live in ``tests/<part>/attacks/``: a shared ``tests/adversary/``
    (where 103 files once sat, filed by round) must not come back, even empty."""
    assert not (TESTS / "adversary").exists()


@once
def test_every_attacks_folder_sits_in_a_parts_test_folder():
    """``attacks/`` is the one name for a part's reproductions, directly under that part's test
    folder, which holds the part's other tests (or their conftest)."""
    for folder in TESTS.rglob("attacks"):
        if not folder.is_dir():
            continue
        part = folder.parent
        assert part.parent == TESTS, f"{folder.relative_to(TESTS)}: not tests/<part>/attacks/"
        assert any(part.glob("test_*.py")) or (part / "conftest.py").exists(), \
            f"{folder.relative_to(TESTS)}: its part folder holds no other test"


@once
def test_every_test_the_docs_name_exists():
    """SECURITY.md, the README and the docs name tests as the evidence of a sentence: each
    named test file or folder exists, so a test that moves takes its mentions with it."""
    pages = [ROOT / "README.md", ROOT / "SECURITY.md", *sorted((ROOT / "docs").rglob("*.md"))]
    missing = {f"{page.relative_to(ROOT)}: {name}" for page in pages
               for name in NAMED.findall(page.read_text(encoding="utf-8"))
               if not (ROOT / name).exists()}
    assert missing == set()
