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

import pytest


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


#: Runs the command line as ``python -m cubepack`` does, with a Ctrl-C (a real SIGINT to itself)
#: delivered the moment module MODULE starts importing: start-up (click, the command line
#: itself) or a command's own heavy imports. An event, not a timer: no sleep, no race.
_INTERRUPT_AT_IMPORT = """
import importlib.abc, os, runpy, signal, sys

AT = sys.argv[1]

class InterruptAt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == AT:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptAt())
sys.argv = ["cubepack", *sys.argv[2:]]
runpy.run_module("cubepack", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module, args", [
    ("click", ["--version"]),                      # the command line loading
    ("cubepack.cli", ["--help"]),
    ("cubepack.ops", ["verify", "{tmp}"]),          # a command importing its parts
    ("huggingface_hub", ["pull", "me/cube", "--local-dir", "{tmp}/cube"]),
])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_ctrl_c_at_any_import_is_one_line_and_130(tmp_path, module, args, as_json):
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in args] + (["--json"] if as_json else [])
    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=str(tmp_path / "hf"))
    done = subprocess.run([sys.executable, "-c", _INTERRUPT_AT_IMPORT, module, *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130, (done.stdout, done.stderr)
    assert done.stderr.splitlines() == ["error: interrupted (Ctrl-C) before the command "
                                        "finished"], done.stderr
    if as_json:
        assert json.loads(done.stdout)["error"]["type"] == "Interrupted"
    else:
        assert done.stdout == ""
    assert not (tmp_path / "cube").exists()


def test_an_error_a_ctrl_c_caused_is_still_the_interruption(tmp_path):
    """transformers' lazy imports re-raise a KeyboardInterrupt as "Could not import module
    ...": after a Ctrl-C, any error is reported as the interruption (one line, 130), never as
    an unexpected error (exit 3) - the new-user trial saw it once in ~60 interrupted pulls."""
    script = tmp_path / "run.py"
    script.write_text(
        "import os, signal, sys\n"
        "import cubepack.cli as cli\n"
        "def swallowing(*args, **kwargs):\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    except KeyboardInterrupt as exc:  # as a library's import machinery does\n"
        "        raise ModuleNotFoundError(\"Could not import module 'X'\") from exc\n"
        "cli.cli.commands['inspect'].callback = swallowing\n"
        f"sys.exit(cli.main(['inspect', {str(script)!r}, '--json']))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130, done.stderr
    assert json.loads(done.stdout)["error"]["type"] == "Interrupted"
    assert done.stderr.strip() == "error: interrupted (Ctrl-C) before the command finished"
