"""A KV file written under one transformers major version loads bit-exactly under the other.

The other environment's interpreter is given by ``CUBEPACK_OTHER_PYTHON`` (``make test`` sets
it); each environment writes with the other and reads in-process, so both directions run.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import transformers
from safetensors.torch import load_file

import cubepack

from helpers import continue_greedy

OTHER = os.environ.get("CUBEPACK_OTHER_PYTHON")


NAMES = ("a", "hybrid")


@pytest.fixture(scope="module")
def written(zoo, tmp_path_factory):
    """Each model's files, written by the other environment (one process for all) and the
    transformers version it ran."""
    writer = Path(__file__).parents[1] / "support" / "crossversion_writer.py"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(writer.parent),
                                                      os.environ.get("PYTHONPATH", "")]))
    folders = {name: tmp_path_factory.mktemp(f"other-{name}") for name in NAMES}
    pairs = [str(part) for name in NAMES for part in (zoo[name], folders[name])]
    done = subprocess.run([OTHER, str(writer), *pairs], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return folders, done.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not OTHER, reason="CUBEPACK_OTHER_PYTHON not set (make test sets it)")
@pytest.mark.parametrize("name", NAMES)
def test_file_from_other_environment_loads_bit_exactly(written, models, name):
    folders, other_version = written
    folder = folders[name]
    assert other_version.split(".")[0] != transformers.__version__.split(".")[0]

    model = models[name]
    assert json.loads((folder / "identity.json").read_text()) == \
        json.loads(json.dumps(cubepack.fingerprint(model).strict()))
    cache = cubepack.load_kv_cache(folder / "cache.kv.safetensors", model)
    assert cache.get_seq_length() == 10
    expected = load_file(str(folder / "logits.safetensors"))
    mine = continue_greedy(model, cache, 30, 6)
    assert all(expected[f"step{i}"].equal(step) for i, step in enumerate(mine))


@pytest.mark.skipif(not OTHER, reason="CUBEPACK_OTHER_PYTHON not set (make test sets it)")
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_cache_from_the_other_version_passes_recomputation_here(written, zoo, name, dtype):
    """The proof by recomputation across transformers 4.57 <-> 5.x: the other version's honest
    cache, float32 and bfloat16, is this version's prefill bit for bit or within each
    position's bound of it."""
    import torch

    from cubepack.kv._recompute import describe, recompute
    from cubepack.testing import tiny

    folders, _ = written
    file = "cache.kv.safetensors" if dtype == "float32" else "cache-bfloat16.kv.safetensors"
    info = cubepack.read_kv_header(folders[name] / file)
    result = recompute(tiny.load(zoo[name], dtype=getattr(torch, dtype)), info, name)
    assert result.ok and result.full, describe(result)
    # Bit for bit (both versions run the same CPU kernels here: no reference needed), or
    # within the bound, measured against a float32 reference for bfloat16.
    assert result.identical or result.referenced == (dtype == "bfloat16")
