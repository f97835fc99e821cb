"""Build the compatibility fixtures in ``tests/fixtures/compat/`` (issue #39 item 7).

Each fixture is a folder: ``fixture.json`` (what it is, which cubepack commit wrote it and how,
and what today's code must do with it: verify, load, open, or refuse naming the command that
upgrades it), a one-line ``README.md`` saying the same for people, and the artefact itself
(``cube/``: a cube folder; ``kv/``: KV files). ``tests/format/test_compat_fixtures.py`` sweeps
the folder. Keys that sign and encrypt fixtures are test keys, committed in ``keys/``.

Usage (from the checkout's root)::

    .venv/latest/bin/python tools/make_compat_fixtures.py [NAME ...]   # what this code writes
    .venv/memos/bin/python tools/make_compat_fixtures.py memos-pickle  # MemoryOS's own dump
    .venv/memos/bin/python tools/make_compat_fixtures.py preferences   # its preference memory
    .venv/latest/bin/python tools/make_compat_fixtures.py --old [NAME ...]  # older commits'

A fixture that exists is kept: fixtures prove that what was written once is still read, so
one is never rewritten to make a test pass (``--replace`` rebuilds the named ones; say why in
the commit). The first form builds the fixtures the current code writes, in the latest
environment; ``memos-pickle``, a cube dumped by MemoryOS itself, is built by the memos
environment only. ``--old`` exports each older commit's tree (``git archive``) into a temporary
folder and runs the fixture's writer there (its function in ``tools/compat_old/writers.py``,
written against that commit's API) with that tree first on ``PYTHONPATH``; :data:`OLD` names
the commit and the environment.

Inputs are the same on every build: the tiny models of :mod:`cubepack.testing.tiny` (seeded:
their weights' and tokenizer's digests do not depend on the environment; ``models.json``
records them and the test checks its rebuild against it), the committed MemOS dump
(``memos-pickle/cube``) that every cube with activations is packed from, fixed token ids and
texts, and a fixed work folder (:data:`WORK`: paths written into fixtures, such as a pin's model
name, are the same on every machine). What is random stays random (age file keys, ECDSA
signatures, a private cube's series, the times in provenance records).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "compat_old"))
from _compat_common import (KEYS, MEMOS_DUMP, OUT, PROMPT, ROOT, WORK,  # noqa: E402
                     describe, env_name, fresh, model_folders)

#: The token ids of the bundle's two KV files.
BUNDLE = {"handbook": [1, 17, 42, 7, 99, 5], "faq": [3, 4, 5, 6, 200]}
#: The MemOS dump's activation texts (extracted by MemoryOS through the model's chat template).
TEXTS = ["The user is a Chinese man.", "He likes green tea."]
#: The text memories of the vectors fixture, embedded by the tiny encoder ``encoder-e``.
MEMORIES = ["The user loves the Eiffel Tower.", "The user drinks green tea every morning.",
            "The user's sister lives in Lyon."]
#: The preferences of the preferences fixture (collection, context summary).
PREFERENCES = [("explicit_preference", "The user likes green tea in the morning."),
               ("explicit_preference", "The user wants every answer in French."),
               ("implicit_preference", "The user seems to prefer short answers.")]
#: The fixtures only MemoryOS can write (built in the memos environment).
MEMOS_ONLY = ("memos-pickle", "preferences")

#: The fixtures older commits wrote: name -> (commit, environment). Each commit is the last
#: that wrote a format version (or predicate, or encryption section) later bumped; each
#: fixture's writer is its function in tools/compat_old/writers.py.
P2 = "dea5e114b9921cf13a9fbaf25fad89f69693fc07"  # encryption 2, manifest 2
P3 = "af31c2f56af3c28a87d0fa786ef8407398beab40"  # encryption 3, manifest 2
A3 = "dea5e114b9921cf13a9fbaf25fad89f69693fc07"  # attestation 3
L1, L2, L3, L4, P1 = ("4b7ba82872218ded5021b961b87dbd3e3ab15868",  # lock 1, KV 1
                      "e3b7d8cd7ac26d02ea2cdd1a4cfd9bac593ea012",  # lock 2 (KV 2)
                      "9b0a97cc2dd04aaff71f3440c45e3f6a14bea6bd",  # lock 3, attestation 1
                      "6e1569d1f633fcbbefb14141f1be957bc918681c",  # KV 2, attestation 2
                      "b8d45850856f471408980a323e99d905c297eac4")  # encryption 1, manifest 1
OLD = {"lock1": (L1, "latest"), "kv1": (L1, "latest"),
       "lock2": (L2, "latest"),
       "attestation1": (L3, "latest"), "lock3-adapters": (L3, "latest"),
       "lock3-vectors": (L3, "latest"), "lock3-lineage": (L3, "latest"),
       "attestation2": (L4, "latest"), "kv2": (L4, "latest"), "mlx2": (L4, "latest"),
       "private1-age": (P1, "latest"), "private1-ssh-hidden": (P1, "latest"),
       "private2-age": (P2, "latest"), "private2-ssh-hidden": (P2, "latest"),
       "private3-age": (P3, "latest"), "private3-ssh-hidden": (P3, "latest"),
       "attestation3": (A3, "latest")}


# --- inputs ----------------------------------------------------------------------------------

def models() -> dict[str, Path]:
    """The tiny models fixtures pin, saved by this environment's transformers (a folder saved
    by transformers 5 has a tokenizer config 4.57 cannot read; the weights are the same)."""
    from cubepack.testing import embeddings, tiny

    folders = model_folders()
    if not all(folder.is_dir() for folder in folders.values()):
        shutil.rmtree(folders["a"].parent, ignore_errors=True)
        tokenizer = tiny.build_tokenizer()
        tiny.build_model(folders["a"], tiny.llama_config(), seed=0, tokenizer=tokenizer)
        tiny.build_model(folders["b"], tiny.llama_config(), seed=1, tokenizer=tokenizer)
        embeddings.build_encoder(folders["e"], seed=0)
    return folders


def record_models(m: dict[str, Path]) -> None:
    """``models.json``: the digests of the tiny models the fixtures pin, which the test
    compares with its own rebuild before anything else (tiny may never change them)."""
    import cubepack

    pins = {}
    for name, folder in sorted(m.items()):
        identity = cubepack.fingerprint(str(folder))
        pins[name] = {"weights_digest": identity.weights_digest,
                      "tokenizer_digest": identity.tokenizer_digest}
    path = OUT / "models.json"
    if path.is_file() and json.loads(path.read_text()) != pins:
        sys.exit(f"cubepack.testing.tiny no longer builds the models {path} records: the "
                 "fixtures older commits wrote pin those; restore tiny instead.")
    path.write_text(json.dumps(pins, indent=2, sort_keys=True) + "\n")


def keys() -> dict[str, Path]:
    """The test keys (made once, then kept: fixtures written by older commits use them too):
    an ECDSA P-256 signing key, an age X25519 identity and an OpenSSH ed25519 key."""
    paths = {"sign": KEYS / "signing.pem", "sign_pub": KEYS / "signing.pub.pem",
             "age": KEYS / "age.key", "age_pub": KEYS / "age.pub",
             "ssh": KEYS / "ssh_ed25519", "ssh_pub": KEYS / "ssh_ed25519.pub"}
    KEYS.mkdir(parents=True, exist_ok=True)
    if not paths["sign"].exists():
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        key = ec.generate_private_key(ec.SECP256R1())
        paths["sign"].write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        paths["sign_pub"].write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    if not paths["age"].exists():
        subprocess.run(["age-keygen", "-o", str(paths["age"])], check=True,
                       capture_output=True)
        public = subprocess.run(["age-keygen", "-y", str(paths["age"])], check=True,
                                capture_output=True, text=True).stdout
        paths["age_pub"].write_text(public)
    if not paths["ssh"].exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "compat@fixtures",
                        "-f", str(paths["ssh"])], check=True)
    for name in ("sign", "age", "ssh"):  # git keeps no mode; the test sets 0600 too
        os.chmod(paths[name], 0o600)
    return paths


@functools.cache
def head() -> str:
    """The commit whose cubepack code writes the current fixtures: the last one that changed
    ``cubepack/`` (refused when the package has uncommitted changes: no commit wrote them)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                              text=True).stdout.strip()

    if git("status", "--porcelain", "--", "cubepack", "templates"):
        sys.exit("cubepack/ has uncommitted changes: commit them first (a fixture names the "
                 "commit that wrote it).")
    return git("log", "-1", "--format=%H", "--", "cubepack", "templates")


# --- fixtures the current code writes ---------------------------------------------------------

def build_memos_pickle(m: dict[str, Path], k: dict[str, Path]) -> None:
    """A cube MemoryOS dumped itself (GeneralMemCube.dump: config.json and the activation
    pickle of transformers 4.57's DynamicCache); no cubepack code writes any of it."""
    from memos.configs.mem_cube import GeneralMemCubeConfig
    from memos.mem_cube.general import GeneralMemCube

    import memos

    cube_dir = fresh("memos-pickle")
    llm = {"backend": "huggingface", "config": {"model_name_or_path": str(m["a"]),
                                                 "max_tokens": 8}}
    config = GeneralMemCubeConfig.model_validate({
        "user_id": "u1", "cube_id": "u1/compat_cube", "text_mem": {"backend": "uninitialized"},
        "act_mem": {"backend": "kv_cache", "config": {"extractor_llm": llm}}})
    cube = GeneralMemCube(config)
    cube.act_mem.add([cube.act_mem.extract(text) for text in TEXTS])
    cube.dump(str(cube_dir))
    version = getattr(memos, "__version__", "?")
    describe("memos-pickle", what="A MemOS cube as MemoryOS dumps it: config.json and "
             "activation_memory.pickle (two KV caches of tiny model A, extracted by MemOS).",
             commit=head(), how=f"MemoryOS {version}'s GeneralMemCube.dump (memos environment, "
             "tools/make_compat_fixtures.py memos-pickle); cubepack wrote nothing.",
             expect={"artefact": "memos-dump", "model": "a",
                     "pack": {"legacy_pickle": True, "recompute": True},
                     "verify": {"recompute": True, "require_provenance": "recomputed"}})


def _pack_dump(name: str, m: dict[str, Path], **options) -> Path:
    import cubepack

    cube = fresh(name)
    shutil.copytree(MEMOS_DUMP, cube)
    cubepack.pack(cube, legacy_pickle=True, model=str(m["a"]), **options)
    return cube


def build_lock4(m: dict[str, Path], k: dict[str, Path]) -> None:
    _pack_dump("lock4", m, recompute=True)
    describe("lock4", what="The MemOS dump packed: lock version 4, KV format 3, unsigned.",
             commit=head(), how="cubepack.pack(cube, legacy_pickle=True, model=A, "
             "recompute=True) on a copy of memos-pickle/cube.",
             expect={"artefact": "cube", "model": "a",
                     "verify": {"recompute": True, "require_provenance": "recomputed"},
                     "load": True})


def build_signed_compacted(m: dict[str, Path], k: dict[str, Path]) -> None:
    """The plain bundle packed in one shard, a memory removed, signed, then compacted: its
    attestation (predicate version 4) signs the memories, not the compacted layout."""
    import cubepack

    cube = fresh("attestation4")
    shutil.copytree(OUT / "bundle" / "cube", cube)
    for name in ("cubepack.lock", "cubepack.yaml", "README.md"):
        (cube / name).unlink()
    options = {"cube_id": "compat/signed", "model": str(m["a"]), "recompute": True}
    cubepack.pack(cube, shards=True, **options)
    cubepack.pack(cube, remove=("faq",), **options)
    cubepack.sign(cube, str(k["sign"]), model=str(m["a"]), recompute=True)
    cubepack.compact(cube)
    how = ("a copy of bundle/cube without its lock, cubepack.yaml and card, cubepack.pack(cube, "
           "cube_id='compat/signed', model=A, recompute=True, shards=True), the same with "
           "remove=('faq',), cubepack.sign(cube, keys/signing.pem, model=A, recompute=True), "
           "then cubepack.compact(cube).")
    describe("attestation4", what="A sharded cube signed (an attestation of predicate version "
             "4), then compacted: lock version 6, no cubepack.sig (it named the old shard), the "
             "attestation signing its memories, pins and other files by digest.",
             commit=head(), how=how,
             expect={"artefact": "cube", "model": "a", "signed": True,
                     "verify": {"recompute": True, "require_provenance": "recomputed",
                                "trusted_key": True, "require_signature": True,
                                "require_lineage": True, "strict_models": True},
                     "basis": "signed", "load": True})


def build_bundle(m: dict[str, Path], k: dict[str, Path]) -> None:
    """A plain bundle: KV files saved with save_kv_cache and their sources, no MemOS."""
    import torch

    import cubepack
    from cubepack.testing import tiny

    cube = fresh("bundle")
    model = tiny.load(m["a"])
    (cube / "activations").mkdir(parents=True)
    (cube / "sources").mkdir()
    for name, ids in BUNDLE.items():
        cache = cubepack.prefill(model, torch.tensor([ids]))
        cubepack.save_kv_cache(cache, cube / "activations" / f"{name}.kv.safetensors",
                               producer=model, token_ids=ids,
                               metadata={"source": f"sources/{name}.txt"})
        (cube / "sources" / f"{name}.txt").write_text(f"the {name} text\n")
    (cube / "prompts.jsonl").write_text("".join(
        json.dumps({"id": name, "prompt": f"the {name} text"}) + "\n" for name in BUNDLE))
    cubepack.pack(cube, cube_id="compat/bundle", model=str(m["a"]), recompute=True)
    describe("bundle", what="A plain bundle (KV files saved with save_kv_cache, their sources, "
             "no MemOS config.json): lock version 4, KV format 3.",
             commit=head(), how="cubepack.save_kv_cache of model A's prefills, then "
             "cubepack.pack(cube, cube_id='compat/bundle', model=A, recompute=True).",
             expect={"artefact": "cube", "model": "a",
                     "verify": {"recompute": True, "require_provenance": "recomputed"},
                     "load": True})


def build_lock6_shards(m: dict[str, Path], k: dict[str, Path]) -> None:
    """The plain bundle's KV files and sources, packed sharded (lock version 6)."""
    import cubepack

    cube = fresh("lock6-shards")
    shutil.copytree(OUT / "bundle" / "cube", cube)
    for name in ("cubepack.lock", "cubepack.yaml", "README.md"):
        (cube / name).unlink()
    cubepack.pack(cube, cube_id="compat/shards", model=str(m["a"]), recompute=True,
                  shard_size=1024)
    describe("lock6-shards", what="The plain bundle packed sharded: lock version 6, index "
             "version 1, each memory larger than the 1 KiB bound in a shard of its own.",
             commit=head(), how="a copy of bundle/cube without its lock, cubepack.yaml and "
             "card, then cubepack.pack(cube, cube_id='compat/shards', model=A, recompute=True, "
             "shard_size=1024).",
             expect={"artefact": "cube", "model": "a",
                     "verify": {"recompute": True, "require_provenance": "recomputed"},
                     "load": True})


def build_lock7_appended(m: dict[str, Path], k: dict[str, Path]) -> None:
    """The plain bundle packed in one shard, then one memory removed by an incremental pack:
    lock version 7 (each shard's dead bytes), index version 2 (its dead range)."""
    import cubepack

    cube = fresh("lock7-appended")
    shutil.copytree(OUT / "bundle" / "cube", cube)
    for name in ("cubepack.lock", "cubepack.yaml", "README.md"):
        (cube / name).unlink()
    cubepack.pack(cube, cube_id="compat/appended", model=str(m["a"]), recompute=True,
                  shards=True)
    cubepack.pack(cube, cube_id="compat/appended", model=str(m["a"]), recompute=True,
                  remove=("faq",))
    describe("lock7-appended", what="The plain bundle packed in one shard, then its memory "
             "'faq' removed by an incremental pack: lock version 7 (the shard's dead bytes), "
             "index version 2 (its dead range), one live memory.",
             commit=head(), how="a copy of bundle/cube without its lock, cubepack.yaml and "
             "card, cubepack.pack(cube, cube_id='compat/appended', model=A, recompute=True, "
             "shards=True), then cubepack.pack(cube, cube_id='compat/appended', model=A, "
             "recompute=True, remove=('faq',)).",
             expect={"artefact": "cube", "model": "a",
                     "verify": {"recompute": True, "require_provenance": "recomputed"},
                     "load": True})


def build_kv3(m: dict[str, Path], k: dict[str, Path]) -> None:
    import torch

    import cubepack
    from cubepack.testing import tiny

    folder = fresh("kv3", "kv")
    folder.mkdir()
    model = tiny.load(m["a"])
    ids = torch.tensor([PROMPT])
    cubepack.save_kv_cache(cubepack.prefill(model, ids), folder / "prompt.kv.safetensors",
                           producer=model, token_ids=ids, metadata={"note": "compat fixture"})
    describe("kv3", what="A lone KV file of KV format 3 (per-tensor checksums).",
             commit=head(), how="cubepack.save_kv_cache(cubepack.prefill(A, PROMPT), ..., "
             "producer=A, token_ids=PROMPT).",
             expect={"artefact": "kv", "model": "a", "load": True})


def build_mlx3(m: dict[str, Path], k: dict[str, Path]) -> None:
    """kv3's KV file as an MLX-LM prompt cache (written without MLX: its layout is cubepack's
    to write)."""
    from cubepack.mlx import export_prompt_cache

    folder = fresh("mlx3", "mlx")
    folder.mkdir()
    export_prompt_cache(OUT / "kv3" / "kv" / "prompt.kv.safetensors",
                        folder / "prompt.safetensors", model=str(m["a"]))
    describe("mlx3", what="kv3's KV file exported as an MLX-LM prompt cache: its metadata "
             "carries the KV header (format 3).", commit=head(),
             how="cubepack.mlx.export_prompt_cache(kv3/kv/prompt.kv.safetensors, ..., "
             "model=A).",
             expect={"artefact": "mlx", "model": "a", "source": "kv3"})


def build_adapters(m: dict[str, Path], k: dict[str, Path]) -> None:
    """A cube holding a LoRA adapter made by peft for model A (random B: it changes logits)."""
    import torch
    from peft import LoraConfig, get_peft_model

    import cubepack
    from cubepack.testing import tiny

    cube = fresh("adapters")
    torch.manual_seed(7)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                        init_lora_weights=False)
    get_peft_model(tiny.load(m["a"]), config).save_pretrained(str(cube / "parametric" / "lora"))
    cubepack.pack(cube, cube_id="compat/adapter", adapter_base=str(m["a"]))
    describe("adapters", what="A cube holding a LoRA adapter (parametric/lora/, made by peft "
             "for model A): lock version 4 with its adapters section.",
             commit=head(), how="peft's save_pretrained into parametric/lora, then "
             "cubepack.pack(cube, cube_id='compat/adapter', adapter_base=A).",
             expect={"artefact": "cube", "model": "a", "adapter": "lora",
                     "verify": {}})


def build_vectors(m: dict[str, Path], k: dict[str, Path]) -> None:
    """A MemOS general-text memory whose vectors the tiny encoder made, its embedder pinned."""
    import uuid

    import cubepack
    from cubepack.kinds.vectors._embedder import embed_locally

    cube = fresh("vectors")
    cube.mkdir(parents=True)
    vectors = embed_locally(m["e"], MEMORIES)
    memories = [{"id": str(uuid.UUID(int=i + 1)), "vector": vector, "payload": {"memory": text}}
                for i, (text, vector) in enumerate(zip(MEMORIES, vectors))]
    (cube / "textual_memory.json").write_text(json.dumps(memories))
    config = json.loads((MEMOS_DUMP / "config.json").read_text())
    config["act_mem"] = {"backend": "uninitialized", "config": {"cube_id": None}}
    config["text_mem"] = {"backend": "general_text", "config": {
        "memory_filename": "textual_memory.json",
        "embedder": {"backend": "universal_api", "config": {"model_name_or_path": "tiny"}}}}
    (cube / "config.json").write_text(json.dumps(config, indent=2))
    cubepack.pack(cube, embedder=str(m["e"]))
    describe("vectors", what="A MemOS text memory holding vectors (textual_memory.json, 32 "
             "dimensions, by the tiny encoder E), its embedder's record and probes in lock "
             "version 4.", commit=head(),
             how="cubepack.kinds.vectors._embedder.embed_locally(E, texts) into "
                 "textual_memory.json, then cubepack.pack(cube, embedder=E).",
             expect={"artefact": "cube", "embedder": "e", "verify": {}})


def build_preferences(m: dict[str, Path], k: dict[str, Path]) -> None:
    """A MemOS preference memory dumped by MemoryOS itself at its own preference configuration
    (Milvus Lite, MemOS's universal_api embedder on a loopback server running the tiny encoder
    E, preferences added through MemOS's adder), packed with E: lock version 6."""
    import tempfile
    import uuid
    from datetime import datetime

    import cubepack
    from cubepack.testing.embeddings import EmbeddingServer
    from memos.configs.mem_cube import GeneralMemCubeConfig
    from memos.mem_cube.general import GeneralMemCube
    from memos.memories.textual.item import PreferenceTextualMemoryMetadata, TextualMemoryItem
    from memos.memories.textual.prefer_text_memory import spliter

    import memos

    defaults = list(spliter.Splitter.__init__.__defaults__)
    defaults[4] = "character"  # its chunker's gpt2 tokenizer is fetched from the Hub
    spliter.Splitter.__init__.__defaults__ = tuple(defaults)
    cube_dir = fresh("preferences")
    with EmbeddingServer(m["e"]) as server, tempfile.TemporaryDirectory() as store:
        config = GeneralMemCubeConfig.model_validate({
            "user_id": "u1", "cube_id": "u1/compat_preferences",
            "pref_mem": {"backend": "pref_text", "config": {
                "extractor_llm": {"backend": "openai", "config": {
                    "model_name_or_path": "unused", "api_key": "x",
                    "api_base": "http://127.0.0.1:9/v1"}},
                "vector_db": {"backend": "milvus", "config": {
                    "collection_name": ["explicit_preference", "implicit_preference"],
                    "vector_dimension": 32, "distance_metric": "cosine",
                    "uri": str(Path(store) / "milvus.db")}},
                "embedder": {"backend": "universal_api", "config": {
                    "provider": "openai", "api_key": "x", "base_url": server.url,
                    "model_name_or_path": server.model_name}},
                "extractor": {"backend": "naive", "config": {}},
                "adder": {"backend": "naive", "config": {}},
                "retriever": {"backend": "naive", "config": {}}}}})
        cube = GeneralMemCube(config)
        items = []
        for kind, summary in PREFERENCES:
            metadata = PreferenceTextualMemoryMetadata(
                type="chat", preference_type=kind, dialog_id=str(uuid.uuid4()),
                original_text=f"user: {summary}", preference=summary,
                embedding=cube.pref_mem.embedder.embed([summary])[0],
                created_at=datetime.now().isoformat(), user_id="u1", session_id="s",
                mem_cube_id="u1/compat_preferences")
            items.append(TextualMemoryItem(id=str(uuid.uuid4()), memory=summary,
                                           metadata=metadata))
        cube.pref_mem.add(items)
        cube.dump(str(cube_dir))
        # The loopback server's URL means nothing later: name the embedder as the vectors
        # fixture does (a verifier passes E itself).
        written = json.loads((cube_dir / "config.json").read_text())
        written["pref_mem"]["config"]["embedder"]["config"]["base_url"] = "http://127.0.0.1:9/v1"
        (cube_dir / "config.json").write_text(json.dumps(written, indent=4))
    cubepack.pack(cube_dir, embedder=str(m["e"]))
    version = getattr(memos, "__version__", "?")
    describe("preferences", what="A MemOS preference memory (textual_memory.json, MemOS's "
             "default name: explicit and implicit preferences, 32-dimensional vectors by the "
             "tiny encoder E) and its preferences section with probes, in lock version 6.",
             commit=head(), how=f"MemoryOS {version}'s GeneralMemCube.dump of a pref_text "
             "memory on Milvus Lite (memos environment, tools/make_compat_fixtures.py "
             "preferences), then cubepack.pack(cube, embedder=E).",
             expect={"artefact": "cube", "embedder": "e", "verify": {}})


def build_lineage(m: dict[str, Path], k: dict[str, Path]) -> None:
    """attestation3 migrated to model B, signed: a lineage section, the parent's attestation
    in lineage/ancestors.intoto.json, an attestation whose signer derived the lineage."""
    import cubepack

    out = fresh("lineage")
    out.parent.mkdir(exist_ok=True)
    cubepack.migrate(OUT / "attestation3" / "cube", out=out, model=str(m["b"]),
                     sign_key=str(k["sign"]), trusted_keys=[str(k["sign_pub"])])
    describe("lineage", what="attestation3 migrated to model B and signed: lock version 4 "
             "with a lineage section, the parent's attestation in "
             "lineage/ancestors.intoto.json.", commit=head(),
             how="cubepack.migrate(attestation3/cube, out=..., model=B, "
             "sign_key=keys/signing.pem, trusted_keys=[keys/signing.pub.pem]).",
             expect={"artefact": "cube", "model": "b", "signed": True,
                     "verify": {"recompute": True, "require_provenance": "recomputed",
                                "trusted_key": True, "require_lineage": True},
                     "basis": "signed", "load": True})


def build_private3_shards(m: dict[str, Path], k: dict[str, Path]) -> None:
    """lock6-shards encrypted and signed: a private cube of shards (manifest version 3)."""
    import cubepack

    cube = fresh("private3-shards-age")
    shutil.copytree(OUT / "lock6-shards" / "cube", cube)
    cubepack.encrypt(cube, [k["age_pub"].read_text().strip()], sign_key=str(k["sign"]))
    describe("private3-shards-age", what="lock6-shards encrypted to an age X25519 recipient "
             "and signed: lock version 5, encryption section version 3, manifest version 3 "
             "(each ciphertext's header recorded), its shards and indexes ciphertexts.",
             commit=head(), how="cubepack.encrypt(copy of lock6-shards/cube, [keys/age.pub], "
             "sign_key=keys/signing.pem).",
             expect={"artefact": "cube", "model": "a", "signed": True, "identity": "age",
                     "verify": {"recompute": True, "trusted_key": True,
                                "require_signature": True},
                     "load": True})


#: name -> builder, in the order they depend on each other.
CURRENT = {
    "memos-pickle": build_memos_pickle, "lock4": build_lock4, "bundle": build_bundle,
    "attestation4": build_signed_compacted, "kv3": build_kv3, "mlx3": build_mlx3,
    "adapters": build_adapters, "vectors": build_vectors, "lineage": build_lineage,
    "lock6-shards": build_lock6_shards, "lock7-appended": build_lock7_appended,
    "private3-shards-age": build_private3_shards,
    "preferences": build_preferences,
}


# --- fixtures older commits wrote ------------------------------------------------------------

def build_old(names: list[str], pythons: dict[str, str]) -> None:
    """Run each older commit's writer once, with that commit's tree first on PYTHONPATH, in
    the environment :data:`OLD` names (``pythons[env]``, else ``.venv/<env>/bin/python``)."""
    writers: dict[tuple[str, str], list[str]] = {}
    for name in names:
        writers.setdefault(OLD[name], []).append(name)
    for (commit, env), wanted in writers.items():
        python = pythons.get(env, str(ROOT / ".venv" / env / "bin" / "python"))
        subprocess.run([python, __file__, "--models"], check=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
        with tempfile.TemporaryDirectory(prefix="cubepack-old-") as tree:
            archive = subprocess.run(["git", "archive", commit], cwd=ROOT, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
            print(f"{commit[:10]} ({env}): {', '.join(wanted)}", flush=True)
            subprocess.run([python, str(ROOT / "tools" / "compat_old" / "writers.py"), commit,
                            *wanted], check=True, cwd=tree, env=dict(os.environ, PYTHONPATH=tree))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="fixtures to rebuild (default: all)")
    parser.add_argument("--old", action="store_true",
                        help="rebuild fixtures older commits wrote (tools/compat_old/)")
    parser.add_argument("--python", action="append", default=[], metavar="ENV=PYTHON",
                        help="with --old: the interpreter of environment ENV (latest, memos)")
    parser.add_argument("--replace", action="store_true",
                        help="rebuild the named fixtures even though they exist")
    parser.add_argument("--models", action="store_true",
                        help="only build the tiny models, in this environment")
    args = parser.parse_args(argv)
    if args.models:
        print(models()["a"].parent)
        return 0
    if args.replace and not args.names:
        parser.error("--replace rebuilds the fixtures named, and only those")
    unknown = sorted(set(args.names) - set(OLD if args.old else CURRENT))
    if unknown:
        parser.error(f"no such fixture{' of an older commit' if args.old else ''}: "
                     f"{', '.join(unknown)}")
    for name in args.names or (OLD if args.old else CURRENT):
        if (OUT / name).exists() and not args.replace:
            print(f"{name}: kept (it exists; --replace {name} rebuilds it)", file=sys.stderr)
    names = [name for name in args.names or (OLD if args.old else CURRENT)
             if args.replace or not (OUT / name).exists()]
    if args.old:
        build_old(names, dict(item.split("=", 1) for item in args.python))
        return 0
    if names:
        head()  # refuses a changed cubepack/ before any fixture is touched
    k, m = keys(), models()
    record_models(m)
    memos_env = env_name() == "memos"
    for name, build in CURRENT.items():
        if name not in names:
            continue
        if (name in MEMOS_ONLY) != memos_env:
            if args.names:
                print(f"{name}: built in the {'memos' if name in MEMOS_ONLY else 'latest'}"
                      " environment only", file=sys.stderr)
            continue
        print(name, flush=True)
        build(m, k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
