"""Issue #37 item 6: two activation ids that differ only by Unicode normalisation ("café"
composed, NFC, and decomposed, NFD) are one name wherever a name is normalised (macOS file
systems, MemOS users typing it) and look alike everywhere: they are refused as a duplicate,
by pack, by the lock (so verify and pull), and by the MemOS hook's lockless load. Before the
fix, only byte-equal ids were."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
import torch

import cubepack
from cubepack import FormatError, VerificationFailed
from cubepack._util import constants
from cubepack.format import _lock as lockfile

from helpers import build_cache, reseal_lock

COMPOSED = "caf\u00e9"
DECOMPOSED = "cafe\u0301"
#: Pairs one Unicode normalisation (NFKC, which covers NFC/NFD) makes one id.
PAIRS = [(COMPOSED, DECOMPOSED), ("\ufb01le", "file"), ("\u212bngstr\u00f6m", "\u00c5ngstr\u00f6m")]


def test_the_pairs_differ_as_bytes_and_agree_once_normalised():
    for one, other in PAIRS:
        assert one != other
        assert unicodedata.normalize("NFKC", one) == unicodedata.normalize("NFKC", other)


@pytest.mark.parametrize("one, other", PAIRS)
def test_pack_refuses_two_activations_whose_ids_are_one_once_normalised(models, zoo, tmp_path,
                                                                        one, other):
    bundle = tmp_path / "bundle"
    (bundle / "activations").mkdir(parents=True)
    for name, item_id, ids in (("a", one, [1, 17, 42]), ("b", other, [3, 4, 5])):
        cubepack.save_kv_cache(build_cache(models["a"], torch.tensor([ids])),
                               bundle / "activations" / f"{name}.kv.safetensors",
                               producer=models["a"], token_ids=ids, metadata={"id": item_id})
    with pytest.raises(FormatError) as refused:
        cubepack.pack(bundle, cube_id="me/ids", model=zoo["a"])
    assert repr(one) in str(refused.value) and repr(other) in str(refused.value)
    assert "Unicode normalisation" in str(refused.value)
    assert not (bundle / constants.LOCK_FILENAME).exists()


@pytest.mark.parametrize("one, other", PAIRS)
def test_a_lock_whose_activation_ids_are_one_once_normalised_is_refused(cube, one, other):
    def rename(lock):
        entries = lock["activations"]
        entries[one] = entries.pop("item-1")
        entries[other] = entries.pop("item-2")

    reseal_lock(cube, rename)
    data = (cube / constants.LOCK_FILENAME).read_bytes()
    with pytest.raises(FormatError, match="Unicode normalisation"):
        lockfile.parse(data)
    with pytest.raises(VerificationFailed, match="Unicode normalisation"):
        cubepack.verify(cube)


def test_the_memos_hooks_lockless_load_refuses_them_too():
    from cubepack.kinds.activations._memos import Checking
    from cubepack.memos._activations import HookReport
    from cubepack.trust._policy import TrustPolicy

    staged = Checking(None, Path("dump"), HookReport(Path("dump")), TrustPolicy())
    staged.claim(COMPOSED, "a.kv.safetensors")
    with pytest.raises(FormatError, match="Unicode normalisation"):
        staged.claim(DECOMPOSED, "b.kv.safetensors")
