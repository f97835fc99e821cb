"""Promise 3 (bounded at the boundary): attacker-written PEFT patterns are refused by shape and
matched under a timeout, so that "PEFT's own ``re`` (which matches the same patterns when an
adapter is applied) is safe too" (cubepack/_util/patterns.py).

The break (an adversary's find): the shape check counted only *unbounded* repeats, so a chain
of bounded ones (``.{0,40}`` k times) passed; cubepack's timed matcher answered it at once, but
Python's ``re`` (what PEFT runs in ``PeftModel.from_pretrained``) backtracks C(n+k, k) ways on a
module name it does not match: 16 repeats take hours. Now every variable-length repeat counts,
and ``load_adapter`` hands PEFT the literal module names cubepack's bounded matcher resolved,
never a pattern the cube's author wrote.
"""

from __future__ import annotations

import json
import re

import pytest

import cubepack
from cubepack._util import patterns

from helpers import make_adapter

#: passes check_shape (no unbounded repeat at all), 118 characters
BOMB = ".{0,40}" * 16 + "zz"
NAME = "model.layers.0.self_attn.q_proj"


def test_a_chain_of_bounded_repeats_is_refused_by_shape_and_what_passes_re_finishes():
    with pytest.raises(cubepack.FormatError, match="variable-length repeats"):
        patterns.check_shape(BOMB, where="alpha_pattern key")
    small = ".{0,40}" * 3 + "zz"  # the most the shape check lets through: cubic, fast in re
    patterns.check_shape(small, where="t")
    assert re.fullmatch(small, NAME) is None  # returns (a hang would fail the suite)


@pytest.mark.parametrize("key", ["alpha_pattern", "target_modules"])
def test_an_adapter_with_a_bounded_repeat_bomb_is_refused_at_pack(tmp_path, zoo, key):
    cube = tmp_path / "cube"
    folder = make_adapter(zoo["a"], cube / "parametric" / "lora", target_modules=["q_proj"])
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    if key == "alpha_pattern":
        config["alpha_pattern"] = {BOMB: 16}
    else:
        config["target_modules"] = ".{0,40}" * 16 + "q_proj"
    path.write_text(json.dumps(config))
    with pytest.raises(cubepack.FormatError, match=key):
        cubepack.pack(cube, cube_id="alice/cube")


def test_load_adapter_hands_peft_literal_names_not_the_authors_patterns(tmp_path, zoo,
                                                                      monkeypatch):
    """An accepted pattern selects modules; PEFT receives those modules' names, escaped."""
    import peft

    cube = tmp_path / "cube"
    folder = make_adapter(zoo["a"], cube / "parametric" / "lora", target_modules=["q_proj"])
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config["target_modules"] = r".*\.q_proj"
    config["alpha_pattern"] = {r"layers\.0\..*q_proj": 16}
    path.write_text(json.dumps(config))
    cubepack.pack(cube, cube_id="alice/cube")
    seen = {}
    real = peft.PeftModel.from_pretrained

    def recording(model, folder, **kwargs):
        from pathlib import Path

        seen.update(json.loads((Path(folder) / "adapter_config.json").read_text()))
        return real(model, folder, **kwargs)

    monkeypatch.setattr(peft.PeftModel, "from_pretrained", recording)
    from cubepack.testing import tiny

    cubepack.load_adapter(tiny.load(zoo["a"]), cube)
    assert all(not any(ch in name for ch in "*+?{}()|") for name in seen["target_modules"])
    assert seen["target_modules"] and all(name.endswith("q_proj")
                                          for name in seen["target_modules"])
    assert list(seen["alpha_pattern"]) == [re.escape("model.layers.0.self_attn.q_proj")]
