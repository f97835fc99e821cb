"""Portable dumps: what MemOS writes under the hook loads anywhere, and holds no pickle.

- ``KVCacheMemory.dump`` (called by ``GeneralMemCube.dump``, ``MOS.dump`` and the scheduler's
  activation manager) writes each cache as a KV file, ``activations/<id>.kv.safetensors``, with
  its producer's identity (the model cubepack saw make it; a cache of unknown origin is never
  attributed to the memory's model: the hook's ``on_mismatch`` applies) and the token ids
  MemOS prefilled, instead of ``activation_memory.pickle``. A cache that no longer matches its
  prompt (grown in place by an unhooked chat: MemOS #2301) is refused, not shipped.
- ``GeneralMemCube.dump`` then packs the folder: models named in ``config.json`` by their Hub id
  (the hook loads pinned models from local snapshot folders; a path means nothing elsewhere),
  pinned to the model MemOS loaded, locked, so the dump verifies and loads through cubepack.
- A dump of memories a private cube brought (:mod:`._privacy`) is written private, to trusted
  recipients, by :func:`dump_private`, or refused: it is made in a RAM folder and only its
  ciphertexts reach the target.
"""

from __future__ import annotations

import inspect
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._util import atomic, constants
from .._util.canonical import json_safe
from .._util.ramdir import ram_folder
from ..errors import CubepackError, IdentityMismatch, UnsafeInputError, UsageError
from ..kinds._seam import activation_filename, write_prompts
from ..kv._torch import save_kv_cache
from ..memos_format import _layout as memos_layout
from ..memos_format._layout import header_metadata, memos_prompt_ids
from ..ops import encrypt, pack
from ..trust._evidence import ASSERTED
from ._privacy import (
    Seal,
    check_dump_target,
    dump_cube_id,
    recipients_for,
    remember_dump,
    writing_clear,
)
from ._use import (
    REGISTER_ADVICE,
    UNKNOWN,
    UNKNOWN_FINDING,
    Produced,
    live_identity,
    lookup,
    produced,
)

logger = logging.getLogger("cubepack.memos")


def dump_activations(act_mem: Any, dir: str, *, on_mismatch: str | None = None,
                     planned: list[tuple[str, Any, Any, Produced]] | None = None) -> None:
    """``KVCacheMemory.dump`` / ``VLLMKVCacheMemory.dump`` under the hook: one KV file per
    cache (or, for vLLM, the prompts file), no pickle. A cache of unknown origin is never
    attributed to a model by the hook: ``on_mismatch`` applies (:func:`plan_dump`), before
    anything is written.

    The dump is what the memory holds now, as MemOS's own dump (one pickle, replaced) is:
    ``activations/`` is written whole beside the old one and swapped in, so a memory deleted
    since the last dump is not in it, and the pickle MemOS would have replaced is removed (a
    reload reads the newest dump, never an older pickle beside it)."""
    folder = Path(dir)
    local = hasattr(act_mem.llm, "model")
    if local and planned is None:
        planned = plan_dump(act_mem, on_mismatch)
    with atomic.placing(folder, elsewhere="dump to another folder", whole=False):
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / constants.ACTIVATIONS_DIR
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            raise UnsafeInputError(f"{target} is a symlink or not a folder; refusing to dump "
                                   "activations through it.")
        staging = atomic.staging_dir(target, "dump")
        try:
            _write_activations(act_mem, staging, local, planned)
            atomic.replace_dir(staging / constants.ACTIVATIONS_DIR, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        pickle_name = getattr(getattr(act_mem, "config", None), "memory_filename", None)
        opened = memos_layout.opened_path(pickle_name)
        stale = folder / opened if opened is not None else None
        if stale is not None and (stale.is_file() or stale.is_symlink()):
            stale.unlink()  # MemOS's own dump would have replaced it with this one


def _write_activations(act_mem: Any, folder: Path, local: bool,
                       planned: list[tuple[str, Any, Any, Produced]] | None) -> None:
    """The files of one activation dump, into ``folder`` (its ``activations/``)."""
    (folder / constants.ACTIVATIONS_DIR).mkdir()
    if not local:  # vLLM: prompt strings the server prefills
        served = getattr(getattr(act_mem.llm, "config", None), "model_name_or_path", None)
        write_prompts(folder, [(item_id, item.memory, item.metadata or {}, _records(item))
                               for item_id, item in act_mem.kv_cache_memories.items()],
                      model=served)
        return
    tokenizer = getattr(act_mem.llm, "tokenizer", None)
    for item_id, item, cache, record in planned or []:
        memos_metadata = json_safe(item.metadata or {})
        ids = prompt_ids(item_id, cache, record, tokenizer, memos_metadata)
        metadata = header_metadata(memos_metadata, id=item_id,
                                   provenance=record.provenance, records=_records(item))
        save_kv_cache(cache, folder / activation_filename(item_id), producer=record.producer,
                      metadata=metadata, token_ids=ids)


#: The label of a cache ``pack_cube`` (called without the hook) attributes to the memory's
#: model: the caller's word, the weakest label, as ``cubepack pack --legacy-pickle``'s.
CALLER_ASSERTED = {"kind": ASSERTED, "detail": "no producer record: attributed to the memory's "
                                               "model by the caller of pack_cube (no hook)"}


def plan_dump(act_mem: Any, on_mismatch: str | None) -> list[tuple[str, Any, Any, Produced]]:
    """(item id, item, cache, record) for each cache a dump writes, decided before anything is
    written. A cache cubepack never saw made (unknown origin) is never attributed to the
    memory's model under the hook: ``on_mismatch`` ``error`` refuses the dump, ``drop`` leaves
    it out (one warning), ``rebuild`` re-extracts it with the memory's model from its
    ``source_text`` (refused without one). ``on_mismatch`` None is ``pack_cube`` called
    without the hook: the caller's assertion, labelled ``asserted``.

    Raises:
        UsageError: a cache changed since cubepack checked it (grown in place, MemOS #2301).
        IdentityMismatch: a cache of unknown origin under ``error`` (or ``rebuild`` without a
            source text).
    """
    planned, live = [], None
    for item_id, item in act_mem.kv_cache_memories.items():
        record, state = lookup(item.memory)
        if state == "changed":
            raise UsageError(
                f"Activation {item_id!r} changed after cubepack checked it (its tensors were "
                "replaced, e.g. grown by a direct generation call: MemOS issue #2301), so it "
                "no longer is the memory it was made from. Re-extract it "
                "(act_mem.extract(source_text)) or reload the cube before dumping.")
        cache = item.memory
        if record is None:
            source = (item.metadata or {}).get("source_text")
            what = f"Activation {item_id!r} dumped from KVCacheMemory (KVCacheMemory.dump)"
            if on_mismatch is None:
                live = live or live_identity(getattr(act_mem.llm, "model", None), "pack_cube")
                record = Produced(item_id, live, {}, None, dict(CALLER_ASSERTED))
            elif on_mismatch == "drop":
                logger.warning("cubepack: %s: left out (its producer is unknown)", what)
                continue
            elif on_mismatch == "rebuild" and isinstance(source, str):
                cache = act_mem.llm.build_kv_cache(source)  # hooked: registered with its model
                record = produced(cache)
                if record is None:
                    raise UsageError(f"{what}: its rebuilt cache was not registered; dump with "
                                     "the hook installed (cubepack.memos.install()).")
                logger.warning("cubepack: %s: rebuilt with the memory's model", what)
            else:
                raise IdentityMismatch(what, [UNKNOWN], REGISTER_ADVICE + (
                    "" if on_mismatch != "rebuild" else
                    "; it records no source text to rebuild it from") +
                    ". A dump never attributes such a cache to the memory's model.",
                    finding=UNKNOWN_FINDING)
        planned.append((item_id, item, cache, record))
    return planned


def _records(item: Any) -> dict[str, Any] | None:
    """A KVCacheItem's ``records`` (the scheduler's text memories, composed text, timestamp)."""
    records = getattr(item, "records", None)
    return json_safe(records.model_dump(mode="json")) if records is not None else None


def prompt_ids(item_id: str, cache: Any, record: Any, tokenizer: Any,
               metadata: dict[str, Any]) -> list[int] | None:
    """The token ids a cache covers: those recorded when it was made or installed, else MemOS's
    prompt for its source rebuilt through the chat template; they must match its length. None
    when nothing records them (the item is dumped as plain MemOS dumps it; a recomputation
    later refuses it, saying why).

    Raises:
        UsageError: the ids no longer match the cache (grown in place).
    """
    length = cache.get_seq_length()
    ids = list(record.token_ids) if record is not None and record.token_ids else None
    if ids is None and tokenizer is not None and metadata.get("source_text") is not None:
        try:
            ids = memos_prompt_ids(tokenizer, metadata["source_text"])
        except CubepackError:
            ids = None
    if ids is None:
        logger.warning("cubepack: activation %s records no token ids and no source_text: it is "
                       "dumped without them, so it cannot be recomputed (proved) later; "
                       "re-extract it with act_mem.extract(text) to record them.", item_id)
        return None
    if len(ids) != length:
        raise UsageError(
            f"Activation {item_id!r} holds {length} tokens but its prompt has {len(ids)}: it "
            "grew in place during a chat (MemOS issue #2301: generation appends to the cache "
            "it is given), so it no longer is the memory it was made from. Re-extract it "
            "(act_mem.extract(source_text)) or reload the cube before dumping; with "
            "cubepack.memos.install() chats no longer grow stored caches.")
    return ids


def dump_cube(cube: Any, folder: Path, memory_types: list[str] | None = None, *,
              license: str | None = None, pretty_name: str | None = None,
              recompute: bool = False, on_mismatch: str | None = None) -> None:
    """Dump a live ``GeneralMemCube`` into the empty ``folder`` as a packed cube: MemOS's own
    dump writes config.json and the other memories, :func:`dump_activations` the caches, and
    pack pins the models (the one MemOS loaded for the activations), names snapshot paths by
    their Hub ids and locks it. ``on_mismatch``: the hook's policy for a cache of unknown
    origin (:func:`plan_dump`; None: ``pack_cube`` without the hook)."""
    from memos.mem_cube.general import GeneralMemCube

    types = memory_types or ["text_mem", "act_mem", "para_mem", "pref_mem"]
    act_mem = cube.act_mem if "act_mem" in types else None
    planned = plan_dump(act_mem, on_mismatch) if act_mem is not None and \
        hasattr(act_mem.llm, "model") else None  # a refusal before anything is written
    memos_dump = inspect.unwrap(GeneralMemCube.dump)  # MemOS's, even under the hook
    memos_dump(cube, str(folder), [kind for kind in types if kind != "act_mem"])
    if act_mem is not None:  # KV files (or prompts), never a pickle
        dump_activations(act_mem, str(folder), planned=planned)
    model = getattr(act_mem.llm, "model", None) if act_mem is not None else None
    pack(folder, model=model, license=license, pretty_name=pretty_name, recompute=recompute)


def dump_private(write_clear: Callable[[Path], None], target: Path, seals: frozenset[Seal],
                 writer: str, *, named: tuple[str, ...], pack_model: Any = None) -> None:
    """Write memories of private cubes (marked ``seals``) to ``target`` as a private cube, or
    refuse naming ``writer`` and ``target``: ``write_clear(folder)`` writes their clear files
    into a RAM folder (never a disk), which is packed when the writer did not (a lone memory's
    files, under the cube's id), encrypted to :func:`~._privacy.recipients_for`'s recipients
    there, and only the ciphertexts and public files are placed at ``target``, whole (a folder
    that is absent, empty, or holds an earlier private dump, which it replaces).

    Raises:
        SignatureError, UsageError: from :func:`~._privacy.recipients_for` (untrusted or mixed
            recipients) or :func:`~._privacy.check_dump_target`, before anything is written.
    """
    recipients, hidden = recipients_for(seals, named, writer, target)
    check_dump_target(target, writer)
    with atomic.placing(target, elsewhere="dump to another folder"), ram_folder() as ram:
        clear = ram / "cube"
        clear.mkdir()
        with writing_clear(ram):
            write_clear(clear)
            if not (clear / constants.LOCK_FILENAME).is_file():
                pack(clear, model=pack_model, cube_id=dump_cube_id(seals))
            encrypt(clear, recipients, hide_names=hidden)
        staging = atomic.staging_dir(target, "private-dump")
        try:
            shutil.copytree(clear, staging / "cube")  # ciphertexts and public files only
            atomic.replace_dir(staging / "cube", target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    remember_dump(target, writer)  # its next dump may replace this one, and nothing else
    logger.info("cubepack: %s wrote %s as a private cube (%d recipients)", writer, target,
                len(recipients))
