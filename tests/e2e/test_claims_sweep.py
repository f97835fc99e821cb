"""Sweep the claims: every field verify reads from a cube, attacked as its author could.

Everything in a cube (the lock, cubepack.yaml, each KV header, config.json) was written by
whoever pushed last. For every leaf field of each of these documents, the test removes it,
changes its type, changes its value and (for paths) points it elsewhere, then re-seals what the
attacker can re-seal (the KV file's sha256 in the lock, the lock's digests) and verifies with
the strongest policy this process can prove (the producer loaded, every position recomputed,
the embedder re-embedding the memories). Each outcome must be a refusal, or an unchanged
verdict for a field the report shows as a claim (``INFORMATIONAL``, listed with why). Run with
``-s`` to print the table; like the config-key sweep, it finds the case nobody listed.
"""

from __future__ import annotations

import copy
import json
import shutil
import struct
import uuid

import pytest
import torch

import cubepack
from cubepack._util import constants, hashing
from cubepack.kv._torch import cache_layers, write_kv_layers
from cubepack.testing.embeddings import build_encoder

from data import PROMPT
from envs import once
from helpers import build_cache

pytestmark = once

ITEM = "activations/item-1.kv.safetensors"
TEXTS = ["The user lives in Lyon.", "The user plays the cello.", "The user hates rain."]

#: Fields whose change leaves the verdict unchanged, with why that is safe: each is shown in the
#: report or lock as a claim and decides nothing. A field absent here that survives a mutation
#: fails the test.
INFORMATIONAL = {
    "lock.lock_version": "a later lock version that reads the same sections (5 adds only the "
                         "optional encryption section): read as written, covered by the digest",
    "lock.cubepack_version": "the packing tool's version: shown, never relied on",
    "lock.cube_id": "MemOS's cube id, shown; MemOS reads its own from config.json",
    "lock.models.*.name": "the name the packer gave; the identity decides",
    "lock.models.*.repo_id": "where to find the pinned model; the identity decides (without "
                             "it the model check needs --model, and strict_models refuses)",
    "lock.models.*.revision": "as repo_id: where to find the model, not what it is",
    "lock.models.*.reason": "why an informational pin is unpinned: shown only",
    "lock.models.*.identity.model_id": "informational identity field (a name, not an identity)",
    "lock.models.*.identity.revision": "informational identity field; repo revision is pinned "
                                       "by models.*.revision",
    "lock.models.*.identity.prompt_format_digest": "a warning field: a chat template change is "
                                                   "logged, the cache stays valid",
    "lock.models.text_mem.embedder.*": "the embedder's pin is informational; its vectors record "
                                       "is checked against the memories themselves",
    "lock.models.*.vectors.sample": "the packer's sample: the verifier draws its own",
    "lock.activations.*.provenance.*": "the producer label: shown as claimed, and recomputation "
                                       "proves the cache whatever it says",
    "yaml.*": "cubepack.yaml repeats the lock for humans; the lock is what verify reads (a "
              "difference is refused, an absent key is not a claim of anything)",
    "kv.metadata.*": "free item metadata (source text, ids): shown, never relied on",
    "kv.producer.model_id": "informational identity field",
    "kv.producer.revision": "informational identity field",
    "kv.producer.config_digest": "informational identity field",
    "kv.producer.versions.*": "library versions: informational",
    "kv.producer.prompt_format_digest": "a warning field (chat template): logged",
    "config.*": "MemOS's own settings: verify reads only which file holds the text memory and "
                "which file MemOS would unpickle; the rest is MemOS's business",
}


def _matches(field: str, pattern: str) -> bool:
    parts, wanted = field.split("."), pattern.split(".")
    if wanted[-1] == "*":
        return parts[:len(wanted) - 1] == wanted[:-1] or all(
            w in ("*", p) for w, p in zip(wanted[:-1], parts)) and len(parts) >= len(wanted) - 1
    return len(parts) == len(wanted) and all(w in ("*", p) for w, p in zip(wanted, parts))


def informational(field: str) -> bool:
    return any(_matches(field, pattern) for pattern in INFORMATIONAL)


class Dotted(str):
    """A leaf's dotted path as shown, keeping its parts: a key may hold dots itself (a KV
    header's checksum of ``layers.0.keys``)."""

    parts: tuple[str, ...]


def leaves(value, parts=()):
    """(dotted path, value) of every leaf; list items by index."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from leaves(item, (*parts, str(key)))
    elif isinstance(value, list) and value and not all(isinstance(x, (int, float)) for x in value):
        for index, item in enumerate(value):
            yield from leaves(item, (*parts, str(index)))
    else:
        path = Dotted(".".join(parts))
        path.parts = parts
        yield path, value


def mutations(value):
    """(name, new value or REMOVE) an attacker would try on one field."""
    yield "remove", REMOVE
    if isinstance(value, bool):
        yield "flip", not value
        yield "type", "true"
    elif isinstance(value, int):
        yield "value", value + 1
        yield "type", str(value)
        yield "float", float(value) + 0.5
    elif isinstance(value, float):
        yield "value", value * 2 + 1
        yield "type", str(value)
    elif isinstance(value, str):
        yield "value", value + "x" if value else "x"
        yield "type", 7
        if "/" in value or value.endswith((".json", ".safetensors", ".md")):
            yield "elsewhere", "../outside/" + value.rsplit("/", 1)[-1]
            yield "absolute", "/etc/passwd"
            yield "decoy", "README.md"
    elif value is None:
        yield "value", "x"
    elif isinstance(value, list):
        yield "value", value[:-1] if value else [1]
        yield "type", {"0": value}
    elif isinstance(value, dict):
        yield "value", {"x": 1}


REMOVE = object()


def set_path(document, path: str, new) -> bool:
    """Apply one mutation at ``path``; False when the path does not exist any more."""
    parts = getattr(path, "parts", None) or path.split(".")
    node = document
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.get(part)
        if node is None:
            return False
    last = parts[-1]
    if isinstance(node, list):
        index = int(last)
        if new is REMOVE:
            del node[index]
        else:
            node[index] = new
    elif new is REMOVE:
        node.pop(last, None)
    else:
        node[last] = new
    return True


@pytest.fixture(scope="module")
def proof(tmp_path_factory, zoo, models):
    """A packed cube with one activation (token ids stored) and a text memory with vectors, and
    the policy that proves it: the producer, every position, the embedder."""
    from memos_format import memos_config

    root = tmp_path_factory.mktemp("sweep")
    encoder = build_encoder(root / "encoder", seed=0)
    cube = root / "cube"
    ids = torch.tensor([PROMPT])
    write_kv_layers(cache_layers(build_cache(models["a"], ids)), cube / ITEM,
                    producer=cubepack.fingerprint(models["a"]), token_ids=ids,
                    metadata={"id": "item-1", "source_text": "The user likes tea."})
    from cubepack.kinds.vectors._embedder import embed

    vectors = embed(str(encoder), TEXTS)
    (cube / "textual_memory.json").write_text(json.dumps([
        {"id": str(uuid.UUID(int=i + 1)), "vector": vector, "payload": {"memory": text}}
        for i, (text, vector) in enumerate(zip(TEXTS, vectors))]))
    config = memos_config(str(zoo["a"]))
    config["text_mem"] = {"backend": "general_text", "config": {
        "memory_filename": "textual_memory.json",
        "embedder": {"backend": "universal_api", "config": {"model_name_or_path": "tiny"}}}}
    (cube / "config.json").write_text(json.dumps(config))
    cubepack.pack(cube, model=models["a"])
    policy = cubepack.TrustPolicy(model=models["a"], recompute=True, embedder=str(encoder),
                                  require_provenance="recorded", seed=11)
    assert cubepack.verify(cube, policy).ok
    return cube, policy


def reseal(cube, lock):
    """Recompute the lock's digests over whatever it now holds, as an attacker can."""
    from cubepack._util import canonical
    from cubepack.format._lock import content_digest

    body = {key: value for key, value in lock.items() if key not in ("digest", "content_digest")}
    try:
        body["content_digest"] = content_digest(body)
    except (KeyError, AttributeError, TypeError):
        body["content_digest"] = lock.get("content_digest")
    body["digest"] = canonical.digest(body)
    (cube / constants.LOCK_FILENAME).write_text(canonical.dumps(body))


def relist(cube, lock, name):
    """The lock's entry for ``name`` (and an activation's) updated to the file's new bytes."""
    digest, size = hashing.sha256_file(cube / name), (cube / name).stat().st_size
    lock["files"][name] = {"sha256": digest, "size": size}
    for entry in lock["activations"].values():
        if entry.get("file") == name:
            entry["sha256"] = digest


def kv_document(path):
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    return raw, length, header, json.loads(header["__metadata__"]["cubepack"])


def write_kv_document(path, raw, length, header, meta):
    header["__metadata__"]["cubepack"] = json.dumps(meta)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length:])


def outcome(cube, policy):
    try:
        report = cubepack.verify(cube, policy, raise_on_failure=False)
    except cubepack.CubepackError as exc:  # a usage-level refusal (e.g. an unsafe path)
        return "refused", type(exc).__name__
    if report.ok:
        return "accepted", ""
    return "refused", ", ".join(sorted({c.name for c in report.failures}))


def sweep(proof, tmp_path, kind):
    cube, policy = proof
    lock = json.loads((cube / constants.LOCK_FILENAME).read_text())
    if kind == "lock":
        fields = [(f, v) for f, v in leaves(lock) if f not in ("digest", "content_digest")]
    elif kind == "yaml":
        import yaml

        fields = list(leaves(yaml.safe_load((cube / constants.CONFIG_FILENAME).read_text())))
    elif kind == "kv":
        fields = list(leaves(kv_document(cube / ITEM)[3]))
    else:
        fields = list(leaves(json.loads((cube / "config.json").read_text())))
    rows = []
    for field, value in fields:
        for name, new in mutations(value):
            work = tmp_path / "work"
            if work.exists():
                shutil.rmtree(work)
            shutil.copytree(cube, work)
            attacked = copy.deepcopy(lock)
            if kind == "lock":
                if not set_path(attacked, field, new):
                    continue
            elif kind == "yaml":
                import yaml

                path = work / constants.CONFIG_FILENAME
                document = yaml.safe_load(path.read_text())
                set_path(document, field, new)
                path.write_text(yaml.safe_dump(document))
                relist(work, attacked, constants.CONFIG_FILENAME)
            elif kind == "kv":
                raw, length, header, meta = kv_document(work / ITEM)
                assert set_path(meta, field, new), field  # every leaf is reached
                write_kv_document(work / ITEM, raw, length, header, meta)
                relist(work, attacked, ITEM)
            else:
                path = work / "config.json"
                document = json.loads(path.read_text())
                set_path(document, field, new)
                path.write_text(json.dumps(document))
                relist(work, attacked, "config.json")
            reseal(work, attacked)
            verdict, why = outcome(work, policy)
            shown = f"{kind}.{field}"
            rows.append((shown, name, verdict, why or
                         ("claimed: " + next(v for k, v in INFORMATIONAL.items()
                                             if _matches(shown, k))
                          if informational(shown) else "NOT LISTED")))
    return rows


@pytest.mark.parametrize("kind", ["lock", "kv", "yaml", "config"])
def test_every_claim_is_refused_or_shown_as_a_claim(proof, tmp_path, kind, capsys):
    rows = sweep(proof, tmp_path, kind)
    with capsys.disabled():
        print(f"\n{'field':<58} {'mutation':<10} outcome")
        for field, name, verdict, why in rows:
            print(f"{field[:58]:<58} {name:<10} {verdict}: {why[:80]}")
    assert rows
    unlisted = [(field, name) for field, name, verdict, why in rows
                if verdict == "accepted" and not informational(field)]
    assert unlisted == []
