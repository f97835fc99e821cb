"""Promise 2 ("an option hides the item ids too"): with ``--hide-names`` the ciphertexts are
``private/<random>.age``, but the public ``cubepack.yaml`` and card list them (per memory
kind) in the order of the *clear* names they hide (``_memory_kinds`` walks the clear names
sorted). Anyone reading the public files learns how the hidden item ids sort against each
other, and which hidden file is the cube's own lock, config.json or README (their clear
names sort apart), and, with the sizes, which item id has how many tokens. A list of random
names carries no information only in an order of its own (e.g. sorted by the random name)."""

from __future__ import annotations

import itertools
import re

import pytest
import yaml
from private_keys import age_keys, private_copy

from cubepack._util import constants
from cubepack.format import _fileset as fileset


def test_public_lists_of_hidden_names_do_not_follow_the_clear_order(packed_cube_factory,
                                                                     tmp_path, monkeypatch):
    pytest.importorskip("pyrage")
    keys = age_keys(tmp_path, "alice")
    # Random tokens drawn in descending order, so the clear names' order (the draw order) and
    # the random names' order differ; with real tokens they differ as often, at random.
    tokens = (f"{n:032x}" for n in itertools.count(2**120, -1))
    monkeypatch.setattr("cubepack.ops._encrypt.secrets.token_hex", lambda _: next(tokens))
    source = packed_cube_factory({"aaa-first": [5, 6, 7], "mmm-middle": [8, 9, 10, 11],
                                  "zzz-last": [12, 13]})
    cube = private_copy(source, tmp_path / "cube", [keys["alice"][1]], hide_names=True)
    config = yaml.safe_load((cube / constants.CONFIG_FILENAME).read_text())
    card = (cube / constants.CARD_FILENAME).read_text()
    for kind, names in config["memories"].items():
        assert all(n.startswith(fileset.HIDDEN_DIR + "/") for n in names)
        assert names == sorted(names), (f"cubepack.yaml lists the hidden {kind} files in the "
                                        "order of the clear names they hide")
        row = re.search(rf"^\| {kind} \| (.*?) \|", card, re.M).group(1).split(", ")
        assert row == sorted(row), f"the card lists the hidden {kind} files in clear order"
