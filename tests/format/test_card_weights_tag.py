"""The card names each pinned model's weights by a tag (``cubepack-weights-<16 hex>``), the
hint ``cubepack search`` filters the Hub's list on; a re-pack makes the tags anew from the
pins, so a tag of weights the cube no longer pins is never kept."""

from __future__ import annotations

from huggingface_hub import RepoCard

import cubepack
from cubepack.format._card import WEIGHTS_TAG_PREFIX, read_previous, weights_tag

from helpers import copy_of


def test_the_card_tags_the_pinned_weights(packed, zoo):
    card = RepoCard((packed / "README.md").read_text())
    digest = cubepack.fingerprint(str(zoo["a"])).weights_digest
    assert weights_tag(digest) in card.data.tags
    assert weights_tag(digest) == WEIGHTS_TAG_PREFIX + digest.split(":")[1][:16]


def test_a_stale_weights_tag_is_not_kept_by_a_re_pack(packed, zoo, tmp_path):
    cube = copy_of(packed, tmp_path)
    text = (cube / "README.md").read_text()
    stale = WEIGHTS_TAG_PREFIX + "0" * 16
    text = text.replace("- cubepack\n", f"- cubepack\n- {stale}\n- mine\n", 1)
    assert stale in text
    assert stale not in read_previous(text).tags and "mine" in read_previous(text).tags
    (cube / "README.md").write_text(text)
    cubepack.pack(cube)
    tags = RepoCard((cube / "README.md").read_text()).data.tags
    assert stale not in tags and "mine" in tags
    assert weights_tag(cubepack.fingerprint(str(zoo["a"])).weights_digest) in tags
