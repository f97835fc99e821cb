"""``cubepack pack``: turn a MemOS cube folder into a pinned, locked, pickle-free cube.

In place and atomic: the packed cube is assembled in a staging folder beside the cube (files
that do not change are hard-linked, not copied), then swapped in with one rename. If anything
fails, the cube is exactly as it was.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._util import atomic, canonical, constants
from .._util.hashing import hash_files, sha256_file
from .._util.paths import list_cube_files, names_a_path, resolve_inside
from .._util.quiet import terminal_bars
from .._version import __version__
from ..errors import CubepackError, FormatError, UnsafeInputError, UsageError
from ..format import _card as card
from ..format import _cubeconfig as cubeconfig
from ..format import _fileset as fileset
from ..format import _lock as lockfile
from ..format import _partial as partialformat
from ..format._content import content_error
from ..format.sections import Lock
from ..identity._fingerprint import hub_origin
from ..kinds import KINDS, PackJob, PackOptions, PackResult, made_pin
from ..memos_format import _layout as memos_layout
from ..memos_format._layout import memos_config_problems
from ..format._envelope import read_envelope
from ..format.sections import shards as shardformat
from ..trust._attestation import Proved, names_these_memories
from ..trust._signing import check_key, write_signature


@terminal_bars
def pack(cube_dir: str | Path, options: PackOptions | None = None, **fields: Any) -> PackResult:
    """Pack the cube folder ``cube_dir`` in place.

    Args:
        options: a ``PackOptions``: the settings below (its defaults without it).
        fields: the same settings by keyword, set over ``options``
            (``pack(cube, model=..., recompute=True)``); an unknown one is a UsageError.

    Options:
        model: the activation producer (folder, Hub id or loaded model), overriding the
            ``act_mem`` extractor named in ``config.json``.
        revision: branch, tag or commit of a Hub ``model`` to pin.
        legacy_pickle: convert MemOS's ``activation_memory.pickle`` to KV files through the
            allowlist unpickler. Without it a cube holding a pickle is refused.
        license: the license for the model card's metadata (e.g. ``apache-2.0``).
        pretty_name: the model card's title.
        sign_key: an ECDSA P-256/P-384 private key (PEM): sign the packed cube
            (``cubepack.intoto.json``, then ``cubepack.sig``, see
            :mod:`cubepack.trust._signing`).
        assert_producer: label converted caches as ``model``'s even though ``config.json``
            names another producer and the pickle records none (recorded in the lock and the
            card as ``asserted``).
        recompute: prove every activation with the producer model: recover token ids a MemOS
            pickle did not record (as MemOS built the cache, through the chat template), run the
            model's prefill and require it to reproduce each cache; store the ids and mark the
            provenance ``recomputed`` (model, tokens, max error, time).
        cube_id: the cube's id, for a folder without MemOS's config.json (a text-memory
            export, a bundle of KV files); with a config.json, it must agree with its cube_id.
        embedder: the embedder that made the text memory's vectors (a spec, as for
            ``verify --embedder``): it must reproduce the cube's sample, and its vectors for a
            fixed probe set are recorded as its behavioural fingerprint.
        adapter_base: the base model of the cube's LoRA adapters (``parametric/<name>/``): a
            folder, a Hub id (``owner/name[@revision]``) or a loaded model, or a dict of
            adapter name -> base. Without it each adapter's base is the one the last pack
            pinned, else the name its adapter_config.json claims (used to find the base only:
            the pin is the base's own fingerprint).
        shards: store the activation memories many to a file (shards, each with its index:
            lock version 6, docs/reference/shards.md), True; one a file, False; None (the
            default): shards above 100 memories, or when the cube is sharded already.
        shard_size: a shard's bound in bytes (implies ``shards``; default 2 GiB); a memory
            larger than it gets a shard of its own. A re-pack of a sharded cube is
            incremental: shards whose memories are unchanged stay byte for byte, new memories
            go to new shards (docs/reference/shards.md, "Incremental packs").
        remove: ids of sharded memories to drop (their bytes stay in their shard, dead); with
            a new ``activations/ID.kv.safetensors`` of the same id, the memory is replaced.
        compact: rewrite the shards whose dead share passes this bound and every shard whose
            range overlaps another (``cubepack compact``, ``ops/_compact.py``).
        derived: for ``migrate`` only: ``{"lineage": section, "provenance": {file: label}}``,
            the lineage of the cube it builds and the activations it re-prefilled itself.
            Without it, a cube's recorded lineage is kept (a re-pack to sign it, say).

    Raises:
        UnsafeInputError: symlinks or unsafe names in the cube; a pickle without
            ``legacy_pickle``; a pickle naming a forbidden global.
        IdentityMismatch: an activation contradicts the pinned model's geometry or dtype; an
            adapter's tensors do not fit its base (a module absent, or other shapes).
        ModelNotFoundError: the producer model (or an adapter's base) cannot be found.

    Returns:
        a ``PackResult``: the cube, its lock digest and content digest, the files, pinned
        models and activations it locked, and what it converted or recomputed.

    Example:
        ```python
        result = cubepack.pack("my-cube", model="org/model-a")
        print(result.digest, len(result.activations))
        ```
    """
    return _pack(Path(cube_dir), PackOptions.build(options, **fields))


def _pack(cube: Path, options: PackOptions) -> PackResult:
    """Pin (every kind, in order), then stage, prove and lock in a staging folder swapped in
    whole; the cube is exactly as it was if anything fails."""
    partialformat.refuse(cube, "pack", "would lock only the memories here, or fail on those "
                         "it lacks")
    files = list_cube_files(cube)
    for kind in KINDS:
        kind.refuse(cube, files, options)
    earlier = _previous_lock(cube, files)
    if earlier is not None and earlier.private:
        raise UsageError(f"{cube} is a private cube (its files are encrypted): it is packed "
                         "already. Change its recipients with cubepack rekey; pack its clear "
                         "source to change its content.")
    cube_id = options.cube_id
    if cube_id is not None and cube_id != (earlier.cube_id if earlier is not None else None):
        lockfile.check_cube_id(cube_id)  # a new id; one a cube already has is kept as it is
    if cube_id is None and constants.MEMOS_CONFIG not in files and earlier is not None:
        cube_id = earlier.cube_id  # a re-pack keeps the id its last pack was given
    job = PackJob(cube, files, options, _read_memos_config(cube, files, cube_id), earlier,
                  settings=_previous_settings(cube, files, earlier))
    for kind in KINDS:
        kind.pin(job)
    if options.sign_key is not None:  # fail before any work
        check_key(options.sign_key, private=True, password=options.sign_password)
    previous_lock = (cube / constants.LOCK_FILENAME).read_bytes() \
        if constants.LOCK_FILENAME in files else None
    previous_card = _previous_card(cube, files)
    with atomic.placing(cube, elsewhere="copy the cube to a writable folder and pack the copy"):
        staging = atomic.staging_dir(cube, "pack")
        try:
            result = _stage(job, staging, previous_lock, previous_card)
            result.cube_dir = cube
            if options.sign_key is not None:
                _sign(job, cube)
            return result
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _stage(job: PackJob, staging: Path, previous_lock: bytes | None,
           previous_card: card.PreviousCard) -> PackResult:
    """The cube's files copied (linked) into ``staging``, converted and proved by the kinds,
    locked and carded; swapped in when anything changed."""
    cube, files, options = job.cube, job.files, job.options
    renamed = hub_names_for_snapshots(job.config, job.pins)
    for name in files:
        # Generated files are written anew; signing files are kept by a re-pack that
        # changes nothing, dropped otherwise; bookkeeping is kept in place, never locked.
        if name in fileset.GENERATED or name in job.replaced or name in fileset.SIGNING:
            continue
        if name == constants.MEMOS_CONFIG and renamed is not None:
            atomic.write_text(staging / name, json.dumps(renamed, indent=2,
                                                          ensure_ascii=False) + "\n")
            continue
        atomic.link_or_copy(resolve_inside(cube, name), resolve_inside(staging, name))
    converted = [name for kind in KINDS for name in kind.stage(job, staging)]
    job.proven.update((options.derived or {}).get("provenance") or {})
    if options.recompute:
        for kind in KINDS:
            job.proven.update(kind.prove(job, staging))
    lineage = (options.derived or {}).get("lineage") or (
        job.earlier.lineage.to_dict() if job.earlier is not None and job.earlier.lineage
        else None)
    result = _write_metadata(
        job, staging, license=options.license or previous_card.license,
        pretty_name=_card_title(options.pretty_name or previous_card.pretty_name, job.config,
                                cube),
        previous_card=previous_card, lineage=lineage)
    written = lockfile.parse((staging / constants.LOCK_FILENAME).read_bytes())
    for kind in KINDS:
        kind.finish(job, staging, written, result)
    result.moved_from = _moved_pins(job.earlier, job.pins)
    result.changed = previous_lock != (staging / constants.LOCK_FILENAME).read_bytes() \
        or bool(converted)
    if result.changed and options.compact is not None \
            and constants.ATTESTATION_FILENAME in files:
        _keep_memories_attestation(cube, staging)
    unsigned = [name for name in files if name not in fileset.SIGNING]
    if result.changed or sorted(list_cube_files(staging)) != unsigned:
        atomic.replace_dir(staging, cube)
    else:
        shutil.rmtree(staging, ignore_errors=True)
    return result


def _keep_memories_attestation(cube: Path, staging: Path) -> None:
    """``compact`` re-lays out the same memories, pins and files: it keeps an attestation
    that names them by digest (version 4); verify still checks it, and says it signs the
    memories, not the layout. ``cubepack.sig`` named the old files: dropped. Any other re-pack
    that changes the cube drops both, as before (it may change the card, which no memories
    statement covers)."""
    try:
        envelope = read_envelope(cube / constants.ATTESTATION_FILENAME)
        lock = shardformat.resolved(lockfile.parse((staging / constants.LOCK_FILENAME)
                                                   .read_bytes()), shardformat.local_fetch(staging))
    except (CubepackError, OSError):  # unreadable: dropped with the signature, as before
        return
    if names_these_memories(envelope, lock):
        atomic.link_or_copy(cube / constants.ATTESTATION_FILENAME,
                            staging / constants.ATTESTATION_FILENAME)


def _sign(job: PackJob, cube: Path) -> None:
    """Sign the cube just written and hashed, from those digests. Pack made every pin and
    label of this lock itself; a lineage it derived only when migrate handed it one (a
    lineage kept from the last lock is a claim)."""
    derived = job.options.derived is not None
    lock = lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    # A label compact carried from the last lock is that lock's claim: signed as one; so is
    # a pin read from a Hub's metadata (the Hub's claim).
    proved = Proved.everything_of(lock, "migrate" if derived else "pack", lineage=derived,
                                  carried=frozenset(job.carried))
    proved = replace(proved, producers=proved.producers - job.claimed_roles)
    write_signature(cube, job.options.sign_key, proved, password=job.options.sign_password)


def _card_title(pretty_name: str | None, memos_config: dict[str, Any], cube: Path) -> str:
    """The card's title: the one given, else MemOS's cube id, else the folder's name."""
    cube_id = memos_config.get("cube_id")
    return pretty_name or (cube_id if isinstance(cube_id, str) and cube_id else cube.resolve().name)


# --- inputs -------------------------------------------------------------------------------------

def _read_memos_config(cube: Path, files: list[str], cube_id: str | None) -> dict[str, Any]:
    """MemOS's config.json, with its cube_id; or, for a folder without one (a text-memory export
    such as MemOS's ``mem_cube_tree``, a bundle of KV files), just the ``cube_id`` given: then
    no MemOS-specific rule applies beyond MemOS's default file names."""
    if cube_id is not None and (not isinstance(cube_id, str) or not cube_id.strip()
                                or any(ord(ch) < 32 for ch in cube_id)):
        raise UsageError(f"--cube-id must be a non-empty name, not {cube_id!r}.")
    if constants.MEMOS_CONFIG not in files:
        if cube_id is None:
            raise UsageError(f"{cube} has no config.json, so it names no cube id. Pass one: "
                             f"cubepack pack {cube} --cube-id OWNER/NAME (or dump the cube with "
                             "MemOS, GeneralMemCube.dump, which writes a config.json).")
        return {"cube_id": cube_id}
    try:
        config = canonical.loads_strict((cube / constants.MEMOS_CONFIG).read_bytes())
    except ValueError as exc:
        raise FormatError(f"{cube / constants.MEMOS_CONFIG} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise FormatError(f"{cube / constants.MEMOS_CONFIG} must hold a JSON object.")
    settings = memos_layout.code_running_settings(config)
    if settings:  # before any model is pinned: pinning reads the names those settings sit by
        raise UnsafeInputError(memos_layout.code_settings_message(
            settings, str(cube / constants.MEMOS_CONFIG), "pack again"))
    if "cube_id" not in config and not set(config) & set(memos_layout.MEMORY_KINDS):
        # Some other file of that name (a transformers model's): advice to edit it is wrong.
        model = "model_type" in config or "architectures" in config
        looks = (f" (it looks like a model's config: model_type "
                 f"{config.get('model_type', '?')!r})" if model else "")
        raise UsageError(
            f"{cube / constants.MEMOS_CONFIG} is not a MemOS cube config: it has no cube_id and "
            f"no memory section (text_mem, act_mem, para_mem, pref_mem){looks}. Point pack at a cube "
            "dumped by MemOS (GeneralMemCube.dump) or at a folder of KV files without a "
            "config.json (with --cube-id); a model folder is passed with --model, not packed.")
    if not isinstance(config.get("cube_id"), str) or not config["cube_id"]:
        raise UsageError(f"{cube / constants.MEMOS_CONFIG} has no cube_id; MemOS needs one to "
                         "load the cube. Add \"cube_id\": \"owner/name\" and pack again.")
    if cube_id is not None and cube_id != config["cube_id"]:
        raise UsageError(f"--cube-id {cube_id} contradicts config.json's cube_id "
                         f"{config['cube_id']}; MemOS reads config.json's, so drop --cube-id or "
                         "edit config.json.")
    return config


def hub_names_for_snapshots(config: dict[str, Any],
                            pins: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """``config`` with every model named by a local path renamed to its Hub id (a path means
    nothing on another machine and reveals the packer's file system), or None when nothing
    needs renaming: an HF-cache snapshot path by the repo it belongs to, any other path by the
    Hub model pinned for that role (``pack --model OWNER/MODEL``). The pin keeps the commit."""
    renamed = json.loads(json.dumps(config))
    changed = False
    for role in memos_layout.roles(renamed):
        inner = memos_layout.llm_config(renamed, role)
        name = (inner or {}).get("model_name_or_path")
        if not names_a_path(name):
            continue
        repo_id = hub_origin(Path(name))[0] if Path(name).expanduser().is_dir() else None
        repo_id = repo_id or ((pins or {}).get(role) or {}).get("repo_id")
        if repo_id:
            inner["model_name_or_path"] = repo_id
            changed = True
    return renamed if changed else None


def _public_names(pins: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``pins`` as the cube shows them: a model named by a local path that is a snapshot of a
    Hub repo (its pin has the repo id and commit) is named by its repo id, as config.json is
    (:func:`hub_names_for_snapshots`); the path means nothing to whoever pulls the cube."""
    shown = {}
    for role, pin in pins.items():
        made = lockfile.typed_pin(role, pin)
        shown[role] = ({**pin, "name": made.repo_id}
                       if made.where is not None and names_a_path(made.name) else pin)
    return shown



def _moved_pins(earlier: Lock | None, pins: dict[str, dict[str, Any]]) -> dict[str, str]:
    """role -> ``repo@revision`` the last pack pinned, for each role whose pin moved (``pins``:
    this pack's, as it writes them)."""
    moved = {}
    for role, old in (earlier.models.items() if earlier is not None else ()):
        made = made_pin(pins, role)
        if old.revision and (old.repo_id, old.revision) != (
                (made.repo_id, made.revision) if made is not None else (None, None)):
            moved[role] = f"{old.repo_id}@{old.revision}"
    return moved



def _previous_lock(cube: Path, files: list[str]) -> Lock | None:
    """The cube's current lock, when it has a readable one (only to remember its pins)."""
    if constants.LOCK_FILENAME not in files:
        return None
    try:
        return lockfile.parse((cube / constants.LOCK_FILENAME).read_bytes())
    except CubepackError:
        return None


def _previous_settings(cube: Path, files: list[str], earlier: Lock | None) -> dict[str, Any]:
    """The pack settings the cube's last pack recorded in its ``cubepack.yaml`` (a shard's
    bound), which this pack keeps unless an option overrides one. Read only from a packed
    cube (a readable lock): a yaml beside no lock is not a pack's."""
    if earlier is None or constants.CONFIG_FILENAME not in files:
        return {}
    path = cube / constants.CONFIG_FILENAME
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{path} is not UTF-8 text; pack reads the settings its last pack "
                          "recorded there. Fix it, or remove it and pack again with those "
                          "settings (--shard-size SIZE).") from exc
    return cubeconfig.settings(text, str(path))


def _previous_card(cube: Path, files: list[str]) -> card.PreviousCard:
    """The README the cube holds now: cubepack's last card, or someone else's to keep."""
    if constants.CARD_FILENAME not in files:
        return card.PreviousCard()
    data = (cube / constants.CARD_FILENAME).read_bytes()
    try:
        return card.read_previous(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise FormatError(f"{cube / constants.CARD_FILENAME} is not UTF-8 text; pack keeps a "
                          "README's text in the card, so fix or remove it.") from exc





# --- activations --------------------------------------------------------------------------------


def _refuse_unshippable(staging: Path, names: list[str], memos_config: dict[str, Any]) -> None:
    """Refuse any file ``verify`` would refuse: pack never writes a cube that does not verify."""
    problems = [(name, error) for name in names
                if (error := content_error(resolve_inside(staging, name), name))]
    problems += [(name, UnsafeInputError(problem))
                 for name, problem in memos_config_problems(memos_config, names)]
    if problems:
        name, error = problems[0]
        more = f" ({len(problems) - 1} more file(s) too)" if len(problems) > 1 else ""
        raise type(error)(f"{name} {error}{more}. Remove it (or convert it) and pack again.")


# --- writing config, card and lock -----------------------------------------------------------

def _write_metadata(job: PackJob, staging: Path, *, license: str | None, pretty_name: str,
                    previous_card: card.PreviousCard,
                    lineage: dict[str, Any] | None = None) -> PackResult:
    """Hash the staged files, then write ``cubepack.yaml``, the card and the lock, each kind
    giving its memories' files and its lock section."""
    memos_config = job.config
    cube_id = memos_config.get("cube_id") if isinstance(memos_config.get("cube_id"), str) else None
    content = fileset.lockable(list_cube_files(staging))
    memories = memos_layout.memory_files(memos_config, content)
    for kind in KINDS:
        if kind.memory is not None:
            memories[kind.memory] = kind.memories(job, content)
    memos = constants.MEMOS_CONFIG in content
    if not memos:  # a plain bundle: its other files (source texts, prompts) are its sources
        listed = {name for names in memories.values() for name in names}
        memories["source"] = [name for name in content if name not in listed
                              and name != fileset.HUB_ATTRIBUTES]
    _refuse_unshippable(staging, content, memos_config)
    digests = {path.relative_to(staging).as_posix(): digest for path, digest in hash_files(
        [resolve_inside(staging, name) for name in content], progress=job.options.progress,
        description="hashing cube").items()}
    pins = _public_names(job.pins)
    sections = {kind.section: kind.entries(job, staging, digests, pins)
                for kind in KINDS if kind.section is not None}
    stored: dict[str, Any] = {}
    for kind in KINDS:
        stored.update(kind.store(job, staging, sections))
    if stored:  # the kinds laid files out anew (shards): list, check and hash what is there
        sections.update(stored)
        content = fileset.lockable(list_cube_files(staging))
        for kind in KINDS:
            if kind.memory is not None:
                memories[kind.memory] = kind.memories(job, content)
        fresh = [name for name in content if name not in digests]
        _refuse_unshippable(staging, fresh, {})
        digests = {name: digest for name, digest in digests.items() if name in content}
        digests.update({path.relative_to(staging).as_posix(): digest for path, digest in
                        hash_files([resolve_inside(staging, name) for name in fresh],
                                   progress=job.options.progress,
                                   description="hashing shards").items()})
    settings = {key: value for kind in KINDS
                for key, value in kind.settings(job, sections).items()}
    config_text = cubeconfig.dumps(cubeconfig.build(
        cube_id=cube_id, models=pins, memories=memories, settings=settings,
        **{kind.section: sections[kind.section] for kind in KINDS
           if kind.section is not None and kind.in_config}))
    atomic.write_text(staging / constants.CONFIG_FILENAME, config_text)

    hashed = content + [constants.CONFIG_FILENAME]
    digests[constants.CONFIG_FILENAME] = sha256_file(staging / constants.CONFIG_FILENAME)
    files = {name: {"sha256": digests[name], "size": resolve_inside(staging, name).stat().st_size}
             for name in hashed}
    draft = lockfile.build_lock(cube_id=cube_id, files=files, models=pins,
                                cubepack_version=__version__, lineage=lineage, **sections)
    card_text = card.render(lock=draft, memories=memories,
                            pretty_name=pretty_name,
                            license=license, repo_id=cube_id if cube_id and "/" in cube_id
                            else "OWNER/CUBE", cubepack_version=__version__,
                            previous=previous_card, memos=memos or bool(memories.get("textual")))
    card_bytes = card_text.encode("utf-8")
    atomic.write_bytes(staging / constants.CARD_FILENAME, card_bytes)
    files[constants.CARD_FILENAME] = {"sha256": hashlib.sha256(card_bytes).hexdigest(),
                                      "size": len(card_bytes)}
    lock = lockfile.build_lock(cube_id=cube_id, files=files, models=pins,
                               cubepack_version=__version__, lineage=lineage, **sections)
    atomic.write_text(staging / constants.LOCK_FILENAME, lockfile.dumps(lock))
    written = lockfile.typed(lock)
    return PackResult(cube_dir=staging, digest=written.digest,
                      content_digest=written.content_digest, files=len(files), models=pins)
