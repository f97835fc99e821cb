"""Which environment runs a test. ``make test`` runs the suite in two environments at once
(latest: transformers 5.x, huggingface_hub 2.x; memos: MemoryOS, transformers 4.57, hub 0.36).
Tests of code that runs the same in both (cubepack's own parsers, formats and tools, with no Hub
client, transformers or MemOS code path under test) run once: in the latest environment; the
import-graph rules, which mean most where every package is installed, in the memos one.
End-to-end chains of CLI commands (a refusal, the fix it suggests, the command again; a bundle
packed, pushed, pulled and loaded; a KV file imported and exported) run once too (``chain_once``):
what each command does is tested in both environments by its own tests, and a chain's subject is
how the commands fit together, which is cubepack's own code."""

from __future__ import annotations

import importlib.util

import pytest

MEMOS = importlib.util.find_spec("memos") is not None

once = pytest.mark.skipif(MEMOS, reason="the same code in both environments: runs in the "
                                        "latest environment only")
once_with_memos = pytest.mark.skipif(not MEMOS, reason="import rules are checked where MemoryOS "
                                                       "is installed too: the memos environment")
chain_once = pytest.mark.skipif(MEMOS, reason="an end-to-end chain of commands each tested in "
                                              "both environments: runs in the latest "
                                              "environment only")
