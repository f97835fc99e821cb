"""Small helpers shared by tests: build a cache, continue it, compare logits."""

from __future__ import annotations

import contextlib
import copy

import torch

from cubepack.kv._torch import forward, output_cache


def build_cache(model, ids):
    """Run ``model`` on ``ids`` and return its DynamicCache."""
    with torch.no_grad():
        return output_cache(forward(model, ids))


def continue_greedy(model, cache, first_token: int, steps: int) -> list[torch.Tensor]:
    """Feed one token at a time for ``steps`` steps; return each step's logits.

    The token fed next is the argmax of the previous step, so two caches that disagree anywhere
    diverge in their inputs too.
    """
    cache = copy.deepcopy(cache)
    token = torch.tensor([[first_token]])
    logits = []
    with torch.no_grad():
        for _ in range(steps):
            step = forward(model, token, cache).logits
            logits.append(step)
            token = step[:, -1:].argmax(-1)
    return logits


def all_equal(first: list[torch.Tensor], second: list[torch.Tensor]) -> bool:
    return len(first) == len(second) and all(torch.equal(a, b) for a, b in zip(first, second))


def tree_bytes(folder) -> dict:
    """Every file's bytes below ``folder``: to prove an operation changed nothing, or that two
    folders hold the same files."""
    from pathlib import Path

    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def pulled_files(folder) -> dict:
    """:func:`tree_bytes` of a pulled folder without its downloads' bookkeeping (cubepack's
    origin record, huggingface_hub's local-dir records): the files the commit holds."""
    from cubepack.format._fileset import is_bookkeeping

    return {name: data for name, data in tree_bytes(folder).items()
            if not is_bookkeeping(name)}


def reseal_lock(cube, change) -> None:
    """Edit a cube's lock and recompute its digests, as an attacker with write access could."""
    import json

    from cubepack._util import constants
    from cubepack.format import _lock as lockfile

    path = cube / constants.LOCK_FILENAME
    lock = json.loads(path.read_text())
    change(lock)
    resealed = lockfile.build_lock(cube_id=lock["cube_id"], files=lock["files"],
                                   models=lock["models"], activations=lock["activations"],
                                   cubepack_version=lock["cubepack_version"],
                                   adapters=lock.get("adapters"), lineage=lock.get("lineage"),
                                   shards=lock.get("shards"),
                                   preferences=lock.get("preferences"))
    path.write_text(lockfile.dumps(resealed))


def rewrite_kv_metadata(source, target, change, *, reseal=True):
    """Copy a KV file, rewriting its cubepack metadata JSON through ``change``; with
    ``reseal``, its header checksum is recomputed (as anyone editing a header can: the checks
    these tests reach lie behind it), else left as it was."""
    import json
    import struct

    from cubepack.kv import _checksum

    raw = source.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    meta = json.loads(header["__metadata__"]["cubepack"])
    change(meta)
    record = meta.get("checksums")
    if reseal and isinstance(record, dict) and "header" in record:
        try:
            meta = _checksum.seal(meta)
        except (TypeError, ValueError):
            pass  # not canonical JSON (NaN, ...): left as it was, for the reader to refuse
    header["__metadata__"]["cubepack"] = json.dumps(meta)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    target.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length:])
    return target


def make_key(folder, name: str, kind: str = "p256"):
    """Write an EC (p256/p384) or Ed25519 key pair as PEM; return (private, public) paths."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    key = {"p256": lambda: ec.generate_private_key(ec.SECP256R1()),
           "p384": lambda: ec.generate_private_key(ec.SECP384R1()),
           "ed25519": ed25519.Ed25519PrivateKey.generate}[kind]()
    private, public = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def copy_of(folder, tmp_path):
    """A private copy of a (module-scoped) cube folder for one test to modify."""
    import shutil

    copy = tmp_path / "cube"
    shutil.copytree(folder, copy)
    return copy


def run_torch_free(code: str):
    """Run ``code`` in a fresh interpreter; fail unless it succeeds without importing torch or
    transformers (``cubepack --help``, ``verify`` and folder fingerprints must stay light)."""
    import subprocess
    import sys

    check = ("\nimport sys as _sys\n"
             "_heavy = [m for m in ('torch', 'transformers') if m in _sys.modules]\n"
             "assert not _heavy, f'imported {_heavy}'\n")
    done = subprocess.run([sys.executable, "-c", code + check], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def as_format_1(source, target, tokenizer_json):
    """A file as cubepack 0.1 wrote it: version 1, no compute config, structural tokenizer
    digest."""
    from cubepack.identity._tokenizer_fields import legacy_tokenizer_digest_v1

    def downgrade(meta):
        meta["version"] = 1
        meta.pop("checksums", None)
        for key in ("compute_config", "prompt_format_digest"):
            meta["producer"].pop(key, None)
        meta["producer"]["tokenizer_digest"] = legacy_tokenizer_digest_v1(
            tokenizer_json.read_text())
    return rewrite_kv_metadata(source, target, downgrade)


def as_format_2(source, target):
    """A file as cubepack 0.2 wrote it: version 2, no per-tensor checksums."""
    def downgrade(meta):
        meta["version"] = 2
        meta.pop("checksums")
    return rewrite_kv_metadata(source, target, downgrade)


def reseal_kv_checksums(path):
    """Recompute, in place, a KV file's tensor and header checksums from its bytes as they are
    now (what anyone who edits tensors can do: the checks behind them are what these tests
    reach)."""
    from cubepack.kv import _checksum
    from cubepack.kv._format import read_kv_header

    header = read_header_of(path)
    pieces = _checksum.kv_file_pieces(header, list(header.tensors))
    raw = path.read_bytes()
    found = {name: _checksum.digest([raw[at:at + n] for at, n in ranges] or [b""])
             for name, ranges in pieces.items()}

    def change(meta):
        meta["checksums"]["tensors"] = found
    rewrite_kv_metadata(path, path, change)
    read_kv_header(path)
    return path


def read_header_of(path):
    from cubepack._util.safetensors_header import read_header

    return read_header(path)


def flip_tensor_byte(path, name, target=None, *, at=0.5):
    """Copy (or, without ``target``, change in place) a safetensors file with one bit of tensor
    ``name``'s data flipped (``at``: where in the tensor, as a fraction); returns the path."""
    from cubepack._util.safetensors_header import read_header

    header = read_header(path, aligned=False)
    tensor = header.tensors[name]
    offset = header.data_offset + tensor.begin + int((tensor.end - tensor.begin - 1) * at)
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    target = target or path
    target.write_bytes(bytes(raw))
    return target


def as_lock_version_1(cube, tokenizer_json):
    """A packed cube (in place) as cubepack 0.1 wrote it, every digest honest: KV files of
    format 1 without provenance, and a version-1 lock (pins without compute config or prompt
    format, with the format-1 tokenizer digest; activations without provenance)."""
    import json

    from cubepack._util import canonical, constants, hashing
    from cubepack.format import _lock as lockfile
    from cubepack.identity._tokenizer_fields import legacy_tokenizer_digest_v1

    path = cube / constants.LOCK_FILENAME
    lock = json.loads(path.read_text())
    for pin in lock["models"].values():
        if pin.get("identity"):
            for key in ("compute_config", "prompt_format_digest"):
                pin["identity"].pop(key, None)
            pin["identity"]["tokenizer_digest"] = legacy_tokenizer_digest_v1(
                tokenizer_json.read_text())
    for entry in lock["activations"].values():
        kv = cube / entry["file"]
        as_format_1(kv, kv, tokenizer_json)
        rewrite_kv_metadata(kv, kv, lambda meta: meta["metadata"].pop("provenance", None))
        entry.pop("provenance")
        entry["sha256"] = hashing.sha256_file(kv)
        lock["files"][entry["file"]] = {"sha256": entry["sha256"], "size": kv.stat().st_size}
    lock.pop("digest")
    lock["lock_version"] = 1
    lock["content_digest"] = lockfile.content_digest(lock)
    lock["digest"] = canonical.digest(lock)
    path.write_text(canonical.dumps(lock))
    return cube


def load_tool(name: str):
    """A script of ``tools/`` (not a package) imported as a module, for its tests."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_tools_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def make_adapter(base_folder, out, *, seed: int = 7, **config):
    """A LoRA adapter made by peft for the model in ``base_folder``, saved with
    ``save_pretrained`` into ``out``; random B matrices (``init_lora_weights=False``), so it
    changes the logits."""
    from peft import LoraConfig, get_peft_model

    from cubepack.testing import tiny

    torch.manual_seed(seed)
    config = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"],
              "init_lora_weights": False, **config}
    get_peft_model(tiny.load(base_folder), LoraConfig(**config)).save_pretrained(str(out))
    return out


#: huggingface_hub settings it reads from the environment once, at import: what a new process
#: given these variables would have (``cli_in_process`` sets them for the call).
_HUB_SETTINGS = {"HF_ENDPOINT": "ENDPOINT", "HF_HUB_CACHE": "HF_HUB_CACHE",
                 "HF_HUB_DISABLE_XET": "HF_HUB_DISABLE_XET", "HF_HUB_OFFLINE": "HF_HUB_OFFLINE"}


def point_hub_client_at(monkeypatch, url: str, cache) -> None:
    """Point this process's huggingface_hub at the endpoint ``url`` and the HF cache ``cache``,
    as a process started with HF_ENDPOINT and HF_HUB_CACHE set would be (its constants and the
    0.36 file_download's own copy of the URL template), online; ``monkeypatch`` undoes it."""
    from huggingface_hub import constants as hub_constants
    from huggingface_hub import file_download

    monkeypatch.setattr(hub_constants, "ENDPOINT", url)
    template = url + "/{repo_id}/resolve/{revision}/{filename}"
    for module in (hub_constants, file_download):
        if hasattr(module, "HUGGINGFACE_CO_URL_TEMPLATE"):
            monkeypatch.setattr(module, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@contextlib.contextmanager
def as_new_process(*, env: dict[str, str], cwd):
    """Run the ``with`` body with ``env`` and ``cwd`` as a new process would have them: the
    environment, the folder and huggingface_hub's import-time settings derived from the
    environment (its endpoint, cache, Xet and offline switches); all restored afterwards."""
    import os

    from huggingface_hub import constants, file_download

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved = {name: getattr(constants, name) for name in (*_HUB_SETTINGS.values(),
                                                          "HUGGINGFACE_CO_URL_TEMPLATE")}
    # huggingface_hub 0.36's file_download keeps its own copy of the URL template (imported by
    # name): a new process derives both from HF_ENDPOINT.
    template = getattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE", None)
    try:
        os.environ.clear()
        os.environ.update(env)
        for variable, name in _HUB_SETTINGS.items():
            if variable not in env:
                continue
            value = env[variable]
            if name == "ENDPOINT":
                value = value.rstrip("/")
            elif name != "HF_HUB_CACHE":  # a flag, read as huggingface_hub reads it
                value = value.upper() in {"1", "ON", "YES", "TRUE"}
            setattr(constants, name, value)
        constants.HUGGINGFACE_CO_URL_TEMPLATE = \
            constants.ENDPOINT + "/{repo_id}/resolve/{revision}/{filename}"
        if template is not None:
            file_download.HUGGINGFACE_CO_URL_TEMPLATE = constants.HUGGINGFACE_CO_URL_TEMPLATE
        os.chdir(cwd)
        yield
    finally:
        if template is not None:
            file_download.HUGGINGFACE_CO_URL_TEMPLATE = template
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for name, value in saved.items():
            setattr(constants, name, value)


def _dumpable(value: int | None = None) -> int | None:
    """This process's PR_GET_DUMPABLE (Linux), or set it back to ``value``."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None)
    if value is None:
        return libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
    libc.prctl(4, value, 0, 0, 0)  # PR_SET_DUMPABLE
    return value


def cli_in_process(args, *, env: dict[str, str], cwd):
    """``cubepack ARGS`` run by the CLI's own entry point in this process, with ``env`` and
    ``cwd`` as a new process would have them (the environment, and huggingface_hub's
    import-time settings derived from it): returncode, stdout and stderr, as
    ``subprocess.run`` gives them. For chains of commands whose subject is how the commands fit
    together (a refusal's advice, run as printed); a process's own behaviour (its output
    streams, exit, signals) is tested with real processes."""
    import io
    import subprocess

    from cubepack.cli import main

    out, err = io.StringIO(), io.StringIO()
    dumpable = _dumpable()
    try:
        with as_new_process(env=env, cwd=cwd):
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main([str(arg) for arg in args])
    finally:  # a command given an identity makes its process undumpable: not this one's
        _dumpable(dumpable)
    return subprocess.CompletedProcess(["cubepack", *map(str, args)], code, out.getvalue(),
                                       err.getvalue())


def without_kv_id(data: bytes) -> bytes:
    """A KV file's bytes with its metadata id dropped (its header resealed): copies of it take
    their ids from their file names."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "a.kv.safetensors", Path(tmp) / "b.kv.safetensors"
        source.write_bytes(data)
        rewrite_kv_metadata(source, target, lambda meta: meta["metadata"].pop("id"))
        return target.read_bytes()


def memos_kv_config(model_path, *, cube_id="u1/tiny_cube"):
    """A real MemoryOS ``GeneralMemCubeConfig`` with a KV cache memory extracted by the
    Hugging Face model at ``model_path`` (the memos environment's hook tests share it)."""
    from memos.configs.mem_cube import GeneralMemCubeConfig

    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(model_path),
                                                 "max_tokens": 6}}
    return GeneralMemCubeConfig.model_validate({
        "user_id": "u1", "cube_id": cube_id, "text_mem": {"backend": "uninitialized"},
        "act_mem": {"backend": "kv_cache", "config": {"extractor_llm": llm}}})
