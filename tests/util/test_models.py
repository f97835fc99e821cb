"""cubepack's own model loads never need transformers' Hub kernels (transformers 5.25 turns
them on by default and fails every load where the ``kernels`` package is missing or too old);
a load that fails for that reason is a typed error naming the fix.

Whether the ``kernels`` package is installed depends on the registry the environment was built
from (ours lacked the version transformers 5.25 declares until kernels 0.19.1 arrived), so each
test hides it, as a user without it has it: ``sys.modules["kernels"] = None`` makes
``importlib.util.find_spec`` answer None, which is how transformers asks."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import cubepack
from cubepack._util.models import KERNELS_OFF, kernel_errors, load_causal_lm
from cubepack.kv._recompute import load_for_recompute
from cubepack.testing import tiny

#: Run first in a child process: the package is then absent for transformers, as it is for a
#: user who never installed it.
HIDE_KERNELS = "import sys; sys.modules['kernels'] = None; "


def _forget_kernels() -> None:
    """transformers 5.x asks once a process (``is_kernels_available`` is an lru_cache)."""
    from transformers.utils import import_utils

    asked = getattr(import_utils, "is_kernels_available", None)
    if hasattr(asked, "cache_clear"):
        asked.cache_clear()


@pytest.fixture
def no_kernels():
    """This process without the ``kernels`` package, whatever the environment has; restored,
    and transformers' cached answer forgotten again, after the test."""
    had, saved = "kernels" in sys.modules, sys.modules.get("kernels")
    sys.modules["kernels"] = None
    _forget_kernels()
    yield
    if had:
        sys.modules["kernels"] = saved
    else:
        del sys.modules["kernels"]
    _forget_kernels()


def _plain_load_needs_kernels(folder) -> bool:
    """Does this transformers, asked nothing, want kernels it cannot have?"""
    from transformers import AutoModelForCausalLM

    try:
        AutoModelForCausalLM.from_pretrained(str(folder))
    except ValueError as exc:
        return "Kernels are not available" in str(exc)
    return False


def test_every_load_of_ours_works_where_a_plain_load_wants_missing_kernels(zoo, prompt_ids,
                                                                            no_kernels):
    needs = _plain_load_needs_kernels(zoo["a"])
    import transformers

    if not needs:
        pytest.skip(f"transformers {transformers.__version__} loads without Hub kernels by "
                    "default (5.25+ does, and fails where the kernels package is missing)")
    model = tiny.load(zoo["a"])  # the demo's and the tests' loads
    recomputer = load_for_recompute(str(zoo["a"]), None, None, "float32")
    cache = cubepack.prefill(recomputer, prompt_ids)
    assert cache.get_seq_length() == prompt_ids.shape[1]
    assert torch.allclose(model(prompt_ids).logits, recomputer(prompt_ids).logits, atol=1e-4)


def test_a_load_that_fails_for_want_of_kernels_names_the_setting(zoo, no_kernels):
    from transformers import AutoModelForCausalLM

    with pytest.raises(cubepack.UnsupportedError) as refused:
        with kernel_errors(f"the model {zoo['a'].name}"):
            AutoModelForCausalLM.from_pretrained(str(zoo["a"]), use_kernels=True)
    assert KERNELS_OFF in str(refused.value)
    assert zoo["a"].name in str(refused.value)
    assert refused.value.exit_code == 3


def test_other_load_errors_pass_through_unchanged(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError) as raised:  # transformers' own error, not ours
        load_causal_lm(tmp_path)
    assert not isinstance(raised.value, cubepack.CubepackError)
    assert "model_type" in str(raised.value)


def test_the_cli_recomputes_where_a_plain_load_wants_missing_kernels(zoo, models, prompt_ids,
                                                                     tmp_path):
    """``verify --recompute`` is the load a user reported failing with an unexpected
    ValueError; it runs in a fresh process, with transformers' own defaults."""
    cube = tmp_path / "cube"
    (cube / "activations").mkdir(parents=True)
    cubepack.save_kv_cache(cubepack.prefill(models["a"], prompt_ids),
                           cube / "activations" / "m.kv.safetensors", producer=models["a"],
                           token_ids=prompt_ids)
    cubepack.pack(cube, cube_id="me/kernels", model=str(zoo["a"]))
    run = HIDE_KERNELS + "from cubepack.__main__ import main; sys.exit(main())"
    done = subprocess.run([sys.executable, "-c", run, "verify", str(cube), "--model",
                           str(zoo["a"]), "--recompute"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "unexpected" not in done.stderr
