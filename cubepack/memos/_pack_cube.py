"""``pack_cube``: a live ``GeneralMemCube`` written straight to a packed cube, no pickle between."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from .._util import atomic
from .._util.quiet import quietly
from ..errors import UsageError
from ._dump import dump_cube, dump_private
from ._hook import settings
from ._privacy import in_force, own_dump
from ._use import cube_seals

WRITER = "cubepack.memos.pack_cube"


@quietly(import_first=("memos",))
def pack_cube(cube: Any, out_dir: str | Path, *, license: str | None = None,
              pretty_name: str | None = None, recompute: bool = False) -> Any:
    """Write a live ``GeneralMemCube`` to ``out_dir`` as a packed cube, with no pickle between.

    MemOS dumps the other memories; each activation is written as a KV file with the identity of
    its producer (the model cubepack saw make it). A cache of unknown origin follows the
    installed hook's ``on_mismatch``; without the hook, calling this is your assertion that the
    memory's model made it (labelled ``asserted``) and the token ids MemOS
    prefilled (recorded when it was made, or rebuilt from its source through MemOS's
    chat-template path); a cache that no longer matches its prompt (grown in place: MemOS
    #2301) is refused. Pins come from the model MemOS loaded. When the model was loaded from a Hub snapshot,
    ``config.json`` names the Hub id again, not the local path. With ``recompute``, the model
    proves every cache (provenance ``recomputed``). Atomic: ``out_dir`` appears complete or not
    at all; ``out_dir`` must be new or empty (or hold the private cube this function wrote
    there last): nothing a folder holds is replaced. A cube holding a private cube's memories
    (see :mod:`cubepack.memos._privacy`) is written as a private cube, to trusted recipients,
    or refused.
    """
    out = Path(out_dir)
    if (out.exists() or out.is_symlink()) and (not out.is_dir() or out.is_symlink() or any(
            out.iterdir())) and not own_dump(out, WRITER):
        raise UsageError(f"cubepack.memos.pack_cube: {out} exists and is not an empty folder; "
                         "pack_cube writes a new cube and never replaces what a folder holds. "
                         "Pass an empty or new out_dir. Nothing was written.")
    policy = settings()  # the hook's, when installed: it never launders an unknown cache
    on_mismatch = policy.mismatch_action() if policy is not None else None
    seals = cube_seals(cube)
    if seals:
        dump_private(lambda clear: dump_cube(cube, clear, license=license,
                                             pretty_name=pretty_name, recompute=recompute,
                                             on_mismatch=on_mismatch),
                     out, seals, WRITER, named=in_force().recipients)
        return out
    with atomic.placing(out, elsewhere="pass another out_dir"):
        staging = atomic.staging_dir(out, "pack-cube")
        try:
            dump_dir = staging / "cube"
            dump_dir.mkdir()
            dump_cube(cube, dump_dir, license=license, pretty_name=pretty_name,
                      recompute=recompute, on_mismatch=on_mismatch)
            atomic.replace_dir(dump_dir, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out
