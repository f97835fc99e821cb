"""Principles "errors are typed" and "never a hang" on issue #32's load path:
``load_kv_cache(PATH, model, decrypt_with=KEY)`` opened PATH with a plain ``open``: a missing
file raised a bare ``FileNotFoundError`` and a folder ``IsADirectoryError`` (the clear path says
``FormatError: Cannot read PATH``), and a FIFO (a named pipe with no writer) blocked the load
forever. The clear path opens KV files with ``open_regular`` for exactly this."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from private_keys import age_keys

import cubepack
from cubepack.errors import FormatError
from cubepack.ops._private import decrypted_memory

pytest.importorskip("pyrage")


def test_a_missing_private_kv_file_is_a_format_error(models, tmp_path):
    keys = age_keys(tmp_path, "alice")
    missing = tmp_path / "gone.kv.safetensors.age"
    with pytest.raises(FormatError, match="gone.kv.safetensors.age"):
        cubepack.load_kv_cache(missing, models["a"], decrypt_with=keys["alice"][0])
    with pytest.raises(FormatError, match="not a regular file"):
        cubepack.load_kv_cache(tmp_path, models["a"], decrypt_with=keys["alice"][0])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_named_as_a_private_kv_file_is_refused_not_waited_on(tmp_path):
    keys = age_keys(tmp_path, "alice")
    fifo = tmp_path / "pipe.kv.safetensors.age"
    os.mkfifo(fifo)
    # In a child: a hang must fail the test, not block the run (the timeout is the failure,
    # not a synchronisation).
    code = ("import sys; from cubepack.ops._private import decrypted_memory\n"
            "from cubepack.errors import FormatError\n"
            "try:\n    decrypted_memory(sys.argv[1], sys.argv[2])\n"
            "except FormatError as exc:\n    print('refused:', exc)\n")
    try:
        done = subprocess.run([sys.executable, "-c", code, str(fifo), str(keys["alice"][0])],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    except subprocess.TimeoutExpired:
        pytest.fail("decrypting a FIFO blocked: the load waits forever on a pipe")
    assert "refused:" in done.stdout and "not a regular file" in done.stdout, done.stderr
    assert decrypted_memory  # the same function the child ran
