"""pack runs the kinds' phases in an order that refuses a folder's own mistakes before any
model is pinned (a pin fingerprints, or downloads, a model: seconds to minutes)."""

from __future__ import annotations

import pytest

import cubepack
from cubepack.errors import FormatError


def test_a_stray_peft_file_is_refused_before_any_model_is_pinned(tmp_path):
    cube = tmp_path / "bundle"
    (cube / "elsewhere").mkdir(parents=True)
    (cube / "elsewhere" / "adapter_config.json").write_text("{}")
    (cube / "notes.txt").write_text("text\n")
    # The model named does not exist: pinning it first would say so instead.
    with pytest.raises(FormatError, match="PEFT adapter file outside"):
        cubepack.pack(cube, cube_id="me/bundle", model=str(tmp_path / "no-such-model"))
