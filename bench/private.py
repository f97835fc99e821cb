"""Benchmark: a private cube's KV cache, decrypted in memory and loaded, against MemOS's
plaintext ``pickle.load`` of the same cache; then age encryption and decryption throughput,
cubepack (native for every identity type since issue #37; pyrage, the age Rust crate, which
SSH keys took before, for comparison) against Debian's ``age`` CLI (Go) on the same file; and
the SSH identities (ssh-ed25519, ssh-rsa): cubepack's native decryption into private
anonymous memory against the path they took before (pyrage's bytes, copied into it).

The cache is kv_load.py's: ~210 MB bfloat16, 32 layers, 8 KV heads of dim 128, 1600 tokens.
``load_kv_cache(..., decrypt_with=KEY)`` maps the ciphertext, decrypts it on one thread per
core into private anonymous memory (huge pages) and views the tensors there (zero-copy,
every tensor's checksum checked); the identity of the live model is given, as a server that
loads many caches into one model does. Target: faster than ``pickle.load`` of the plaintext
pickle. cubepack's decrypt throughput is that first step alone (file mapped, decrypted into
fresh memory, on every core this process may use: the count is printed); the age CLI decrypts
on one thread, a process a run, to /dev/null. Not a test: numbers depend on the machine
(2 shared cores here).

Run: .venv/latest/bin/python bench/private.py [--smoke]
(``--smoke``: a 4-layer, 64-token cache, so the script cannot rot.)
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401 - a report without progress bars or library warnings
import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

import cubepack
from cubepack.ops._private import decrypted_memory
from cubepack.testing import tiny
from cubepack.trust import _age as age
from cubepack.trust import _age_stream

REPEATS = 5
LAYERS, KV_HEADS, HEAD_DIM, TOKENS = 32, 8, 128, 1600


def times(action, repeats: int) -> list[float]:
    found = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        found.append(time.perf_counter() - start)
    return found


def touch(cache) -> float:
    return sum(float(layer.keys.sum()) + float(layer.values.sum()) for layer in cache.layers)


def main() -> None:
    global LAYERS, TOKENS, REPEATS
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    if parser.parse_args().smoke:
        LAYERS, TOKENS, REPEATS = 4, 64, 2
    work = Path(tempfile.mkdtemp(prefix="cubepack-bench-private-"))
    try:
        run(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path) -> None:
    from pyrage import x25519

    config = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=64,
                         num_hidden_layers=LAYERS, num_attention_heads=KV_HEADS,
                         num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(work / "model")
    tiny.build_tokenizer().save_pretrained(work / "model")
    model = tiny.load(work / "model", dtype=torch.bfloat16)
    cache = DynamicCache(config=model.config)
    for layer in range(LAYERS):
        shape = (1, KV_HEADS, TOKENS, HEAD_DIM)
        cache.update(torch.randn(shape, dtype=torch.bfloat16),
                     torch.randn(shape, dtype=torch.bfloat16), layer)
    kv_path = cubepack.save_kv_cache(cache, work / "item.kv.safetensors", producer=model)
    size = kv_path.stat().st_size
    pickle_path = work / "activation_memory.pickle"
    with open(pickle_path, "wb") as handle:  # MemOS KVCacheMemory.dump layout
        pickle.dump({"kv_cache_memories": {"item-1": {"id": "item-1", "memory": cache}}}, handle)

    identity = x25519.Identity.generate()
    key = work / "key.txt"
    key.write_text(f"{identity}\n")
    os.chmod(key, 0o600)
    recipient = str(identity.to_public())
    recipients = age.parse_recipients([recipient])
    encrypted = work / "item.kv.safetensors.age"
    encrypted.write_bytes(age.encrypt(kv_path.read_bytes(), recipients))
    live = cubepack.fingerprint(model)

    def load_pickle():
        with open(pickle_path, "rb") as handle:
            pickle.load(handle)

    def load_private():
        return cubepack.load_kv_cache(encrypted, model, identity=live, decrypt_with=key)

    def load_private_and_touch():
        touch(load_private())

    def load_pickle_and_touch():
        with open(pickle_path, "rb") as handle:
            touch(pickle.load(handle)["kv_cache_memories"]["item-1"]["memory"])

    pickled = times(load_pickle, REPEATS)
    private = times(load_private, REPEATS)
    pickled_used = times(load_pickle_and_touch, REPEATS)
    private_used = times(load_private_and_touch, REPEATS)
    print(f"cache: {size / 1e6:.0f} MB bfloat16, {LAYERS} layers, {TOKENS} tokens "
          f"(python {sys.version.split()[0]}, torch {torch.__version__})")
    for label, found in (("pickle.load, plaintext (MemOS)", pickled),
                         ("decrypt + load_kv_cache", private),
                         ("pickle.load + sum of every tensor", pickled_used),
                         ("decrypt + load + sum of every tensor", private_used)):
        print(f"{label:<40} best {min(found) * 1e3:8.1f} ms  median "
              f"{statistics.median(found) * 1e3:8.1f} ms")
    print(f"ratio pickle.load / (decrypt + load): {statistics.median(pickled) / statistics.median(private):.2f}x "
          f"median (target > 1); with every tensor read: "
          f"{statistics.median(pickled_used) / statistics.median(private_used):.2f}x")

    plain = kv_path.read_bytes()
    ours_enc = times(lambda: age.encrypt(plain, recipients), REPEATS)
    ours_dec = times(lambda: decrypted_memory(encrypted, key), REPEATS)
    import pyrage

    ciphertext = encrypted.read_bytes()
    rage_enc = times(lambda: pyrage.encrypt(plain, [identity.to_public()]), REPEATS)
    rage_dec = times(lambda: pyrage.decrypt(ciphertext, [identity]), REPEATS)
    print(f"cubepack (native X25519 path) encrypt {size / min(ours_enc) / 1e6:6.0f} MB/s, "
          f"decrypt {size / min(ours_dec) / 1e6:6.0f} MB/s (best of {REPEATS}; "
          f"up to {_age_stream.workers()} threads)")
    print(f"pyrage (the age crate, SSH keys' path before) encrypt "
          f"{size / min(rage_enc) / 1e6:6.0f} MB/s, decrypt {size / min(rage_dec) / 1e6:6.0f} MB/s")
    ssh_identities(work, plain, size)
    cli = shutil.which("age")
    if cli is None:
        print("age CLI: not installed (apt-get install age); no ratio")
        return
    out = work / "cli.age"
    theirs_enc = times(lambda: subprocess.run([cli, "-r", recipient, "-o", str(out),
                                               str(kv_path)], check=True), REPEATS)
    theirs_dec = times(lambda: subprocess.run([cli, "-d", "-i", str(key), "-o", os.devnull,
                                               str(encrypted)], check=True), REPEATS)
    print(f"age CLI {subprocess.run([cli, '--version'], capture_output=True, text=True).stdout.strip()}"
          f"  encrypt {size / min(theirs_enc) / 1e6:7.0f} MB/s, decrypt "
          f"{size / min(theirs_dec) / 1e6:7.0f} MB/s (best of {REPEATS}, a process each)")
    print(f"ratio cubepack / age CLI throughput: encrypt {min(theirs_enc) / min(ours_enc):.2f}x, "
          f"decrypt {min(theirs_dec) / min(ours_dec):.2f}x")


def ssh_identities(work: Path, plain: bytes, size: int) -> None:
    """Decrypt throughput of the SSH identity types: native (now) against pyrage's bytes
    copied into private anonymous memory (what ``decrypted_memory`` did before)."""
    import pyrage

    from cubepack._util.ramdir import anonymous_memory

    if shutil.which("ssh-keygen") is None:
        print("ssh-keygen: not installed; no SSH identity numbers")
        return
    for kind, bits in (("ed25519", []), ("rsa", ["-b", "3072"])):
        key = work / f"id_{kind}"
        subprocess.run(["ssh-keygen", "-q", "-t", kind, *bits, "-N", "", "-f", str(key)],
                       check=True)
        public = key.with_suffix(".pub").read_text().strip()
        encrypted = work / f"item.{kind}.age"
        encrypted.write_bytes(age.encrypt(plain, age.parse_recipients([public])))
        ciphertext = encrypted.read_bytes()
        theirs = pyrage.ssh.Identity.from_buffer(key.read_bytes())

        def before() -> None:
            decrypted = pyrage.decrypt(ciphertext, [theirs])
            memory = anonymous_memory(len(decrypted))
            memory[:len(decrypted)] = decrypted

        now = times(lambda: decrypted_memory(encrypted, key), REPEATS)
        then = times(before, REPEATS)
        print(f"ssh-{kind}: decrypt into private memory, native {size / min(now) / 1e6:6.0f} "
              f"MB/s (median {size / statistics.median(now) / 1e6:6.0f}); before (pyrage + "
              f"copy) {size / min(then) / 1e6:6.0f} MB/s (median "
              f"{size / statistics.median(then) / 1e6:6.0f}): "
              f"{min(then) / min(now):.1f}x")


if __name__ == "__main__":
    main()
