"""Plain MemOS against the hook, on the real load and use paths a MemOS user takes.

For each path (``GeneralMemCube.init_from_dir``, ``init_from_remote_repo`` from a git remote,
``MOS`` and ``MOSCore`` register + chat, ``KVCacheMemory.load``, ``VLLMKVCacheMemory.load``)
and each cube: a valid MemOS dump (its producer recorded) must give the hook exactly what plain MemOS gives (the same
items, the same tensors, the same first answer); an invalid one (caches of a 3-layer model under
a 2-layer model's name) must be refused precisely by the hook, where plain MemOS loads it and
crashes or answers from it; a hostile one (a pickle that runs code) must run nothing under the
hook. MemOS's scheduler only dumps activations (covered by the portable-dump test), it loads
none. ``pytest -s`` prints the table.
"""

from __future__ import annotations

import pickle
import subprocess

import pytest
import torch

memos = pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

import cubepack
import cubepack.memos as hook

from adversarial import _Canary
from helpers import build_cache
from memos_format import write_cube
from memos_live import cube_config, mos_for, vllm_memory

QUESTION = "What does the user drink?"
PATHS = ["init_from_dir", "init_from_remote_repo", "MOS chat", "MOSCore chat",
         "KVCacheMemory.load", "VLLMKVCacheMemory.load"]
KINDS = ["valid", "invalid", "hostile"]
ROWS: list[tuple[str, str, str, str]] = []


def _git_remote(folder, root):
    """``root/remotes/owner/cube``: a git repo of ``folder``; (base_url, commit)."""
    remote = root / "remotes" / "owner" / "cube"
    remote.parent.mkdir(parents=True, exist_ok=True)
    import shutil

    shutil.copytree(folder, remote)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "cube"]):
        subprocess.run(["git", "-C", str(remote), *args], check=True, env=env)
    sha = subprocess.run(["git", "-C", str(remote), "rev-parse", "HEAD"], check=True,
                         capture_output=True, text=True).stdout.strip()
    return f"file://{root / 'remotes'}", sha


def _with_text_memory(folder, model):
    """MemOS 2.0.33's MOS cannot register a cube without a text memory (it reads
    ``text_mem.config``): give the differential cubes an empty naive one, so plain MemOS has a
    baseline on every path."""
    import json

    config = json.loads((folder / "config.json").read_text())
    config["text_mem"] = {"backend": "naive_text", "config": {
        "extractor_llm": {"backend": "huggingface", "config": {"model_name_or_path": model}}}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "textual_memory.json").write_text("[]")
    return folder


@pytest.fixture(scope="module")
def cubes(tmp_path_factory, zoo, models):
    from memos.memories.activation.item import VLLMKVCacheItem

    root = tmp_path_factory.mktemp("differential")
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    made = {
        # A valid dump records its producer (MemOS #2305): one without a record is of unknown
        # origin, refused under the hook by default (issue #30; tests/memos/attacks, the
        # lockless-pickle test), whatever its shape.
        "valid": write_cube(root / "valid", str(zoo["a"]), {"item-1": build_cache(models["a"], ids)},
                            producer={"model_name_or_path": str(zoo["a"])}),
        "invalid": write_cube(root / "invalid", str(zoo["a"]),
                              {"item-1": build_cache(models["deep"], ids)}),
    }
    for folder in made.values():
        _with_text_memory(folder, str(zoo["a"]))
    hostile = write_cube(root / "hostile", str(zoo["a"]), {})
    canary = root / "canary"
    (hostile / "activation_memory.pickle").write_bytes(pickle.dumps(_Canary(canary)))
    made["hostile"] = hostile
    prompts = write_cube(root / "prompts", str(zoo["a"]), {})  # what a vLLM memory dumps
    (prompts / "activation_memory.pickle").write_bytes(pickle.dumps({"kv_cache_memories": {
        "p1": VLLMKVCacheItem(id="p1", memory="<a prompt>", metadata={})}}))
    made["vllm valid"] = prompts
    remotes = {kind: _git_remote(folder, root / f"git-{kind}") for kind, folder in made.items()
               if kind != "vllm valid"}
    return made, remotes, canary


def _run(path, kind, cubes, zoo):
    """Load (and for MOS, chat) one way; return (outcome, detail, value to compare)."""
    from memos.mem_cube.general import GeneralMemCube
    from memos.memories.activation.kv import KVCacheMemory

    made, remotes, _ = cubes
    folder = made["vllm valid" if path == "VLLMKVCacheMemory.load" and kind == "valid" else kind]
    try:
        if path == "init_from_dir":
            cube = GeneralMemCube.init_from_dir(str(folder))
            value = _tensors(cube.act_mem)
        elif path == "init_from_remote_repo":
            base_url, sha = remotes[kind]
            cube = GeneralMemCube.init_from_remote_repo(f"owner/cube@{sha}" if hook.installed()
                                                        else "owner/cube", base_url=base_url)
            value = _tensors(cube.act_mem)
        elif path in ("MOS chat", "MOSCore chat"):
            mos = mos_for(zoo["a"], zoo["a"], kind=path.split()[0])
            mos.register_mem_cube(str(folder), mem_cube_id="c1")
            value = mos.chat(QUESTION)
        elif path == "KVCacheMemory.load":
            memory = KVCacheMemory(cube_config(zoo["a"]).act_mem.config)
            memory.load(str(folder))
            value = _tensors(memory)
        else:
            memory = vllm_memory("tiny-org/model-a")
            memory.load(str(folder))
            value = sorted(str(item.memory)[:20] for item in memory.get_all())
    except Exception as exc:  # noqa: BLE001 - the outcome is what we tabulate
        return "raised", f"{type(exc).__name__}: {exc}", type(exc)
    return "loaded", _describe(value), value


def _tensors(memory):
    return {item.id: [layer.keys.clone() for layer in item.memory.layers]
            for item in memory.get_all()} if memory is not None else {}


def _describe(value):
    if isinstance(value, dict):
        return f"{len(value)} item(s)"
    return repr(value)[:70]


def _same(first, second):
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(
            len(first[k]) == len(second[k]) and all(torch.equal(a, b)
                                                   for a, b in zip(first[k], second[k]))
            for k in first)
    return first == second


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", PATHS)
def test_hooked_equals_plain_on_valid_cubes_and_refuses_the_rest(path, kind, cubes, zoo,
                                                                 capsys):
    _, _, canary = cubes
    canary.unlink(missing_ok=True)
    hook.uninstall()
    plain = _run(path, kind, cubes, zoo) if kind != "hostile" else ("not run", "runs code", None)
    hook.install(require_pin=True)
    try:
        hooked = _run(path, kind, cubes, zoo)
    finally:
        hook.uninstall()
    ROWS.append((path, kind, f"{plain[0]}: {plain[1][:70]}", f"{hooked[0]}: {hooked[1][:70]}"))
    with capsys.disabled():
        print(f"\n{path:<24} {kind:<8} plain: {plain[0]}: {plain[1][:70]:<50} hooked: "
              f"{hooked[0]}: {hooked[1][:70]}")
    if kind == "valid":
        assert hooked[0] == plain[0] == "loaded", hooked
        assert _same(plain[2], hooked[2])
    elif kind == "invalid":
        if path == "VLLMKVCacheMemory.load":  # a vLLM memory holds prompts: tensors refused
            assert hooked[0] == "raised"
        else:
            assert hooked[0] == "raised" and issubclass(hooked[2], cubepack.CubepackError), hooked
            assert "num_layers" in hooked[1] or "geometry" in hooked[1] or "layers" in hooked[1]
    else:
        assert hooked[0] == "raised" and issubclass(hooked[2], cubepack.CubepackError), hooked
        assert not canary.exists(), "code ran"
