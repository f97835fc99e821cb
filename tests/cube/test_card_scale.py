"""The card summarises whatever the cube holds: at 10,000 activations it stays under 64 KB,
says how many there are and how many it does not list, while the lock keeps every entry."""

from __future__ import annotations

import json

from cubepack._util import constants
from cubepack.format import _card as card

from envs import once

pytestmark = once


def test_the_card_of_ten_thousand_activations_stays_small(packed_cube_factory):
    lock = json.loads((packed_cube_factory() / constants.LOCK_FILENAME).read_text())
    (item_id, entry), = list(lock["activations"].items())[:1]
    files = {name: meta for name, meta in lock["files"].items() if name != entry["file"]}
    activations = {}
    for index in range(10_000):
        name = f"activations/item-{index:05d}.kv.safetensors"
        files[name] = lock["files"][entry["file"]]
        activations[f"item-{index:05d}"] = {**entry, "file": name}
    big = {**lock, "files": files, "activations": activations}
    text = card.render(lock=big, memories={"activation": sorted(
        a["file"] for a in activations.values())}, pretty_name="Big cube", license=None,
        repo_id="ns/big", cubepack_version="test")
    assert len(text.encode()) <= 64 * 1024
    assert "10000" in text.replace(",", "") and str(10_000 - card.CARD_ROWS) in text.replace(
        ",", "")
    assert text.count("item-") <= 2 * card.CARD_ROWS + card.CARD_FILES + 5  # id and file per row
