"""Promise 3 (bounded at the boundary): attacker-written PEFT patterns are refused by shape and
matched under a timeout, so that "PEFT's own ``re`` (which matches the same patterns when an
adapter is applied) is safe too" (cubepack/_util/patterns.py).

The shape check counts only *unbounded* repeats (``*``, ``+``, ``{n,}``). A chain of bounded
repeats (``.{0,40}`` k times) has no unbounded repeat, no nested repeat and no alternation, so
it passes; cubepack's own timed matcher (the ``regex`` package) answers it in microseconds, but
Python's ``re`` (what PEFT runs in ``PeftModel.from_pretrained``) backtracks C(n+k, k) ways on
a module name that does not match: 10 repeats already take ~10 s on a 31-character name,
16 repeats take hours.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

import cubepack
from cubepack._util import patterns

from helpers import make_adapter

#: passes check_shape (no unbounded repeat at all), 118 characters
BOMB = ".{0,40}" * 16 + "zz"
NAME = "model.layers.0.self_attn.q_proj"


def test_the_shape_check_passes_a_chain_of_bounded_repeats_that_re_cannot_finish():
    patterns.check_shape(BOMB, where="alpha_pattern key")  # accepted
    assert patterns.match(rf"(.*\.)?({BOMB})$", NAME, where="t") is False  # fast under regex
    small = ".{0,40}" * 9 + "zz"  # same shape, fewer links: still accepted
    patterns.check_shape(small, where="t")
    start = time.monotonic()
    assert re.fullmatch(small, NAME) is None
    elapsed = time.monotonic() - start
    # What PEFT's re spends on ONE module name for a pattern cubepack accepted; the promise is
    # that an accepted pattern cannot backtrack without bound.
    assert elapsed < 0.5, f"re took {elapsed:.1f} s on one module name for an accepted pattern"


@pytest.mark.parametrize("key", ["alpha_pattern", "target_modules"])
def test_load_adapter_of_a_packed_adapter_with_a_bounded_repeat_bomb_finishes(
        tmp_path, zoo, key):
    """Pack accepts the adapter (shape passes, cubepack's timed regex answers at once); verify
    passes; load_adapter then hands the pattern to PEFT, whose ``re`` never returns."""
    cube = tmp_path / "cube"
    folder = make_adapter(zoo["a"], cube / "parametric" / "lora", target_modules=["q_proj"])
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    if key == "alpha_pattern":
        config["alpha_pattern"] = {BOMB: 16}
    else:  # selects exactly the q_proj modules (cubepack's check agrees), fails slowly elsewhere
        config["target_modules"] = ".{0,40}" * 16 + "q_proj"
    path.write_text(json.dumps(config))
    cubepack.pack(cube, cube_id="alice/cube")  # accepted
    cubepack.verify(cube)  # accepted
    code = textwrap.dedent(f"""
        import cubepack
        from cubepack.testing import tiny
        model = tiny.load({str(zoo['a'])!r})
        try:
            cubepack.load_adapter(model, {str(cube)!r})
        except cubepack.CubepackError as exc:
            print("refused:", exc)
        print("done")
    """)
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"load_adapter did not return within 90 s: PEFT's re is backtracking on "
                    f"the {key} pattern cubepack accepted")
    assert "done" in done.stdout, done.stderr[-2000:]
