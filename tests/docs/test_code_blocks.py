"""Every code block of the docs and the README runs as written, or says why it cannot.

Each page runs in a folder of its own, its blocks in order, as a reader would type them:

- Python blocks share one namespace per page (a later block uses what an earlier one made);
- a bash block runs command by command (lines joined at a trailing ``\\``). A ``cubepack``
  command runs through the CLI's own entry point in this process (a new process would spend
  its time importing torch and transformers; the commands' behaviour as processes is tested in
  tests/e2e), any other command in ``bash``, with this environment's ``cubepack`` and
  ``python`` first on ``PATH``. ``export NAME=VALUE`` sets a variable for the page's later
  commands. A command must exit 0, unless its comment says ``exit N``: then it must exit N
  (a refusal the page shows);
- the page's environment: a local Hub endpoint of its own in ``HF_ENDPOINT``
  (:class:`~cubepack.testing.hub.InstrumentedHub`), a private HF cache, no token.

A block marked ``<!-- not-run: WHY -->`` is not run, and must say why. A page's
``<!-- docs-test: setup ... -->`` lays out first what the page tells its reader to have:

- ``models``: ``model-a/`` and ``model-b/``, two tiny Llama models of one shape (other seeds),
  built as the first tutorial builds them;
- ``cube``: ``models``, and ``my_cube/``, a plain bundle of two KV caches model A computed
  (token ids and source texts recorded), packed with ``--cube-id me/my_cube --model model-a``;
- ``keys``: ``key.pem`` and ``pub.pem``, an ECDSA P-256 key pair.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from docs_pages import ROOT, code_blocks, pages, setups

from envs import once
from helpers import as_new_process, cli_in_process

pytestmark = once

#: The pages with a block to run (a page whose every block is marked not-run is still read by
#: the marking test below).
PAGES = [page for page in pages()
         if any(block.not_run is None for block in code_blocks(page))]
_EXIT = re.compile(r"#.*\bexit (\d+)\b")


def test_every_page_with_code_is_collected():
    assert Path("README.md") in PAGES and Path("docs/tutorials/first-cube.md") in PAGES


def test_every_block_not_run_says_why():
    unexplained = [block.where for page in pages() for block in code_blocks(page)
                   if block.not_run is not None and len(block.not_run) < 10]
    assert unexplained == []


@pytest.mark.parametrize("page", PAGES, ids=str)
def test_the_page_runs_as_written(page, tmp_path):
    from cubepack.testing.hub import InstrumentedHub

    work = tmp_path / "work"
    work.mkdir()
    bin_dir = str(Path(sys.executable).parent)
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_CACHE=str(tmp_path / "hf-home/hub"),
               HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
               CUBEPACK_NO_PROGRESS="1", PATH=bin_dir + os.pathsep + env.get("PATH", ""),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    with InstrumentedHub(tmp_path / "hub-root") as hub:
        env["HF_ENDPOINT"] = hub.url
        for name in setups(page):
            SETUPS[name](work, env)
        namespace: dict = {"__name__": "__docs__"}
        for block in code_blocks(page):
            if block.not_run is not None:
                continue
            if block.lang == "python":
                with as_new_process(env=env, cwd=work):
                    try:
                        exec(compile(block.code, block.where, "exec"), namespace)  # noqa: S102
                    except Exception as exc:  # noqa: BLE001 - name the block that failed
                        raise AssertionError(f"{block.where}: {type(exc).__name__}: {exc}") \
                            from exc
            else:
                for line, command in commands(block.code, block.line):
                    run_command(command, env, work, f"{block.page}:{line}")


def commands(code: str, first_line: int) -> list[tuple[int, str]]:
    """The commands of a bash block: (line number in the page, command), a trailing
    backslash joining lines, blank and comment lines skipped."""
    found, pending, start = [], "", 0
    for offset, line in enumerate(code.splitlines(), start=first_line + 1):
        if not pending:
            start = offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = (pending + line).strip()
        pending = ""
        if command and not command.startswith("#"):
            found.append((start, command))
    return found


def run_command(command: str, env: dict[str, str], work: Path, where: str) -> None:
    expected = int(_EXIT.search(command)[1]) if _EXIT.search(command) else 0
    words = shlex.split(command, comments=True)
    if words and words[0] == "export" and len(words) == 2 and "=" in words[1]:
        name, _, value = words[1].partition("=")
        env[name] = os.path.expandvars(value)
        return
    if words and words[0] == "cubepack" and not set("|&;<>$`") & set(command.split("#")[0]):
        done = cli_in_process(words[1:], env=env, cwd=work)
    else:
        done = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True,
                              text=True, timeout=300, check=False)
    assert done.returncode == expected, (
        f"{where}: `{command}` exited {done.returncode}, not {expected}\n"
        f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}")


# --- what a page may ask to find laid out ------------------------------------------------------

def _models(work: Path, env: dict[str, str]) -> None:
    from cubepack.testing import tiny

    if (work / "model-b").is_dir():
        return
    tokenizer = tiny.build_tokenizer()
    tiny.build_model(work / "model-a", tiny.llama_config(), seed=0, tokenizer=tokenizer)
    tiny.build_model(work / "model-b", tiny.llama_config(), seed=1, tokenizer=tokenizer)


#: The bundle ``cube`` lays out: item id -> (token ids, source text).
CUBE_ITEMS = {"tea": ([1, 17, 42, 7, 99, 5], "The user likes green tea."),
              "city": ([3, 4, 5, 6, 200], "The user lives in Paris.")}


def _cube(work: Path, env: dict[str, str]) -> None:
    import torch

    import cubepack
    from cubepack.testing import tiny

    _models(work, env)
    model = tiny.load(work / "model-a")
    (work / "my_cube" / "activations").mkdir(parents=True)
    for item, (ids, text) in CUBE_ITEMS.items():
        tensor = torch.tensor([ids])
        cubepack.save_kv_cache(cubepack.prefill(model, tensor),
                               work / "my_cube" / "activations" / f"{item}.kv.safetensors",
                               producer=model, token_ids=tensor,
                               metadata={"source_text": text})
        (work / "my_cube" / f"{item}.txt").write_text(text + "\n")
    done = cli_in_process(["pack", "my_cube", "--cube-id", "me/my_cube", "--model", "model-a"],
                          env=env, cwd=work)
    assert done.returncode == 0, done.stderr


def _keys(work: Path, env: dict[str, str]) -> None:
    for command in ("openssl ecparam -name prime256v1 -genkey -noout -out key.pem",
                    "openssl ec -in key.pem -pubout -out pub.pem"):
        subprocess.run(shlex.split(command), cwd=work, check=True, capture_output=True)


SETUPS = {"models": _models, "cube": _cube, "keys": _keys}


def test_every_setup_a_page_asks_for_exists():
    asked = {name for page in pages() for name in setups(page)}
    assert asked <= set(SETUPS)

