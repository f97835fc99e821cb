"""The figure the README and local-hub.md quote for huggingface_hub's own suite against the
local endpoint agrees with the out-of-scope list ``tools/hub_compat.py`` enforces (a failure
outside the list, or a listed test that passes, fails that run): quoted failures = listed
tests, and the pages quote the same numbers."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_quoted_suite_figure_matches_the_out_of_scope_list():
    listed = [line for line in (ROOT / "tools" / "hub_compat_out_of_scope.txt").read_text(
        encoding="utf-8").splitlines() if line.strip() and not line.lstrip().startswith("#")]
    page = (ROOT / "docs" / "reference" / "local-hub.md").read_text(encoding="utf-8")
    passed, total, failed, skipped = map(int, re.search(
        r"\*\*(\d+) of (\d+) pass\*\* \((\d+) fail, (\d+) skip", page).groups())
    assert passed + failed + skipped == total
    assert failed == len(listed), "local-hub.md's failures are not the listed out-of-scope tests"
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"{passed} of {total} pass" in readme, "the README quotes another figure"
