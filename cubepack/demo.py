"""``python -m cubepack.demo`` (``make demo``): why shared memory must be pinned, offline.

1. starts a local Hub-compatible endpoint (``cubepack hub serve``) in its own process;
2. builds two tiny same-shape models, A and B, publishes A, and has the real MemoryOS package
   build a cube whose KV cache model A extracted;
3. shows the bug: plain MemOS loads A's cache into B without a word, and B's answer changes;
4. packs, pushes and pulls the cube with the ``cubepack`` commands, printed exactly as run;
5. shows cubepack refusing A's cache for B, naming the field;
6. loads the pinned cube with the MemOS hook: A's cache into A, answers as A's own.

Everything lives under ``./demo-out`` (or the folder given as the first argument); the end of
the output says how to re-run the commands by hand.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

QUESTION = "What does the user drink?"
FACT = "The user is a Chinese man who likes green tea."


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def call(text: str) -> None:
    """Print the Python call a step makes, as a user would type it."""
    print(f">>> {text}", flush=True)


def cubepack_command() -> list[str]:
    """This environment's ``cubepack`` (runnable as printed, even when it is not on ``PATH``)."""
    script = Path(sys.executable).with_name("cubepack")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "cubepack"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    work = Path(argv[0] if argv else "demo-out").resolve()
    from ._util import atomic

    with atomic.placing(work, elsewhere="name another folder (python -m cubepack.demo FOLDER)",
                        whole=False):
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    from .testing import free_port

    port = free_port()
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HUB_CACHE": str(work / "hf-cache"),
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "CUBEPACK_CACHE": str(work / "cubepack-cache"),
           "MEMOS_BASE_PATH": str(work / "memos-home")}
    os.environ.update(env)  # read at import by huggingface_hub: set before anything imports it
    # torch creates its compiler cache in the temp folder on import: keep it with the rest.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "torch-cache"))
    step("1. A local Hub-compatible endpoint, in its own process")
    serve = [*cubepack_command(), "hub", "serve", "--root", str(work / "hub-root"),
             "--port", str(port), "--quiet"]
    print(f"$ {shlex.join(serve)} &")
    server = subprocess.Popen(serve, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        started = server.stdout.readline().strip()
        print(started)
        if not started.startswith("serving"):  # the endpoint failed: say why, do not go on
            print(server.communicate()[0].strip())
            return 1
        return _run(work, env)
    finally:
        server.terminate()
        server.wait()
        print("\nTo re-run the commands above by hand (the endpoint's data is kept):")
        print(f"  $ {shlex.join(serve)} &")
        print("  $ export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))


def _run(work: Path, env: dict[str, str]) -> int:
    _quiet_libraries()
    import torch

    import cubepack
    import cubepack.memos
    from cubepack.testing import tiny
    from cubepack.testing.hub import upload_folder

    step("2. Two tiny same-shape models (A and B: same config, other seeds); publish A; "
         "MemOS builds a cube with A")
    tokenizer = tiny.build_tokenizer()
    folder_a = tiny.build_model(work / "model-a", tiny.llama_config(), seed=0, tokenizer=tokenizer)
    folder_b = tiny.build_model(work / "model-b", tiny.llama_config(), seed=1, tokenizer=tokenizer)
    upload_folder(env["HF_ENDPOINT"], "demo/tiny-model-a", folder_a)
    from huggingface_hub import snapshot_download

    snapshot_a = Path(snapshot_download("demo/tiny-model-a"))
    cube_dir = work / "cube"
    call(f"cube = GeneralMemCube(config)  # act_mem: kv_cache, extractor_llm {snapshot_a}")
    call(f"cube.act_mem.add([cube.act_mem.extract({FACT!r})]); cube.dump({str(cube_dir)!r})")
    with _silenced():
        from memos.configs.mem_cube import GeneralMemCubeConfig
        from memos.mem_cube.general import GeneralMemCube

        source = GeneralMemCube(_memos_config(GeneralMemCubeConfig, snapshot_a))
        item = source.act_mem.extract(FACT)
        source.act_mem.add([item])
        source.dump(str(cube_dir))
    print(f"MemOS wrote {', '.join(sorted(p.name for p in cube_dir.iterdir()))}: model A's KV "
          f"cache of {FACT!r} ({item.memory.get_seq_length()} tokens), pickled")

    step("3. Without cubepack: plain MemOS loads A's cache into model B, silently")
    call(f"GeneralMemCube.init_from_dir({str(cube_dir)!r}, default_config=<config naming "
         f"{folder_b}>)")
    with _silenced():
        plain = GeneralMemCube.init_from_dir(
            str(cube_dir), default_config=_memos_config(GeneralMemCubeConfig, folder_b))
    [loaded] = plain.act_mem.get_all()
    model_b = plain.act_mem.llm.model
    wrong = _continue(model_b, tokenizer, loaded.memory)
    right = _continue(model_b, tokenizer, plain.act_mem.extract(FACT).memory)
    print(f"no error, no warning; B continues {QUESTION!r} from A's cache, against its own:")
    _compare(wrong, right)

    step("4. With cubepack: pin, convert (no pickle), lock, push one commit, pull that commit")
    _command([*cubepack_command(), "pack", str(cube_dir), "--legacy-pickle", "--license", "apache-2.0"])
    pushed = _command([*cubepack_command(), "push", str(cube_dir), "demo/tiny_cube", "--tag", "v1"])
    sha = next(line.split()[-1] for line in pushed.splitlines() if line.startswith("commit:"))
    pulled_dir = work / "pulled"
    _command([*cubepack_command(), "pull", f"demo/tiny_cube@{sha}", "--local-dir", str(pulled_dir)])

    step("5. Offer model B: cubepack refuses, naming what differs")
    activation = next((pulled_dir / "activations").glob("*.kv.safetensors"))
    call(f"cubepack.load_kv_cache({str(activation)!r}, model_b)")
    try:
        cubepack.load_kv_cache(activation, tiny.load(folder_b))
    except cubepack.IdentityMismatch as refusal:
        print(f"refused: {refusal}")
    else:
        print("ERROR: model B was not refused")
        return 1

    step("6. The MemOS hook loads the pinned commit: A's cache into A")
    call(f"cubepack.memos.init_from_remote_repo('demo/tiny_cube@{sha}')")
    with _silenced():
        pinned = cubepack.memos.init_from_remote_repo(f"demo/tiny_cube@{sha}")
    [verified] = pinned.act_mem.get_all()
    model_a = pinned.act_mem.llm.model
    print(f"loaded {pinned.cubepack.loaded} from commit {pinned.cubepack.commit_sha}, model "
          f"{cubepack.fingerprint(model_a).model_id}@{cubepack.fingerprint(model_a).revision}")
    _compare(_continue(model_a, tokenizer, verified.memory),
             _continue(model_a, tokenizer, pinned.act_mem.extract(FACT).memory))
    del torch
    print(f"\ndone: everything is under {work}")
    return 0


def _memos_config(config_class, model_path: Path):
    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(model_path),
                                                 "max_tokens": 8}}
    return config_class.model_validate({
        "user_id": "demo", "cube_id": "demo/tiny_cube", "text_mem": {"backend": "uninitialized"},
        "act_mem": {"backend": "kv_cache", "config": {"extractor_llm": llm}}})


def _continue(model, tokenizer, cache, steps: int = 8):
    """Greedy continuation of the question from a prefilled cache: (token ids, logits, text)."""
    import copy

    import torch

    from .kv._torch import forward

    cache = copy.deepcopy(cache)
    ids = tokenizer(QUESTION, return_tensors="pt").input_ids
    produced, logits = [], []
    with torch.no_grad():
        for _ in range(steps):
            out = forward(model, ids, cache).logits[:, -1]
            logits.append(out)
            ids = out.argmax(-1, keepdim=True)
            produced.append(int(ids))
    return produced, torch.cat(logits), tokenizer.decode(produced, skip_special_tokens=True)


def _compare(reused, own) -> None:
    agree = sum(a == b for a, b in zip(reused[0], own[0]))
    delta = (reused[1] - own[1]).abs().max().item()
    print(f"  top-1 tokens agree on {agree} of {len(own[0])} steps; max |delta logit| {delta:.3f}")
    print(f"  answer from the loaded cache: {reused[2]!r}\n"
          f"  answer from its own prefill:  {own[2]!r}   (a tiny random model: words, no sense)")


def _command(argv: list[str]) -> str:
    """Run a cubepack command exactly as printed; show its output."""
    print(f"$ {shlex.join(argv)}", flush=True)
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    output = (done.stdout + done.stderr).strip()
    print("\n".join(f"  {line}" for line in output.splitlines()))
    if done.returncode:
        raise SystemExit(f"the command above failed (exit {done.returncode})")
    return output


def _quiet_libraries() -> None:
    """MemOS and transformers log at import and on every load; keep the demo readable."""
    logging.disable(logging.WARNING)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@contextlib.contextmanager
def _silenced():
    """MemOS also prints to stdout and stderr; hide that while it works."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield



if __name__ == "__main__":
    from .errors import CubepackError

    try:
        sys.exit(main())
    except CubepackError as exc:  # one line, as the CLI prints it
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
