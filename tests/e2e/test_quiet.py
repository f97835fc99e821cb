"""Output a log can hold: with stderr not a terminal, every command and the MemOS hook print no
progress bar (``\\r``) and no third-party warning line; ``--verbose`` / ``CUBEPACK_VERBOSE=1``
lets the libraries' warnings through. Each command runs as a user runs it: its own process,
stderr a pipe, against a real local endpoint (``cubepack hub serve``) in its own process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoTokenizer

from cubepack.memos_format._layout import memos_prompt_ids
from cubepack.testing import free_port
from cubepack.testing.hub import upload_folder

from helpers import as_lock_version_1, build_cache, make_key
from memos_format import write_cube

TOKEN = "hf_quiet_token"
#: Switches that would hide the noise this test looks for: a user's shell has none of them.
_QUIETING = ("CUBEPACK_NO_PROGRESS", "HF_HUB_DISABLE_PROGRESS_BARS", "CUBEPACK_VERBOSE",
             "TRANSFORMERS_VERBOSITY", "HF_HUB_VERBOSITY", "TRANSFORMERS_NO_ADVISORY_WARNINGS",
             "PYTHONWARNINGS")


def user_environment(tmp_path, endpoint: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _QUIETING}
    env.update(HF_ENDPOINT=endpoint, HF_TOKEN=TOKEN, HF_HUB_CACHE=str(tmp_path / "user-hf-cache"),
               CUBEPACK_CACHE=str(tmp_path / "user-cubepack-cache"), **extra)
    return env


def noise(text: str, *, expected: tuple[str, ...] = ()) -> list[str]:
    """Lines a log should not hold: any with a progress bar's carriage return, and any that is
    not cubepack's own: its warnings hold ``cubepack:`` (also when MemOS's log handler prints
    them), its errors begin ``error:``; ``expected`` are the prefixes of a script's output."""
    return [line for line in text.split("\n") if "\r" in line] + [
        line for line in text.splitlines()
        if line.strip() and "cubepack:" not in line and not line.startswith(("error:", *expected))]


@pytest.fixture
def endpoint(tmp_path):
    """``cubepack hub serve`` in its own process, stdout and stderr pipes; its stderr is
    checked for noise when it stops."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "cubepack", "hub", "serve", "--root", str(tmp_path / "hub-root"),
         "--port", str(port), "--token", TOKEN],
        env=user_environment(tmp_path, "http://unused"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        assert "serving" in server.stdout.readline()
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        _, err = server.communicate(timeout=60)
    assert noise(err) == [], err


def test_every_command_is_quiet_when_stderr_is_not_a_terminal(endpoint, zoo, models, tmp_path):
    """fingerprint, inspect, pack (with --recompute: the producer is loaded), verify, sign,
    diff, upgrade, push and pull: each downloads, loads or writes models through
    huggingface_hub and transformers, with their bars and warnings at their defaults."""
    upload_folder(endpoint, "tiny-org/model-a", zoo["a"], token=TOKEN)
    env = user_environment(tmp_path, endpoint)
    work = tmp_path / "work"
    work.mkdir()
    # A cache MemOS would build (its chat template around the text), so pack can prove it.
    tokenizer = AutoTokenizer.from_pretrained(zoo["a"])
    ids = memos_prompt_ids(tokenizer, "The user likes green tea.")
    caches = {"item-1": build_cache(models["a"], torch.tensor([ids]))}
    write_cube(work / "cube", "tiny-org/model-a", caches, texts={"item-1": "The user likes green tea."})
    (work / "cube" / "README.md").write_text("# My cube\n\nNotes, no front matter.\n")
    shutil.copytree(work / "cube", work / "raw")
    key, public = make_key(tmp_path, "signer")

    def cli(*args, verbose=False):
        argv = [sys.executable, "-m", "cubepack", *(["--verbose"] if verbose else []),
                *map(str, args)]
        done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    ran = {
        "fingerprint": cli("fingerprint", "tiny-org/model-a"),
        "pack": cli("pack", "cube", "--model", "tiny-org/model-a", "--legacy-pickle",
                    "--recompute", "--license", "apache-2.0"),
        "inspect": cli("inspect", "cube/activations/item-1.kv.safetensors"),
        "verify": cli("verify", "cube", "--model", "tiny-org/model-a", "--recompute"),
        "sign": cli("sign", "cube", "--key", key),
        "push": cli("push", "cube", "me/cube", "--tag", "v1"),
        "pull": cli("pull", "me/cube@v1", "--local-dir", "pulled", "--trusted-key", public,
                    "--recompute", "--model", "tiny-org/model-a"),
    }
    shutil.copytree(work / "pulled", work / "old", ignore=shutil.ignore_patterns("cubepack.sig"))
    as_lock_version_1(work / "old", zoo["a"] / "tokenizer.json")  # as cubepack 0.1 wrote it
    ran["upgrade"] = cli("upgrade", "old", "--model", "tiny-org/model-a")
    ran["diff"] = cli("diff", "pulled", "old")
    loud = {name: noise(done.stderr) for name, done in ran.items()}
    assert all(lines == [] for lines in loud.values()), loud
    # --verbose lets the libraries' warnings through (pack reads the cube's own README, which
    # has no front matter, and huggingface_hub says so), still without bars.
    verbose = cli("pack", "raw", "--legacy-pickle", verbose=True)
    assert "Repo card metadata block was not found" in verbose.stderr
    assert "\r" not in verbose.stderr


MEMOS_LOAD = textwrap.dedent("""
    import sys

    import cubepack.memos

    cube = cubepack.memos.init_from_remote_repo(sys.argv[1])  # imports MemOS, quietly
    print("loaded", cube.cubepack.loaded)
    from memos.configs.mem_cube import GeneralMemCubeConfig

    llm = {"backend": "huggingface", "config": {"model_name_or_path": sys.argv[2]}}
    other = GeneralMemCubeConfig.model_validate({
        "user_id": "u1", "cube_id": "u1/tiny_cube", "text_mem": {"backend": "uninitialized"},
        "act_mem": {"backend": "kv_cache", "config": {"extractor_llm": llm}}})
    dropped = cubepack.memos.init_from_remote_repo(sys.argv[1], default_config=other,
                                                   on_mismatch="drop")
    print("dropped", sorted(dropped.cubepack.dropped))
""")


@pytest.mark.memos
def test_the_memos_hook_is_quiet_when_stderr_is_not_a_terminal(endpoint, zoo, tmp_path):
    """``cubepack.memos.init_from_remote_repo`` in a fresh process, as a MemOS user's script
    runs it: MemOS's import-time and load-time WARNING lines, pydantic's serializer warnings,
    transformers' deprecation lines and huggingface_hub's "Fetching N files" bar stay out of
    the log; cubepack's own warning (an activation dropped for another model) stays in.
    ``CUBEPACK_VERBOSE=1`` lets the libraries' lines through again."""
    pytest.importorskip("memos")
    from huggingface_hub import snapshot_download
    from memos.mem_cube.general import GeneralMemCube

    import cubepack.memos
    from cubepack.hub import push

    from memos_live import cube_config

    commit = upload_folder(endpoint, "tiny-org/model-a", zoo["a"], token=TOKEN)
    snapshot = snapshot_download("tiny-org/model-a", revision=commit, endpoint=endpoint,
                                 token=TOKEN, cache_dir=tmp_path / "author-cache")
    source = GeneralMemCube(cube_config(snapshot))
    source.act_mem.add([source.act_mem.extract("The user likes green tea.")])
    packed = cubepack.memos.pack_cube(source, tmp_path / "packed")
    sha = push(packed, "ns/cube", endpoint=endpoint, token=TOKEN).commit_sha
    env = user_environment(tmp_path, endpoint, MEMOS_BASE_PATH=str(tmp_path / "memos-home"))
    script = tmp_path / "load.py"
    script.write_text(MEMOS_LOAD)

    def load(**extra):
        done = subprocess.run([sys.executable, str(script), f"ns/cube@{sha}", str(zoo["b"])],
                              env={**env, **extra}, capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 0, done.stderr
        assert "loaded [" in done.stdout and "dropped [" in done.stdout, done.stdout
        return done

    quiet = load()
    assert noise(quiet.stderr) == [], quiet.stderr
    assert noise(quiet.stdout, expected=("loaded [", "dropped [")) == [], quiet.stdout
    assert "cubepack: dropped activation" in quiet.stdout + quiet.stderr
    verbose = load(CUBEPACK_VERBOSE="1")
    assert "\r" not in verbose.stderr
    assert "Pydantic serializer warnings" in verbose.stderr  # the libraries' lines are back
    assert "WARNING" in verbose.stdout  # MemOS's log lines
