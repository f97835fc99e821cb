"""Adversary (issue #30, item 4): "a KV file proves its own bytes at load".

Found (TOCTOU): ``load_kv_cache`` (and the MemOS hook, which loads through the same
``mapped_layers``) hashes the file's *mapped* pages and returns tensors that are views of a
private (copy-on-write) mapping. On Linux a private mapping shares the page cache until the
process writes a page, so a later in-place write to the file (``dd conv=notrunc``, an rsync
``--inplace``, a writer that reuses the inode, a bad sector re-read after the clean page was
evicted) silently changes the tensors the model uses after the checksum passed: the bytes a
model answers from are not the bytes that were checked, and no IntegrityError is ever raised.
(``cp`` over the file truncates it first: a process still using the mapping then reads past
the end of the file, which is SIGBUS.) Expected: the cache returned is the bytes that were
checked (a private copy of them, or a check that still holds when they are used)."""

from __future__ import annotations

import torch

import cubepack
from cubepack._util.safetensors_header import read_header

from helpers import build_cache


def test_a_loaded_cache_does_not_change_when_its_file_is_rewritten_in_place(models, prompt_ids,
                                                                            tmp_path):
    model = models["a"]
    path = tmp_path / "c.kv.safetensors"
    cubepack.save_kv_cache(build_cache(model, prompt_ids), path,
                           producer=cubepack.fingerprint(model), token_ids=prompt_ids[0].tolist())
    cache = cubepack.load_kv_cache(path, model)  # every tensor checked against its checksum
    checked = cache.layers[0].keys.clone()

    header = read_header(path)
    where = header.data_offset + header.tensors["layers.0.keys"].begin
    with open(path, "r+b") as handle:  # one byte rewritten in place, after the check
        handle.seek(where)
        byte = handle.read(1)
        handle.seek(where)
        handle.write(bytes([byte[0] ^ 0xFF]))

    assert torch.equal(cache.layers[0].keys, checked), \
        "the cache the model uses changed after its checksum passed"
