"""Outcomes owed as JSON too: an interrupted command (Ctrl-C) prints exactly one JSON object
(``ok: false``, ``error.type`` ``Interrupted``) and exits 130, the shell's code for SIGINT; so
does a usage error in the ``--json`` flag itself."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading


def test_ctrl_c_during_a_pull_prints_one_json_object(tmp_path):
    silent = socket.socket()  # an endpoint that accepts and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    accepted = threading.Event()
    held = []

    def accept():
        while True:
            try:
                held.append(silent.accept())
            except OSError:
                return
            accepted.set()

    threading.Thread(target=accept, daemon=True).start()
    env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{silent.getsockname()[1]}",
               HF_HUB_CACHE=str(tmp_path / "cache"))
    process = subprocess.Popen(
        [sys.executable, "-m", "cubepack", "pull", "me/cube", "--local-dir",
         str(tmp_path / "cube"), "--json"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert accepted.wait(120), "the pull never reached the endpoint"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
        silent.close()
    data = json.loads(out)
    assert data["ok"] is False and data["error"]["type"] == "Interrupted", out
    assert data["error"]["exit_code"] == process.returncode == 130, err
    assert not (tmp_path / "cube").exists()


def test_a_usage_error_in_the_json_flag_itself_is_one_json_object(tmp_path):
    """``--json=1`` is a usage error (a flag takes no value); the caller still asked for JSON."""
    done = subprocess.run([sys.executable, "-m", "cubepack", "verify", str(tmp_path), "--json=1"],
                          capture_output=True, text=True, timeout=120, check=False)
    data = json.loads(done.stdout)
    assert data["ok"] is False and data["error"]["type"] == "UsageError"
    assert data["error"]["exit_code"] == done.returncode == 2
