"""Every place that says what ``--recompute-tokens N`` (``recompute_tokens``) proves says the
same rule, the one the code follows (issue #37 item 5; the behaviour:
``tests/kv/test_recompute.py::test_recompute_tokens_at_least_the_token_count_is_a_full_check``):
N at least the cache's token count compares every position, a full check; fewer is a sample,
which never proves ``recomputed``.

Swept, not listed: every paragraph, list item and table row of the README, SECURITY.md and the
docs, and the CLI's help, that names the option and ``recomputed``.
"""

from __future__ import annotations

import re

from docs_pages import ROOT, pages

from envs import once

pytestmark = once

OPTION = re.compile(r"--recompute-tokens|recompute_tokens")
#: How the condition is said: "at least its token count" (or "the cache's token count").
CONDITION = re.compile(r"at least (its|the cache's) token count")


def statements() -> list[tuple[str, str]]:
    """(where, text) of every paragraph, list item or table row naming the option and the
    ``recomputed`` label, and of the CLI option's help."""
    from cubepack.cli import _POLICY_CLI

    found = []
    for page in [*pages(), "SECURITY.md"]:
        text = (ROOT / page).read_text(encoding="utf-8")
        parts = re.split(r"\n\s*\n|\n(?=\s*(?:[-*] |\|))", text)
        found += [(f"{page}", part) for part in parts
                  if OPTION.search(part) and "recomputed" in part]
    [option] = [option for name, option in _POLICY_CLI if name == "recompute_tokens"]

    def help_of(command):
        return command.params[0].help

    import click

    found.append(("cubepack --help: --recompute-tokens",
                  help_of(option(click.Command("x")))))
    return found


def test_every_statement_of_what_recompute_tokens_proves_states_when_it_is_full():
    found = statements()
    assert len(found) >= 4  # the how-to, the checks reference, SECURITY.md, the CLI help
    wrong = [(where, " ".join(text.split())[:200]) for where, text in found
             if not CONDITION.search(" ".join(text.split()))]
    assert wrong == []
