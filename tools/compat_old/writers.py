"""Writers of the fixtures older cubepack commits wrote, one function per fixture, each calling
that commit's public API (``cubepack.pack``, ``save_kv_cache``, ``sign``, ``migrate``,
``encrypt``: names that have not moved). Run by ``tools/make_compat_fixtures.py --old [NAME ...]``
with the commit's tree (``git archive``) first on PYTHONPATH, in its folder, as ``writers.py
COMMIT NAME...``; which commit and environment write which fixture is
``make_compat_fixtures.OLD``. Inputs are the current fixtures' own (the MemOS dump, the
adapter's and the text memory's files) and the tiny models, so only the writer differs."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import cubepack
from _compat_common import KEYS, MEMOS_DUMP, OUT, PROMPT, describe, fresh, model_folders

COMMIT = sys.argv[1]
# The cubepack imported is the commit's, not the checkout's (PYTHONPATH comes first).
assert Path(cubepack.__file__).resolve().is_relative_to(Path.cwd().resolve()), cubepack.__file__
MODELS = {name: str(folder) for name, folder in model_folders().items()}
SIGN, SIGN_PUB = str(KEYS / "signing.pem"), str(KEYS / "signing.pub.pem")
UPGRADE = "cubepack upgrade CUBE_DIR --model MODEL"
HERE = "tools/compat_old/writers.py"
#: An older attestation's recomputed statements are claims: required, they are proved anew.
PROVE_RECOMPUTED = {"verify": {"trusted_key": True, "require_provenance": "recomputed"},
                    "command": "cubepack verify CUBE_DIR --recompute --model MODEL "
                               "--require-provenance recomputed"}


def packed_dump(name: str, **options) -> Path:
    """A copy of the MemOS dump, packed by this commit with model A."""
    cube = fresh(name)
    shutil.copytree(MEMOS_DUMP, cube)
    cubepack.pack(cube, legacy_pickle=True, model=MODELS["a"], **options)
    return cube


def lone_kv(name: str) -> Path:
    folder = fresh(name, "kv")
    folder.mkdir()
    model = AutoModelForCausalLM.from_pretrained(MODELS["a"], attn_implementation="eager")
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    cubepack.save_kv_cache(cache, folder / "prompt.kv.safetensors", producer=model,
                           token_ids=ids)
    return folder


# --- 4b7ba82: lock version 1, KV format 1 ------------------------------------------------------

def lock1() -> None:
    packed_dump("lock1")
    describe("lock1", what="The MemOS dump packed by cubepack 0.1: lock version 1 (pins without "
             "a compute config, activations without provenance or token ids), KV format 1.",
             commit=COMMIT, how=f"cubepack.pack(cube, legacy_pickle=True, model=A) on a copy "
             f"of memos-pickle/cube ({HERE}).",
             expect={"artefact": "cube", "model": "a",
                     "fixes": [{"verify": {}, "command": UPGRADE},
                               {"verify": {"recompute": True},
                                "command": "cubepack pack CUBE --recompute --model MODEL"}],
                     "verify": {"recompute": True, "require_provenance": "recomputed"},
                     "load": True})


def kv1() -> None:
    lone_kv("kv1")
    describe("kv1", what="A lone KV file of KV format 1 (a producer without a compute config).",
             commit=COMMIT, how=f"cubepack.save_kv_cache(A's prefill of PROMPT, ..., "
             f"producer=A, token_ids=PROMPT) ({HERE}).",
             expect={"artefact": "kv", "model": "a",
                     "fixes": [{"load": True, "command": "cubepack upgrade PATH --model MODEL"}],
                     "load": True})


# --- e3b7d8c: lock version 2, KV format 2, a signature without attestation ----------------------

def lock2() -> None:
    packed_dump("lock2", recompute=True, sign_key=SIGN)
    describe("lock2", what="The MemOS dump packed and signed: lock version 2, KV format 2, "
             "cubepack.sig (OpenSSF model signing) and no attestation.", commit=COMMIT,
             how=f"cubepack.pack(cube, legacy_pickle=True, model=A, recompute=True, "
             f"sign_key=keys/signing.pem) on a copy of memos-pickle/cube ({HERE}).",
             expect={"artefact": "cube", "model": "a", "signed": True,
                     "verify": {"recompute": True, "trusted_key": True,
                                "require_signature": True},
                     "load": True})


# --- 9b0a97c: lock version 3 (adapters, lineage), attestation predicate version 1 -----------------

def attestation1() -> None:
    packed_dump("attestation1", recompute=True, sign_key=SIGN)
    describe("attestation1", what="The MemOS dump packed and signed: lock version 3, KV format "
             "2, an attestation of predicate version 1 (its statements are read as claims).",
             commit=COMMIT, how=f"cubepack.pack(cube, legacy_pickle=True, model=A, "
             f"recompute=True, sign_key=keys/signing.pem) on a copy of memos-pickle/cube "
             f"({HERE}).",
             expect={"artefact": "cube", "model": "a", "signed": True,
                     "verify": {"recompute": True, "trusted_key": True,
                                "require_signature": True, "require_lineage": True},
                     "basis": "claimed", "load": True, "refusals": [PROVE_RECOMPUTED]})


def lock3_adapters() -> None:
    cube = fresh("lock3-adapters")
    shutil.copytree(OUT / "adapters" / "cube" / "parametric", cube / "parametric")
    cubepack.pack(cube, cube_id="compat/adapter", adapter_base=MODELS["a"])
    describe("lock3-adapters", what="A cube holding a LoRA adapter (the adapters fixture's "
             "peft files): lock version 3 with its first adapters section (no scaling keys).",
             commit=COMMIT, how=f"cubepack.pack(cube, cube_id='compat/adapter', "
             f"adapter_base=A) on adapters/cube/parametric ({HERE}).",
             expect={"artefact": "cube", "model": "a", "adapter": "lora", "verify": {}})


def lock3_vectors() -> None:
    cube = fresh("lock3-vectors")
    cube.mkdir()
    for name in ("config.json", "textual_memory.json"):
        shutil.copyfile(OUT / "vectors" / "cube" / name, cube / name)
    cubepack.pack(cube, embedder=MODELS["e"])
    describe("lock3-vectors", what="A MemOS text memory holding vectors (the vectors "
             "fixture's files), its embedder's vectors record in lock version 3.",
             commit=COMMIT, how=f"cubepack.pack(cube, embedder=E) on vectors/cube's "
             f"config.json and textual_memory.json ({HERE}).",
             expect={"artefact": "cube", "embedder": "e", "verify": {}})


def lock3_lineage() -> None:
    out = fresh("lock3-lineage")
    cubepack.migrate(OUT / "attestation1" / "cube", out=out, model=MODELS["b"])
    cubepack.sign(out, SIGN)
    describe("lock3-lineage", what="attestation1 migrated to model B, then signed: lock "
             "version 3 with a lineage section, the parent's version-1 attestation in "
             "lineage/ancestors.intoto.json, its own of version 1.", commit=COMMIT,
             how=f"cubepack.migrate(attestation1/cube, out=..., model=B), then "
             f"cubepack.sign(out, keys/signing.pem) ({HERE}).",
             expect={"artefact": "cube", "model": "b", "signed": True,
                     "verify": {"recompute": True, "trusted_key": True},
                     "basis": "claimed", "load": True,
                     "refusals": [{"verify": {"trusted_key": True, "require_lineage": True},
                                   "parent": "attestation1",
                                   "command": "cubepack migrate PARENT --model MODEL "
                                              "--out DIR --sign-key KEY"}]})


# --- 6e1569d: lock version 4 with KV format 2, attestation predicate version 2 --------------------

def attestation2() -> None:
    packed_dump("attestation2", recompute=True, sign_key=SIGN)
    describe("attestation2", what="The MemOS dump packed and signed: lock version 4, KV format "
             "2 (no checksums), an attestation of predicate version 2 (its recomputed "
             "statements, made under the bound alone, are read as claims).", commit=COMMIT,
             how=f"cubepack.pack(cube, legacy_pickle=True, model=A, recompute=True, "
             f"sign_key=keys/signing.pem) on a copy of memos-pickle/cube ({HERE}).",
             expect={"artefact": "cube", "model": "a", "signed": True,
                     "verify": {"recompute": True, "trusted_key": True,
                                "require_signature": True, "require_lineage": True,
                                "strict_models": True},
                     "basis": "claimed", "load": True, "refusals": [PROVE_RECOMPUTED]})


def kv2() -> None:
    lone_kv("kv2")
    describe("kv2", what="A lone KV file of KV format 2 (no checksums: it loads, unchecked).",
             commit=COMMIT, how=f"cubepack.save_kv_cache(A's prefill of PROMPT, ..., "
             f"producer=A, token_ids=PROMPT) ({HERE}).",
             expect={"artefact": "kv", "model": "a", "load": True})


def mlx2() -> None:
    from cubepack.mlx import export_prompt_cache

    folder = fresh("mlx2", "mlx")
    folder.mkdir()
    export_prompt_cache(OUT / "kv2" / "kv" / "prompt.kv.safetensors",
                        folder / "prompt.safetensors", model=MODELS["a"])
    describe("mlx2", what="kv2's KV file exported as an MLX-LM prompt cache: its metadata "
             "carries a KV header of format 2 (no checksums).", commit=COMMIT,
             how=f"cubepack.mlx.export_prompt_cache(kv2/kv/prompt.kv.safetensors, ..., "
             f"model=A) ({HERE}).",
             expect={"artefact": "mlx", "model": "a", "source": "kv2"})


# --- b8d4585: encryption section version 1, manifest version 1 -----------------------------------

def private1(name: str, recipient: Path, **options) -> Path:
    cube = packed_dump(name, recompute=True)
    cubepack.encrypt(cube, [recipient.read_text().strip()], **options)
    return cube


def private1_age() -> None:
    private1("private1-age", KEYS / "age.pub", sign_key=SIGN)
    describe("private1-age", what="The MemOS dump packed, encrypted to an age X25519 "
             "recipient and signed: lock version 5, encryption section version 1, manifest "
             "version 1 (no series or generation).", commit=COMMIT,
             how=f"cubepack.pack(copy of memos-pickle/cube, legacy_pickle=True, model=A, "
             f"recompute=True), then cubepack.encrypt(cube, [keys/age.pub], "
             f"sign_key=keys/signing.pem) ({HERE}).",
             expect={"artefact": "cube", "model": "a", "signed": True, "identity": "age",
                     "verify": {"recompute": True, "trusted_key": True,
                                "require_signature": True},
                     "load": True})


def private1_ssh_hidden() -> None:
    private1("private1-ssh-hidden", KEYS / "ssh_ed25519.pub", hide_names=True)
    describe("private1-ssh-hidden", what="The MemOS dump packed, encrypted to an ssh-ed25519 "
             "recipient with hidden names, unsigned: lock version 5, encryption section "
             "version 1, manifest version 1.", commit=COMMIT,
             how=f"cubepack.pack(copy of memos-pickle/cube, legacy_pickle=True, model=A, "
             f"recompute=True), then cubepack.encrypt(cube, [keys/ssh_ed25519.pub], "
             f"hide_names=True) ({HERE}).",
             expect={"artefact": "cube", "model": "a", "identity": "ssh",
                     "verify": {"recompute": True}, "load": True})


# --- 7a731c8: encryption section version 2, manifest version 2 -----------------------------------

def private2(name: str, recipient: Path, **options) -> Path:
    cube = fresh(name)
    shutil.copytree(OUT / "lock4" / "cube", cube)
    cubepack.encrypt(cube, [recipient.read_text().strip()], **options)
    return cube


def private2_age() -> None:
    private2("private2-age", KEYS / "age.pub", sign_key=SIGN)
    describe("private2-age", what="lock4 encrypted to an age X25519 recipient and signed: "
             "lock version 5, encryption section version 2, manifest version 2.",
             commit=COMMIT, how=f"cubepack.encrypt(copy of lock4/cube, [keys/age.pub], "
             f"sign_key=keys/signing.pem) ({HERE}).",
             expect={"artefact": "cube", "model": "a", "signed": True, "identity": "age",
                     "verify": {"recompute": True, "trusted_key": True,
                                "require_signature": True},
                     "load": True})


def private2_ssh_hidden() -> None:
    private2("private2-ssh-hidden", KEYS / "ssh_ed25519.pub", hide_names=True)
    describe("private2-ssh-hidden", what="lock4 encrypted to an ssh-ed25519 recipient with "
             "hidden names, unsigned: lock version 5, encryption section version 2, manifest "
             "version 2.", commit=COMMIT,
             how=f"cubepack.encrypt(copy of lock4/cube, [keys/ssh_ed25519.pub], "
             f"hide_names=True) ({HERE}).",
             expect={"artefact": "cube", "model": "a", "identity": "ssh",
                     "verify": {"recompute": True}, "load": True})

# --- 0fcae49: attestation predicate version 3 (the last commit that wrote it) -------------

def attestation3() -> None:
    packed_dump("attestation3", recompute=True, sign_key=SIGN)
    describe("attestation3", what="The MemOS dump packed and signed: lock version 4, KV "
             "format 3, cubepack.sig and an attestation of predicate version 3.", commit=COMMIT,
             how="cubepack.pack(cube, legacy_pickle=True, model=A, recompute=True, "
             f"sign_key=keys/signing.pem) on a copy of memos-pickle/cube ({HERE}).",
             expect={"artefact": "cube", "model": "a", "signed": True,
                     "verify": {"recompute": True, "require_provenance": "recomputed",
                                "trusted_key": True, "require_signature": True,
                                "require_lineage": True, "strict_models": True},
                     "basis": "signed", "load": True})


# --- af31c2f: encryption section version 3, manifest version 2 -----------------------------------

def private3_age() -> None:
    private2("private3-age", KEYS / "age.pub", sign_key=SIGN)
    describe("private3-age", what="lock4 encrypted to an age X25519 recipient and signed: "
             "lock version 5, encryption section version 3 (counts by memory section), "
             "manifest version 2.", commit=COMMIT,
             how=f"cubepack.encrypt(copy of lock4/cube, [keys/age.pub], "
             f"sign_key=keys/signing.pem) ({HERE}).",
             expect={"artefact": "cube", "model": "a", "signed": True, "identity": "age",
                     "verify": {"recompute": True, "trusted_key": True,
                                "require_signature": True},
                     "load": True})


def private3_ssh_hidden() -> None:
    private2("private3-ssh-hidden", KEYS / "ssh_ed25519.pub", hide_names=True)
    describe("private3-ssh-hidden", what="lock4 encrypted to an ssh-ed25519 recipient with "
             "hidden names, unsigned: lock version 5, encryption section version 3, manifest "
             "version 2.", commit=COMMIT,
             how=f"cubepack.encrypt(copy of lock4/cube, [keys/ssh_ed25519.pub], "
             f"hide_names=True) ({HERE}).",
             expect={"artefact": "cube", "model": "a", "identity": "ssh",
                     "verify": {"recompute": True}, "load": True})


WRITERS = {"lock1": lock1, "kv1": kv1, "lock2": lock2, "attestation1": attestation1,
           "lock3-adapters": lock3_adapters, "lock3-vectors": lock3_vectors,
           "lock3-lineage": lock3_lineage, "attestation2": attestation2, "kv2": kv2, "mlx2": mlx2,
           "private1-age": private1_age, "private1-ssh-hidden": private1_ssh_hidden,
           "private2-age": private2_age, "private2-ssh-hidden": private2_ssh_hidden,
           "private3-age": private3_age, "private3-ssh-hidden": private3_ssh_hidden,
           "attestation3": attestation3}

if __name__ == "__main__":
    for fixture in sys.argv[2:]:
        WRITERS[fixture]()
