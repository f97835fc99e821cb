"""A newcomer's first hour (issue #37, item 7): each message a new user meets names what went
wrong and what to do, and what it says to do works when done.

- a read-only Hugging Face cache names HF_HUB_CACHE / HF_HOME, not the pull's --local-dir (the
  real file systems are in tests/hub/test_unwritable_targets.py; the rule in
  tests/util/test_placing.py);
- ``--model`` naming neither a folder nor a Hub model says both, for each way the Hub fails;
- a text file over the 64 MiB limit is refused in a size, and the docs state the limit;
- ``python -m cubepack.demo`` without MemoryOS says what to install, and README's Install says
  MemoryOS needs transformers < 5;
- a push that cannot reach its endpoint never suggests HF_HUB_OFFLINE (which cannot help a
  push); one made with HF_HUB_OFFLINE set says to unset it, and then it pushes.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cubepack.format._content import MAX_TEXT_BYTES
from cubepack.testing import free_port

from envs import MEMOS, chain_once
from helpers import cli_in_process, copy_of

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A new process's environment: its own HF cache, no endpoint, no offline switch."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_TOKEN")}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_CACHE=str(tmp_path / "hf-home" / "hub"))
    env.update(extra)
    return env


# --- --model naming neither a folder nor a Hub model -------------------------------------------

def _fingerprint(tmp_path: Path, name: str, **env: str) -> subprocess.CompletedProcess:
    return cli_in_process(["fingerprint", name], env=_env(tmp_path, **env), cwd=tmp_path)


@pytest.mark.parametrize("name", ["missing-model", "org/missing-model", "./missing-model",
                                  "my model"])
def test_a_model_that_is_neither_a_folder_nor_on_the_hub_says_both(tmp_path, hub, name):
    done = _fingerprint(tmp_path, name, HF_ENDPOINT=hub.url)
    assert done.returncode == 2, done.stdout + done.stderr
    message = done.stderr
    assert f"no folder {name}" in message and str(tmp_path) in message, message
    assert "Hub" in message and ("owner/name" in message or hub.url in message), message


@pytest.mark.parametrize("how", ["unreachable", "offline"])
def test_a_model_name_the_hub_cannot_answer_says_it_is_no_folder_either(tmp_path, how):
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
    if how == "offline":
        env["HF_HUB_OFFLINE"] = "1"
    done = _fingerprint(tmp_path, "org/missing-model", **env)
    assert done.returncode in (2, 3), done.stdout + done.stderr
    message = done.stderr
    assert "no folder org/missing-model" in message and str(tmp_path) in message, message
    assert "HF cache" in message or "Hugging Face cache" in message, message


def test_the_fix_works_a_folder_by_that_name_is_the_model(tmp_path, hub, zoo):
    assert _fingerprint(tmp_path, "missing-model", HF_ENDPOINT=hub.url).returncode == 2
    shutil.copytree(zoo["a"], tmp_path / "missing-model")
    done = _fingerprint(tmp_path, "missing-model", HF_ENDPOINT=hub.url)
    assert done.returncode == 0, done.stdout + done.stderr


# --- the text-file limit ----------------------------------------------------------------------

def test_a_text_file_over_the_limit_is_refused_in_a_size(tmp_path, packed_cube_factory):
    cube = copy_of(packed_cube_factory(), tmp_path)
    notes = cube / "notes.txt"
    with open(notes, "wb") as handle:  # sparse: its size, not 64 MiB written
        handle.truncate(MAX_TEXT_BYTES + 1)
    done = cli_in_process(["pack", cube], env=_env(tmp_path), cwd=tmp_path)
    assert done.returncode != 0
    message = done.stderr
    assert "64 MiB" in message and f"{MAX_TEXT_BYTES + 1:,} bytes" in message, message
    assert str(MAX_TEXT_BYTES) not in message, message  # a size, not a bare byte count
    assert "Remove it" in message
    notes.unlink()  # as it says
    done = cli_in_process(["pack", cube], env=_env(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_docs_state_the_text_limit_and_every_text_kind():
    from cubepack.format._content import TEXT_NAMES, TEXT_SUFFIXES

    checks = (ROOT / "docs" / "reference" / "checks.md").read_text(encoding="utf-8")
    [row] = [line for line in checks.splitlines() if line.startswith("|") and "UTF-8 text" in line]
    assert f"{MAX_TEXT_BYTES // 2**20} MiB" in row, row
    kinds = row.strip("|").split("|")[0]
    assert set(re.findall(r"`([^`]+)`", kinds)) == set(TEXT_SUFFIXES) | set(TEXT_NAMES), row


# --- the demo without MemoryOS ----------------------------------------------------------------

HIDE_MEMOS = ("import runpy, sys; sys.modules['memos'] = None; sys.argv[0] = 'cubepack.demo'; "
              "runpy.run_module('cubepack.demo', run_name='__main__', alter_sys=True)")


def test_the_demo_without_memoryos_says_what_to_install(tmp_path):
    out = tmp_path / "demo-out"
    # Where MemoryOS is installed, the test hides it, as an environment without it has it.
    argv = ([sys.executable, "-c", HIDE_MEMOS, str(out)] if MEMOS
            else [sys.executable, "-m", "cubepack.demo", str(out)])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False,
                          env=_env(tmp_path))
    assert done.returncode == 3, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    message = done.stderr
    for says in ("MemoryOS", "pip install 'cubepack[memos]'", "transformers < 5", "make demo"):
        assert says in message, message
    assert not out.exists()  # refused before anything was made


def test_the_install_section_says_memoryos_needs_transformers_below_5():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "MemoryOS" in install and "transformers < 5" in install, install
    # What the refusal says to install is the extra that brings MemoryOS.
    tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml: Python 3.11+")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(re.match(r"MemoryOS\b", requirement) for requirement in extras["memos"])


@pytest.mark.skipif(not MEMOS, reason="reads the installed MemoryOS's own requirements")
def test_memoryos_does_need_transformers_below_5():
    requires = importlib.metadata.requires("MemoryOS") or []
    [transformers] = [r for r in requires if re.match(r"transformers\b", r) and "extra" not in r]
    assert "<5" in transformers.replace(" ", "") or "<5.0" in transformers.replace(" ", "")


# --- a push that cannot reach its endpoint ----------------------------------------------------

PUSH = ["push", "--allow-local-paths"]  # the fixture cube names its model by a local path


@chain_once
def test_a_push_to_an_unreachable_endpoint_does_not_suggest_offline_mode(tmp_path, cube):
    env = _env(tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    done = cli_in_process(PUSH + [cube, "me/cube"], env=env, cwd=tmp_path)
    assert done.returncode != 0
    assert "Cannot reach" in done.stderr and "HF_HUB_OFFLINE" not in done.stderr, done.stderr


@chain_once
def test_a_push_with_offline_mode_set_says_to_unset_it_and_then_pushes(tmp_path, cube, hub):
    env = _env(tmp_path, HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="1")
    done = cli_in_process(PUSH + [cube, "me/cube"], env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "HF_HUB_OFFLINE" in done.stderr and "unset" in done.stderr, done.stderr
    assert "Cannot reach" not in done.stderr, done.stderr
    del env["HF_HUB_OFFLINE"]
    done = cli_in_process(PUSH + [cube, "me/cube"], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "commit:" in done.stdout


@chain_once
def test_a_pull_that_cannot_reach_its_endpoint_offers_what_is_on_disk(tmp_path, cube, hub):
    env = _env(tmp_path, HF_ENDPOINT=hub.url)
    pushed = cli_in_process(PUSH + [cube, "me/cube"], env=env, cwd=tmp_path)
    sha = re.search(r"commit: ([0-9a-f]{40})", pushed.stdout)[1]
    assert cli_in_process(["pull", f"me/cube@{sha}", "--local-dir", "first"], env=env,
                          cwd=tmp_path).returncode == 0
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"
    done = cli_in_process(["pull", f"me/cube@{sha}", "--local-dir", "first"], env=env,
                          cwd=tmp_path)
    assert done.returncode != 0 and "HF_HUB_OFFLINE=1" in done.stderr, done.stderr
    assert "first or the HF cache" in done.stderr, done.stderr
    env["HF_HUB_OFFLINE"] = "1"  # as it says: the folder holds that commit
    done = cli_in_process(["pull", f"me/cube@{sha}", "--local-dir", "first"], env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
