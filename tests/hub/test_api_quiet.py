"""The Python API is as quiet as the command line when stderr is not a terminal: a script's
``cubepack.push`` / ``cubepack.pull`` draws no progress bar (huggingface_hub's "Upload 0 LFS
files: 0it" was one) into its log. The script runs as a user's would: its own process, stderr a
pipe, none of the switches that turn bars off set."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from cubepack.testing.hub import InstrumentedHub

from data import HUB_TOKEN

_BAR_SWITCHES = ("CUBEPACK_NO_PROGRESS", "HF_HUB_DISABLE_PROGRESS_BARS", "CUBEPACK_VERBOSE")


def test_push_and_pull_from_python_draw_no_bar_into_a_log(tmp_path, packed_cube_factory):
    script = textwrap.dedent("""
        import sys
        import cubepack

        endpoint, cube, target = sys.argv[1:]
        pushed = cubepack.push(cube, "me/cube", endpoint=endpoint, token=%r,
                               allow_local_paths=True)
        cubepack.pull(f"me/cube@{pushed.commit_sha}", endpoint=endpoint, local_dir=target)
        print("done")
    """ % HUB_TOKEN)
    env = {k: v for k, v in os.environ.items() if k not in _BAR_SWITCHES}
    env["HF_HUB_CACHE"] = str(tmp_path / "hf")
    with InstrumentedHub(tmp_path / "hub-root", tokens=[HUB_TOKEN]) as hub:
        done = subprocess.run([sys.executable, "-c", script, hub.url, str(packed_cube_factory()),
                               str(tmp_path / "pulled")], env=env, capture_output=True,
                              text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    assert "\r" not in done.stderr and "it/s" not in done.stderr and "0it" not in done.stderr, \
        done.stderr
    assert "LFS files" not in done.stderr and "Fetching" not in done.stderr, done.stderr
