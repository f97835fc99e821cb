"""``pack_cube``: a live ``GeneralMemCube`` written straight to a packed cube, no pickle between."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from .._util import atomic
from .._util.canonical import json_safe
from ..cube._memos_layout import memos_prompt_ids
from ..cube._pack import VLLM_REFUSAL, activation_filename, pack
from ..errors import UnsupportedError
from ..identity._fingerprint import fingerprint
from ..kv._torch import save_kv_cache


def pack_cube(cube: Any, out_dir: str | Path, *, license: str | None = None,
              pretty_name: str | None = None, recompute: bool = False) -> Any:
    """Write a live ``GeneralMemCube`` to ``out_dir`` as a packed cube, with no pickle between.

    MemOS dumps the other memories; each activation is written as a KV file with the identity of
    the model MemOS loaded (``act_mem.llm.model``) and the token ids MemOS prefilled (rebuilt
    from its source through MemOS's chat-template path, kept when they match the cache's
    length); pins come from that model. When the model was loaded from a Hub snapshot,
    ``config.json`` names the Hub id again, not the local path. With ``recompute``, the model
    proves every cache (provenance ``recomputed``). Atomic: ``out_dir`` appears complete or not
    at all.
    """
    out = Path(out_dir)
    if cube.act_mem is not None and not hasattr(cube.act_mem.llm, "model"):
        raise UnsupportedError(f"This cube's activation memory ({type(cube.act_mem).__name__}) "
                               f"has no local model. {VLLM_REFUSAL}")
    staging = atomic.staging_dir(out, "pack-cube")
    try:
        dump_dir = staging / "cube"
        dump_dir.mkdir()
        types = [kind for kind in ("text_mem", "para_mem", "pref_mem") if getattr(cube, kind, None)]
        cube.dump(str(dump_dir), memory_types=types)  # config.json + non-activation memories
        model = cube.act_mem.llm.model if cube.act_mem is not None else None
        if model is not None:
            producer = fingerprint(model)
            tokenizer = getattr(cube.act_mem.llm, "tokenizer", None)
            for item_id, item in cube.act_mem.kv_cache_memories.items():
                metadata = {**json_safe(item.metadata or {}), "id": item_id}
                save_kv_cache(item.memory, dump_dir / activation_filename(item_id),
                              producer=producer, metadata=metadata,
                              token_ids=_prompt_ids(tokenizer, metadata, item.memory))
        pack(dump_dir, model=model, license=license, pretty_name=pretty_name,
             recompute=recompute)
        atomic.replace_dir(dump_dir, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _prompt_ids(tokenizer: Any, metadata: dict[str, Any], cache: Any) -> list[int] | None:
    """The ids MemOS prefilled for this item, when they can be rebuilt and match the cache."""
    if tokenizer is None or metadata.get("source_text") is None:
        return None
    try:
        ids = memos_prompt_ids(tokenizer, metadata["source_text"])
    except Exception:  # noqa: BLE001 - no template, odd source: record no ids rather than guess
        return None
    return ids if len(ids) == cache.get_seq_length() else None
