"""``python -m cubepack.demo`` (``make demo``): why shared memory must be pinned, offline.

1. starts a local Hub-compatible endpoint (``cubepack hub serve``) in its own process;
2. takes two tiny models trained to answer from their context (:mod:`cubepack.testing.reader`:
   same architecture and tokenizer, other seeds), publishes A, and has the real MemoryOS
   package build a cube whose KV cache model A extracted from the memory "Alice lives in
   Berlin."; A, asked "Where does Alice live?", answers from that cache: Berlin;
3. shows the bug: plain MemOS loads A's cache into B without a word, and B answers wrong;
4. packs, pushes and pulls the cube with the ``cubepack`` commands, printed exactly as run;
5. shows cubepack refusing A's cache for B, naming the field;
6. loads the pinned cube with the MemOS hook: A's cache into A, which answers Berlin again.

Every answer is MemOS's own (``llm.generate`` with the cache, greedy), printed as text.

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

FACT = "Alice lives in Berlin."
QUESTION = "Where does Alice live?"


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def call(text: str) -> None:
    """Print the Python call a step makes, as a user would type it."""
    print(f">>> {text}", flush=True)


def cubepack_command() -> list[str]:
    """This environment's ``cubepack`` (runnable as printed, even when it is not on ``PATH``)."""
    script = Path(sys.executable).with_name("cubepack")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "cubepack"]


def require_memos() -> None:
    """The demo drives MemoryOS: where it is not installed, say what to install, before
    anything is made. Looked up, not imported: importing it imports huggingface_hub, which
    must first see the demo's own endpoint and cache (set by :func:`main`).

    Raises:
        UnsupportedError: MemoryOS is not installed here.
    """
    import importlib.util

    try:
        found = importlib.util.find_spec("memos") is not None
    except ValueError:  # in sys.modules as None: a blocked import
        found = False
    if not found:
        raise _memos_missing("No module named 'memos'")


def _memos_missing(why: str) -> Exception:
    """The refusal for a MemoryOS this environment cannot import, naming what to install."""
    import importlib.metadata

    from .errors import UnsupportedError

    try:
        have = f"; this environment has transformers {importlib.metadata.version('transformers')}"
    except importlib.metadata.PackageNotFoundError:
        have = ""
    return UnsupportedError(
        f"The demo runs MemoryOS, which this environment cannot import ({why}). Run `make demo` "
        "in a cubepack checkout (it builds an environment with MemoryOS and runs the demo "
        "there), or pip install 'cubepack[memos]' into an environment of its own: MemoryOS "
        f"needs transformers < 5{have}.")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    work = Path(argv[0] if argv else "demo-out").resolve()
    require_memos()
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
    import cubepack
    import cubepack.memos
    from cubepack.testing import reader
    from cubepack.testing.hub import upload_folder

    step("2. Two tiny models trained to answer from their context (A and B: same recipe, "
         "other seeds); publish A; MemOS builds a cube with A")
    folder_a = shutil.copytree(reader.SHIPPED / "model-a", work / "model-a")
    folder_b = shutil.copytree(reader.SHIPPED / "model-b", work / "model-b")
    upload_folder(env["HF_ENDPOINT"], "demo/tiny-model-a", folder_a)
    from huggingface_hub import snapshot_download

    snapshot_a = Path(snapshot_download("demo/tiny-model-a"))
    cube_dir = work / "cube"
    call(f"cube = GeneralMemCube(config)  # act_mem: kv_cache, extractor_llm {snapshot_a}")
    call(f"cube.act_mem.add([cube.act_mem.extract({FACT!r})]); cube.dump({str(cube_dir)!r})")
    with _silenced():
        try:
            from memos.configs.mem_cube import GeneralMemCubeConfig
            from memos.mem_cube.general import GeneralMemCube
        except ImportError as exc:  # installed, yet it does not import (another transformers)
            raise _memos_missing(str(exc)) from exc

        source = GeneralMemCube(_memos_config(GeneralMemCubeConfig, snapshot_a))
        item = source.act_mem.extract(FACT)
        source.act_mem.add([item])
        source.dump(str(cube_dir))
    print(f"MemOS wrote {', '.join(sorted(p.name for p in cube_dir.iterdir()))}: model A's KV "
          f"cache of {FACT!r} ({item.memory.get_seq_length()} tokens), pickled")
    call(f"cube.act_mem.llm.generate([{{'role': 'user', 'content': {QUESTION!r}}}], "
         "past_key_values=<the cache>)")
    _answer("model A without the memory", source.act_mem.llm, None)
    _answer("model A with its own memory", source.act_mem.llm, item.memory)

    step("3. Without cubepack: plain MemOS hands A's cache to model B, silently")
    call(f"GeneralMemCube.init_from_dir({str(cube_dir)!r}, default_config=<config naming "
         f"{folder_b}>)")
    with _silenced():
        plain = GeneralMemCube.init_from_dir(
            str(cube_dir), default_config=_memos_config(GeneralMemCubeConfig, folder_b))
    [loaded] = plain.act_mem.get_all()
    print("no error, no warning; B is asked the same question with the cache MemOS loaded:")
    _answer("plain MemOS hands A's cache to model B", plain.act_mem.llm, loaded.memory)
    _answer("model B with its own memory", plain.act_mem.llm,
            plain.act_mem.extract(FACT).memory)
    print("  (B reads its own cache well: the wrong answer comes from being handed A's)")

    step("4. With cubepack: pin, convert (no pickle), lock, push one commit, pull that commit")
    _command([*cubepack_command(), "pack", str(cube_dir), "--legacy-pickle", "--license",
              "apache-2.0"])
    pushed = _command([*cubepack_command(), "push", str(cube_dir), "demo/tiny_cube", "--tag", "v1"])
    sha = next(line.split()[-1] for line in pushed.splitlines() if line.startswith("commit:"))
    pulled_dir = work / "pulled"
    _command([*cubepack_command(), "pull", f"demo/tiny_cube@{sha}", "--local-dir", str(pulled_dir)])

    step("5. Offer model B: cubepack refuses, naming what differs")
    activation = next((pulled_dir / "activations").glob("*.kv.safetensors"))
    call(f"cubepack.load_kv_cache({str(activation)!r}, model_b)")
    try:
        cubepack.load_kv_cache(activation, plain.act_mem.llm.model)
    except cubepack.IdentityMismatch as refusal:
        print(f"cubepack refuses: {'; '.join(str(m) for m in refusal.mismatches)}")
        print(f"  the whole message: {refusal}")
    else:
        print("ERROR: model B was not refused")
        return 1

    step("6. The MemOS hook loads the pinned commit: A's cache into A")
    call(f"cubepack.memos.init_from_remote_repo('demo/tiny_cube@{sha}')")
    with _silenced():
        pinned = cubepack.memos.init_from_remote_repo(f"demo/tiny_cube@{sha}")
    [verified] = pinned.act_mem.get_all()
    model_a = cubepack.fingerprint(pinned.act_mem.llm.model)
    print(f"loaded {pinned.cubepack.loaded} from commit {pinned.cubepack.commit_sha}, model "
          f"{model_a.model_id}@{model_a.revision}")
    _answer("the hook loads into A", pinned.act_mem.llm, verified.memory)
    print(f"\ndone: everything is under {work}")
    return 0


def _memos_config(config_class, model_path: Path):
    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(model_path),
                                                 "max_tokens": 8}}
    return config_class.model_validate({
        "user_id": "demo", "cube_id": "demo/tiny_cube", "text_mem": {"backend": "uninitialized"},
        "act_mem": {"backend": "kv_cache", "config": {"extractor_llm": llm}}})


def _answer(label: str, llm, cache) -> str:
    """MemOS's own answer to :data:`QUESTION` (greedy), from ``cache`` (a copy: MemOS's
    ``generate`` appends the question to the cache it is given) or from no memory at all."""
    import copy

    with _silenced():
        text = llm.generate([{"role": "user", "content": QUESTION}],
                            past_key_values=None if cache is None else copy.deepcopy(cache))
    print(f"{label}: {text or '(an empty answer)'}", flush=True)
    return text


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
