"""The llama.cpp suite (``make test-llamacpp``; not part of ``make test``: llama-cpp-python is
built from source, longer than CI's budget). ``test_layout.py`` is pure and runs everywhere;
the rest needs ``llama_cpp`` and llama.cpp's own converter (``convert_hf_to_gguf.py`` from the
llama-cpp-python sdist, found through ``CUBEPACK_LLAMACPP_CONVERT``) and is not collected
elsewhere."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cubepack.testing import tiny

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
CONVERTER = os.environ.get("CUBEPACK_LLAMACPP_CONVERT", "")
collect_ignore_glob = [] if HAS_LLAMA_CPP else ["test_llamacpp.py", "attacks/test_*.py"]


@pytest.fixture(scope="session")
def gguf_zoo(zoo, tmp_path_factory):
    """Hugging Face folders (the zoo's A and B weights, plus a SentencePiece tokenizer.model)
    and the GGUFs llama.cpp's converter makes of them: a-f32, a-f16, b-f32."""
    if not Path(CONVERTER).is_file():
        pytest.skip("set CUBEPACK_LLAMACPP_CONVERT to llama.cpp's convert_hf_to_gguf.py "
                    "(make test-llamacpp does)")
    root = tmp_path_factory.mktemp("gguf")
    spm = tiny.sentencepiece_model()
    found = {}
    for name in ("a", "b"):
        folder = root / f"hf-{name}"
        shutil.copytree(zoo[name], folder)
        (folder / "tokenizer.model").write_bytes(spm)
        found[f"hf-{name}"] = folder
        for outtype in ("f32", "f16") if name == "a" else ("f32",):
            out = root / f"{name}-{outtype}.gguf"
            subprocess.run([sys.executable, CONVERTER, str(folder), "--outtype", outtype,
                            "--outfile", str(out)], check=True, capture_output=True)
            found[f"{name}-{outtype}"] = out
    return found


@pytest.fixture
def run(tmp_path):
    """``python -m cubepack ARGS`` in a subprocess (the CLI as users run it)."""

    def cubepack_cli(*args, timeout=300):
        return subprocess.run([sys.executable, "-m", "cubepack", *map(str, args)],
                              capture_output=True, text=True, timeout=timeout, check=False,
                              env=dict(os.environ, HF_HUB_OFFLINE="1"))
    return cubepack_cli
