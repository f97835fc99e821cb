"""Promise 4 and SECURITY.md: the RAM folder a private cube is decrypted into is "removed when
done; a SIGKILLed process leaves it in RAM until the next open removes it". A SIGTERM (the
default of ``kill``, ``timeout``, ``docker stop``, a cancelled CI job) is not a SIGKILL, and
the CLI installs no handler for it: Python dies at once, no ``finally`` runs, and the whole
clear cube (every plaintext, named by its clear name) stays in ``/dev/shm`` after the command
ended, as after a SIGKILL. The command is paused inside its decrypted folder by a pipe (no
sleeps), terminated, and ``/dev/shm`` is read after it exited."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from places import ROOT
from private_keys import age_keys, private_copy

#: ``cubepack verify --identity`` as the CLI runs it, paused (on stdin) once a check of the
#: decrypted clear cube begins: it prints the RAM folder's path, then waits.
SCRIPT = r"""
import sys
from cubepack.ops import _verify

real = _verify._check_files

def paused(report, *args, **kwargs):
    if "cubepack-private-" in str(report.cube_dir):
        print(report.cube_dir, flush=True)
        sys.stdin.readline()
    return real(report, *args, **kwargs)

_verify._check_files = paused
from cubepack.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_terminated_verify_leaves_no_plaintext_in_ram(packed, tmp_path):
    pytest.importorskip("pyrage")
    if not Path("/dev/shm").is_dir():
        pytest.skip("needs /dev/shm")
    keys = age_keys(tmp_path, "alice")
    cube = private_copy(packed, tmp_path / "cube", [keys["alice"][1]])
    env = {k: v for k, v in os.environ.items() if k != "CUBEPACK_IDENTITY"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    process = subprocess.Popen([sys.executable, "-c", SCRIPT, "verify", str(cube),
                                "--identity", str(keys["alice"][0])], env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    folder = Path(process.stdout.readline().strip())
    try:
        assert folder.name.startswith("cubepack-private-") and any(folder.rglob("*.safetensors"))
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        left = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) \
            if folder.exists() else []
        assert left == [], f"plaintext left in {folder} after SIGTERM: {left}"
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(folder, ignore_errors=True)
