"""What ``pack`` does with a cube's activations: pin their producer (and the other models
MemOS's config.json names: the producer is the one ``--model`` overrides), check each KV
file's bytes are vouched for before they are sealed, convert a MemOS pickle through the
allowlist unpickler, prove every cache by the producer's own prefill (``--recompute``), and
make the lock's ``activations`` entries.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from ..._util import atomic, canonical, constants
from ..._util.canonical import json_safe
from ..._util.hashing import sha256_file
from ..._util.paths import names_a_path, resolve_inside
from ...errors import (
    CubepackError,
    FormatError,
    HubError,
    IdentityMismatch,
    IntegrityError,
    Mismatch,
    RecomputationFailed,
    UnsafeInputError,
    UnsupportedError,
    UsageError,
)
from ...format import _lock as lockfile
from ...format._fileset import is_activation_path
from ...format._lock import KV_HEADER, check_provenance
from ...format._provenance import ASSERTED, RECOMPUTED, RECORDED
from ...format.sections import Lock, Pin
from ...identity._fingerprint import fingerprint, resolve_model_folder
from ...identity._hub import fingerprint_hub
from ...identity._identity import ModelIdentity, compare, require_same
from ...kv._format import FULL, SLIDING, read_kv_header, upgrade_command, verify_checksums
from ...kv._recompute import describe, load_for_recompute
from ...kv._recompute import recompute as recompute_cache
from ...kv._torch import write_kv_layers
from ...memos_format import _layout as memos_layout
from ...memos_format._layout import memos_prompt_ids
from ...memos_format._pickle import read_memos_pickle
from ...memos_format._records import record_conflicts
from .._kind import PackJob, made_pin

NAME = "activations"


def pin(job: PackJob) -> None:
    """The producer (``--model``, else the pin the last pack made, else the producer a plain
    bundle's headers name) and every model config.json names, pinned; each format-2 file's
    bytes checked against the last lock; MemOS's pickle marked for conversion."""
    options, cube, files = job.options, job.cube, job.files
    model, revision = options.model, options.revision
    if model is None:  # keep the recorded pin; --revision alone moves it to that revision
        remembered, pinned_revision = _remembered_pin(job.earlier, job.config)
        model, revision = remembered, revision or pinned_revision
    plain = constants.MEMOS_CONFIG not in files
    if plain:
        _refuse_stray_caches(cube, files)
    # Every cube's KV headers say which dtype their producer ran in (a folder does not): a
    # MemOS cube of a bfloat16 producer re-packed with --model FOLDER was pinned, and
    # recomputed, in float32, refusing its own producer's caches.
    claims = _header_claims(cube, files)
    vouched = _vouched_by_lock(cube, files, job.earlier, options.recompute)
    found = None
    if plain and model is None and claims:  # a plain bundle: the producer its headers name
        model, revision, found = _found_producer(claims)
    job.pins.update(_pin_models(job.config, model=model, revision=revision,
                                dtype=_claimed_dtype(claims), from_metadata=job.claimed_roles))
    if found is not None:
        job.pins[memos_layout.ACT_ROLE]["name"] = found
    job.replaced.add(memos_layout.activation_pickle_name(job.config))
    job.state[NAME] = {"model": model, "vouched": vouched, "converted": [], "recomputed": {}}


def stage(job: PackJob, staging: Path) -> list[str]:
    """MemOS's pickle converted to KV files (or a vLLM cube's prompts file) in ``staging``,
    through the allowlist unpickler and only with ``--legacy-pickle``."""
    pickle_name = memos_layout.activation_pickle_name(job.config)
    if pickle_name not in job.files:
        return []
    if not job.options.legacy_pickle:
        raise UnsafeInputError(
            f"{job.cube / pickle_name} is a MemOS pickle, which can run code when loaded. "
            "Re-run with --legacy-pickle to convert it to KV files through cubepack's "
            "allowlist unpickler (the packed cube will hold no pickle)."
        )
    proven = _convert_pickle(job.cube / pickle_name, staging, job.pins, job.config,
                             model=job.state[NAME]["model"],
                             assert_producer=job.options.assert_producer)
    job.proven.update(proven)
    job.state[NAME]["converted"] = list(proven)
    return list(proven)


def prove(job: PackJob, staging: Path) -> dict[str, dict[str, Any]]:
    """``pack --recompute``: every cache proved and rewritten from the producer's prefill."""
    recomputed = _prove_activations(staging, job.pins, job.state[NAME]["model"])
    job.state[NAME]["recomputed"] = recomputed
    return recomputed


def memories(content: list[str]) -> list[str]:
    """The KV files and a vLLM cube's prompts file."""
    return [name for name in content if is_activation_path(name)
            or name == constants.PROMPTS_FILE]


def entries(job: PackJob, staging: Path, digests: dict[str, str],
            pins: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The lock's ``activations`` section."""
    return _activation_entries(staging, sorted(digests), pins, digests, job.proven,
                               job.state[NAME]["vouched"], job.cube, job.carried)


def finish(job: PackJob, staging: Path, written: Lock, result: Any) -> None:
    """The result's activations, and what this pack converted, recomputed, left unsealed by
    checksums (labels were kept by file, as pack or migrate wrote them; results name items)."""
    state = job.state[NAME]
    item_of = {entry.file: item for item, entry in written.activations.items()}
    result.activations = sorted(written.activations)
    result.converted = [item_of.get(name, name) for name in state["converted"]]
    result.recomputed = {item_of.get(name, name): entry["detail"]
                         for name, entry in state["recomputed"].items()}
    result.unchecksummed = _upgrade_notes(job.cube, staging, item_of, state["vouched"],
                                          result.models)


_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def _remembered_pin(previous: Lock | None,
                    config: dict[str, Any]) -> tuple[str | None, str | None]:
    """The Hub model and commit the cube's last pack pinned, when config.json still names it, so
    a re-pack without ``--model`` (to sign it, say) keeps the pin instead of re-resolving the
    name; (None, None) when there is none to keep.

    Raises:
        UsageError: config.json now names another model than the pin: say which with --model.
    """
    pin = previous.models.get(memos_layout.ACT_ROLE) if previous is not None else None
    if pin is None or pin.identity is None:
        return None, None
    if not pin.repo_id or not pin.revision:
        # A folder pin: the folder it named, when it is still here (fingerprinted again: the
        # pin is what this pack computes, never the old lock's word).
        name = pin.name
        named = memos_layout.act_model_name(config)
        if isinstance(name, str) and names_a_path(name) and Path(name).expanduser().is_dir() \
                and named in (None, name):
            return name, None
        return None, None
    named = memos_layout.act_model_name(config)
    if named not in (None, pin.repo_id, pin.name):
        raise UsageError(f"config.json names the producer {named}, but the cube was packed "
                         f"with {pin.repo_id}@{pin.revision}: a changed pin must be said. "
                         f"Pass --model {named} to pin it, or --model {pin.repo_id} "
                         f"--revision {pin.revision} to keep the old one.")
    return pin.repo_id, pin.revision


def _header_claims(cube: Path, files: list[str]) -> list[tuple[str, ModelIdentity]]:
    """(file, producer) each activation's KV header names: claims, which only say where to
    look for the producer and which dtype it ran in; the pin is always a fingerprint."""
    return [(name, read_kv_header(resolve_inside(cube, name)).producer)
            for name in files if is_activation_path(name)]


def _vouched_by_lock(cube: Path, files: list[str], earlier: Lock | None,
                     recompute: bool) -> dict[str, str]:
    """name -> sha256 for each activation older than KV format 3, checked now against the
    cube's last lock: a checksum never seals bytes nothing checked. A format-3 file carries
    its own checksums (checked where the lock's entries are made); a format-2 file's bytes are
    vouched for only by the lock, so one it does not list (no lock, a file added since) is
    refused, unless ``recompute``, which rewrites each cache from the producer's own prefill.

    Raises:
        IntegrityError: a format-2 file whose bytes differ from the lock's sha256.
        FormatError: a format-2 file no lock lists, without ``recompute``.
    """
    vouched = {}
    listed = earlier.files if earlier is not None else {}
    for name in files:
        if not is_activation_path(name):
            continue
        info = read_kv_header(resolve_inside(cube, name))
        if info.checksums is not None:
            continue
        expected = listed[name].sha256 if name in listed else None
        if expected is None and recompute:
            continue  # rewritten from this pack's own prefill before anything is sealed
        _require_vouched(cube / name, info.version, expected, sha256_file(cube / name),
                         "the cube's lock does not list it" if earlier is not None else
                         "the cube's lock cannot be read" if constants.LOCK_FILENAME in files
                         else "the cube has no lock")
        vouched[name] = expected
    return vouched


def _require_vouched(path: Path, version: int, expected: str | None, found: str,
                     unlisted: str = "the cube's lock does not list it") -> None:
    """A format-2 file's bytes (sha256 ``found``) may be sealed only when they are the ones
    the cube's lock lists (``expected``)."""
    if expected is None:
        raise FormatError(
            f"{path} is KV format v{version}: its tensors carry no checksums and {unlisted}, "
            "so nothing vouches for its bytes, and pack would seal them. Add its checksums "
            f"first ({upgrade_command(path)}: over the bytes as they are, so only for a file "
            "you trust), or pack with --recompute (each cache is rewritten from the "
            "producer's own prefill); nothing was written.")
    if found != expected:
        error = IntegrityError(
            f"{path} is KV format v{version}: its tensors carry no checksums, so only the "
            f"cube's lock vouches for its bytes, and they differ from it (sha256: expected "
            f"{expected}, found {found}): pack would seal the change; nothing was written. "
            "Restore the file (pull the cube again); if you changed it on purpose, add its "
            f"checksums ({upgrade_command(path)}) and pack again.")
        error.mismatches = [Mismatch("sha256", expected, found)]  # type: ignore[attr-defined]
        raise error


def _upgrade_notes(cube: Path, staging: Path, item_of: dict[str, str], vouched: dict[str, str],
                   pins: dict[str, dict[str, Any]]) -> dict[str, str]:
    """item -> the command that upgrades its format-2 file (still format 2 in ``staging``:
    a recomputation rewrote the others), naming the producer this pack pinned."""
    pin = made_pin(pins, memos_layout.ACT_ROLE)
    command = (upgrade_command(cube, pin.repo_id, pin.revision)
               if pin is not None and pin.where is not None else
               upgrade_command(cube, pin.name) if pin is not None and pin.name is not None
               else upgrade_command(cube))
    notes = {}
    for name in sorted(vouched):
        info = read_kv_header(resolve_inside(staging, name))
        if info.checksums is None:
            notes[item_of.get(name, name)] = (
                f"{name} is KV format v{info.version}: no per-tensor checksums (its bytes are "
                f"the ones the lock lists); add them: {command}")
    return notes


def _refuse_stray_caches(cube: Path, files: list[str]) -> None:
    """A plain bundle's KV files live in activations/: only those are checked against the pin,
    so one anywhere else would ship as a "source" under a producer nobody checked.

    Raises:
        UnsafeInputError: a ``.kv.safetensors`` file outside ``activations/``.
    """
    stray = [name for name in files
             if name.endswith(constants.KV_SUFFIX) and not is_activation_path(name)]
    if stray:
        raise UnsafeInputError(
            f"{cube / stray[0]} is a KV file outside {constants.ACTIVATIONS_DIR}/"
            + (f" ({len(stray) - 1} more too)" if len(stray) > 1 else "")
            + f"; pack checks only {constants.ACTIVATIONS_DIR}/<id>{constants.KV_SUFFIX} against "
            f"the producer it pins. Move it to {constants.ACTIVATIONS_DIR}/ (or remove it) and "
            "pack again.")


def _claimed_dtype(claims: list[tuple[str, ModelIdentity]]) -> str | None:
    """The one dtype a plain bundle's caches were computed in (a run setting, not a property
    of the weights: an fp32 checkpoint run in bf16 makes bf16 caches).

    Raises:
        UsageError: the caches carry several dtypes (a cube pins one producer).
    """
    dtypes = sorted({producer.dtype for _, producer in claims})
    if len(dtypes) > 1:
        names = {dtype: next(name for name, p in claims if p.dtype == dtype) for dtype in dtypes}
        raise UsageError("The KV files were computed in several dtypes ("
                         + ", ".join(f"{dtype}: {name}" for dtype, name in names.items())
                         + "); a cube pins one producer. Pack each dtype as its own cube.")
    return dtypes[0] if dtypes else None


def _found_producer(claims: list[tuple[str, ModelIdentity]]) -> tuple[str, None, str]:
    """(folder, None, Hub id) of the producer a plain bundle's headers name, found in the HF
    cache at the commit they name (never downloaded: a pin is of bytes this machine holds).

    Raises:
        UsageError: the headers name no Hub revision, several producers, or one not cached.
    """
    named = sorted({(p.model_id, p.revision) for _, p in claims}, key=str)
    if len(named) != 1 or not all(named[0]):
        what = ("several producers: " + ", ".join(f"{m}@{r}" for m, r in named)
                if len(named) > 1 else "no Hub model at a commit (it was made from a local folder)")
        raise UsageError(f"The KV files' headers name {what}, so pack cannot find the producer "
                         "by itself. Pass --model with the model that built them (a folder or a "
                         "Hub id): its fingerprint is the pin.")
    model_id, commit = named[0]
    if names_a_path(model_id) or Path(model_id).expanduser().exists():  # resolved first
        raise UsageError(f"The KV files' headers name {model_id!r}, a local path, not a Hub "
                         "model, so pack cannot find the producer by itself. Pass --model with "
                         "the model that built them (a folder or a Hub id): its fingerprint is "
                         "the pin.")
    try:
        folder, _, _ = resolve_model_folder(model_id, commit, local_files_only=True)
    except CubepackError as exc:
        raise UsageError(f"The KV files' headers name {model_id}@{commit}, which is not in the "
                         f"Hugging Face cache ({exc}). Download it (hf download {model_id} "
                         f"--revision {commit}) or pass --model.") from None
    return str(folder), None, model_id


def _pin_models(config: dict[str, Any], *, model: Any, revision: str | None,
                dtype: str | None = None,
                from_metadata: set[str] | None = None) -> dict[str, dict[str, Any]]:
    """Resolve every model the cube names to a pin (identity + repo id + revision); ``dtype``:
    the dtype the producer ran in, when its caches say so (a plain bundle's headers).
    ``from_metadata`` collects the roles pinned from a Hub's file metadata (no bytes hashed
    here: the Hub's claim, never a pin this pack proved)."""
    refs = memos_layout.model_refs(config)
    if model is not None and not any(ref.role == memos_layout.ACT_ROLE for ref in refs):
        refs.insert(0, memos_layout.ModelRef(memos_layout.ACT_ROLE, None, str(model), strict=True))
    pins: dict[str, dict[str, Any]] = {}
    for ref in refs:
        pin: dict[str, Any] = {"name": ref.name, "strict": ref.strict, "repo_id": None,
                               "revision": None, "identity": None}
        if ref.strict:
            source = model if model is not None else ref.name
            if _served_elsewhere(config, source):
                identity, claimed = _pin_from_hub(str(source), revision)
                if claimed and from_metadata is not None:
                    from_metadata.add(ref.role)
            elif isinstance(source, (str, Path)):
                identity = fingerprint(source, revision=revision, dtype=dtype)
            else:
                identity = fingerprint(source)
        else:
            if not memos_layout.is_hub_loadable(ref.backend):
                pins[ref.role] = {**pin, "reason": f"backend {ref.backend!r} is not a local model"}
                continue
            try:  # informational: pin what is already here, never download for it
                identity = fingerprint(ref.name, local_files_only=True)
            except CubepackError as exc:
                pins[ref.role] = {**pin, "reason": f"not available locally ({exc})"}
                continue
        pin["identity"] = identity.pinned()
        if ref.strict and model is not None:  # the model given, not the one config.json names
            pin["name"] = str(model) if isinstance(model, (str, Path)) else \
                (identity.model_id or getattr(model, "name_or_path", None))
        pin["repo_id"] = identity.model_id if identity.revision else None
        pin["revision"] = identity.revision
        pins[ref.role] = pin
    return pins


def _served_elsewhere(config: dict[str, Any], source: Any) -> bool:
    """Is ``source`` the producer of a vLLM cube, named by Hub id, with the Hub reachable? Its
    weights sit on the vLLM server, so it is pinned from the Hub's metadata at its commit
    (:func:`~cubepack.identity._hub.fingerprint_hub`: the identity a download would give, no
    weights downloaded). Offline, or named by a folder, it is fingerprinted as any model."""
    from huggingface_hub import constants as hub_constants

    return (memos_layout.act_backend(config) == "vllm_kv_cache" and isinstance(source, str)
            and not names_a_path(source) and source.count("/") == 1
            and not (constants.hub_offline() or hub_constants.HF_HUB_OFFLINE))


def _pin_from_hub(name: str, revision: str | None) -> tuple[ModelIdentity, bool]:
    """(the pin of a vLLM producer, whether it rests on the Hub's metadata): the Hub-metadata
    pin; when the Hub cannot be reached, the HF cache's copy of that revision, as
    huggingface_hub itself falls back (a pin from local bytes, which this process hashed)."""
    try:
        return fingerprint_hub(name, revision), True
    except HubError as exc:
        try:
            return fingerprint(name, revision=revision, local_files_only=True), False
        except CubepackError:
            raise exc from None


def activation_filename(item_id: str) -> str:
    """A safe file name for an item id (ids that are not plain names are hashed)."""
    stem = item_id if _SAFE_ID.match(item_id) \
        else "item-" + hashlib.sha256(item_id.encode()).hexdigest()[:16]
    return f"{constants.ACTIVATIONS_DIR}/{stem}{constants.KV_SUFFIX}"


def _convert_pickle(pickle_path: Path, staging: Path, pins: dict[str, dict[str, Any]],
                    memos_config: dict[str, Any], *, model: Any,
                    assert_producer: bool) -> dict[str, dict[str, Any]]:
    """Convert a MemOS pickle's caches to KV files; return each item's provenance (what pack
    established for its producer label just now)."""
    pin = made_pin(pins, memos_layout.ACT_ROLE)
    if pin is None or pin.identity is None:
        raise CubepackError(f"{pickle_path.name} holds activations but the cube names no "
                            "producer model; pass --model with the model that built them.")
    identity = pin.identity
    source = {"file": pickle_path.name, "sha256": sha256_file(pickle_path)}
    with open(pickle_path, "rb") as handle:  # read as a stream: never all its bytes twice
        dump = read_memos_pickle(handle, name=str(pickle_path))
    if memos_layout.act_backend(memos_config) == "vllm_kv_cache":
        write_prompts(staging, [(item.id, item.prompt, item.metadata, item.records)
                                for item in dump.items], source,
                      model=(dump.model_identity or {}).get("model_name_or_path"))
        return {}
    written, provenances = set(), {}
    for item in dump.items:
        if item.prompt is not None:
            raise UnsupportedError(f"Activation {item.id!r} is a vLLM prompt, not a KV cache. "
                                   + VLLM_REFUSAL)
        provenance = _producer_provenance(item, dump, identity, pin, memos_config, model=model,
                                          assert_producer=assert_producer)
        name = activation_filename(item.id)
        if name in written:
            raise FormatError(f"Two activations map to the file {name}; their ids collide.")
        written.add(name)
        metadata = memos_layout.header_metadata(item.metadata, id=item.id,
                                                converted_from=source, provenance=provenance,
                                                records=item.records)
        try:
            write_kv_layers(_typed_layers(item.layers, identity), resolve_inside(staging, name),
                            producer=identity, metadata=metadata)
        except IdentityMismatch as exc:
            raise exc.about(
                f"Activation {item.id!r} in {pickle_path.name}",
                "Its tensors contradict the pinned model; pass --model with the model that "
                "built this cube.") from None
        item.release()  # written: its tensors need not stay in memory
        provenances[name] = provenance  # by the file pack wrote, never by an id
    return provenances


def write_prompts(folder: Path, items: list[tuple[str, Any, dict[str, Any], Any]],
                  source: dict[str, Any] | None = None, *, model: str | None = None) -> None:
    """A vLLM activation memory's items (id, prompt, metadata, records), as the JSON file that
    replaces its pickle: the prompts are the memory (vLLM prefills them on its server), the
    pinned model is their identity; ``model`` names the model they were made for (a claim,
    which a folder without a lock can only offer)."""
    prompts = []
    for item_id, prompt, metadata, records in items:
        if not isinstance(prompt, str):
            raise UnsupportedError(f"Activation {item_id!r} holds a KV cache in a vLLM memory; "
                                   "a vLLM cube holds prompt strings only.")
        entry = {"id": str(item_id), "prompt": prompt, "metadata": json_safe(metadata)}
        if records is not None:
            entry["records"] = json_safe(records)
        prompts.append(entry)
    document = {"format": constants.PROMPTS_FORMAT, "version": 1, "items": prompts,
                "converted_from": source}
    if model:
        document["model"] = model
    atomic.write_text(resolve_inside(folder, constants.PROMPTS_FILE), canonical.dumps(document))


VLLM_REFUSAL = ("vllm_kv_cache activations are prompt strings that a vLLM server turns into KV "
                "caches on its side: there are no tensors to store, pin or verify. Set the cube's "
                "act_mem backend to 'uninitialized' (or rebuild it with the kv_cache backend), "
                "then pack again.")


def _typed_layers(layers: list[tuple[str, int, Any, Any]],
                  identity: ModelIdentity) -> list[tuple[str, int, Any, Any]]:
    """Early dumps stored every layer as a plain list entry; a sliding layer that never filled
    its window is exactly a full layer of the same length, so it is typed as the model's."""
    layer_types = identity.geometry.get("layer_types") or []
    window = identity.geometry.get("sliding_window") or 0
    typed = []
    for index, (kind, length, keys, values) in enumerate(layers):
        if kind == FULL and index < len(layer_types) and layer_types[index] == SLIDING \
                and keys.shape[-2] < window:
            kind = SLIDING
        typed.append((kind, length, keys, values))
    return typed


def _producer_provenance(item: Any, dump: Any, identity: ModelIdentity, pin: Pin,
                         memos_config: dict[str, Any], *, model: Any,
                         assert_producer: bool) -> dict[str, Any]:
    """Check the producer claims a pickle carries; say where the label comes from.

    Raises:
        IdentityMismatch: a MemOS producer record contradicts the pinned model, or ``--model``
            contradicts the model config.json names (without ``assert_producer``).
    """
    records = [(record, source) for record, source in (
        (item.producer_record, "MemOS #2305 metadata.producer"),
        (dump.model_identity, "MemOS #2302 model_identity")) if record]
    for record, source in records:
        conflicts = record_conflicts(record, identity, pin.name)
        if conflicts:
            raise IdentityMismatch(
                f"Activation {item.id!r}: its producer record ({source})", conflicts,
                "The pickle says another model produced it; pass --model with that model.")
    if records:
        return {"kind": RECORDED, "detail": f"{records[0][1]} agrees with the pinned model"}
    named = memos_layout.act_model_name(memos_config)
    if model is None or named is None:
        return {"kind": ASSERTED, "detail": "config.json names the producer; the pickle "
                                            "records none"}
    if _same_producer(named, identity):
        return {"kind": ASSERTED, "detail": f"--model {model} agrees with config.json's "
                                            f"{named}; the pickle records no producer"}
    if not assert_producer:
        raise IdentityMismatch(
            f"Activation {item.id!r}", [Mismatch("producer", named, str(model), of_producer=True)],
            f"config.json names {named} as the producer and the pickle records none; pack with "
            f"--model {named}, or pass --assert-producer to label these caches as {model}'s "
            "anyway (recorded in the lock and the card as asserted).")
    return {"kind": ASSERTED, "detail": f"--assert-producer: labelled as {model}'s although "
                                        f"config.json names {named}"}


def _same_producer(named: str, identity: ModelIdentity) -> bool:
    """Is the model config.json names (when available locally) the pinned model?"""
    if named in (identity.model_id,):
        return True
    try:
        return fingerprint(named, local_files_only=True, dtype=identity.dtype).strict() == \
            identity.strict()
    except CubepackError:
        return False


def _activation_entries(staging: Path, files: list[str], pins: dict[str, dict[str, Any]],
                        digests: dict[str, str], proven: dict[str, dict[str, Any]],
                        vouched: dict[str, str], cube: Path,
                        carried: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The lock's activation entries. Provenance is what this pack established (a conversion
    it checked, a recomputation it ran), else the label the last lock gave the same bytes when
    compacting (``carried``: its claim, kept as it was), else ``recorded`` (the KV header names
    a producer that
    agrees with the pin), or less when the header itself says less: a header's ``provenance``
    metadata is a claim, so it may lower the label (``asserted``) but never raise it."""
    entries: dict[str, dict[str, Any]] = {}
    ids: dict[str, str] = {}  # activation_id_key -> the id that has it
    producer_pin = made_pin(pins, memos_layout.ACT_ROLE)
    for name in files:
        if not is_activation_path(name):
            continue
        info = read_kv_header(resolve_inside(staging, name))
        verify_checksums(info)  # never seal bytes that are not the ones the file records
        if info.checksums is None:  # the bytes sealed are the ones checked against the lock
            _require_vouched(cube / name, info.version, vouched.get(name), digests[name])
        if producer_pin is None or producer_pin.identity is None:
            raise CubepackError(f"{name} is an activation but the cube names no producer model; "
                                "pass --model.")
        pinned = producer_pin.identity
        mismatches = compare(pinned, info.producer)
        if mismatches:
            raise IdentityMismatch(f"Activation file {name}", mismatches,
                                   "It was produced by another model than the one being pinned; "
                                   "pass --model with its producer or remove the file.")
        item_id = str(info.metadata.get("id") or Path(name).name[: -len(constants.KV_SUFFIX)])
        key = lockfile.activation_id_key(item_id)
        if key in ids:
            first = ids[key]
            raise FormatError(f"Two activation files {lockfile.duplicate_id(first, item_id)} "
                              f"({entries[first]['file']} and {name}); give one of them another "
                              "id (the id in its KV header's metadata, else its file name).")
        ids[key] = item_id
        entries[item_id] = {"file": name, "model_role": memos_layout.ACT_ROLE,
                            "token_count": info.token_count, "kv_dtype": info.kv_dtype,
                            "num_layers": info.num_layers, "sha256": digests[name],
                            "provenance": proven.get(name) or carried.get(digests[name])
                            or _header_label(info)}
    return entries


def _header_label(info: Any) -> dict[str, Any]:
    claimed = info.metadata.get("provenance")
    if check_provenance(claimed) and claimed["kind"] == ASSERTED:
        return {"kind": ASSERTED, "detail": str(claimed.get("detail", ""))}
    return KV_HEADER


def _prove_activations(staging: Path, pins: dict[str, dict[str, Any]],
                       model: Any) -> dict[str, dict[str, Any]]:
    """Recompute every activation in ``staging`` with the pinned producer (every position);
    rewrite each with its token ids; return each one's ``recomputed`` provenance, or refuse."""
    import datetime

    pin = made_pin(pins, memos_layout.ACT_ROLE)
    if pin is None or pin.identity is None:
        raise CubepackError("--recompute needs the producer pinned: pass --model with the "
                            "model that built the caches.")
    # The packer's own producer: --model, else the pin this pack just made: its Hub commit
    # (never the name config.json gives, which may resolve elsewhere), else the folder it
    # fingerprinted. Whatever loads must be the pin: what proves a cache is the pinned model.
    source = model if model is not None else (None if pin.where is not None else pin.name)
    live = load_for_recompute(source, pin.repo_id, pin.revision, pin.identity.dtype)
    require_same(pin.identity, fingerprint(live), "The model loaded to recompute the caches")
    tokenizer, proven = None, {}
    for path in sorted((staging / constants.ACTIVATIONS_DIR).glob("*" + constants.KV_SUFFIX)):
        info = read_kv_header(path)
        item_id = str(info.metadata.get("id") or path.name[: -len(constants.KV_SUFFIX)])
        ids = info.token_ids
        if not ids:
            tokenizer = tokenizer or _tokenizer_for(live)
            ids = memos_prompt_ids(tokenizer,
                                   memos_layout.item_metadata(info.metadata).get("source_text"))
            if len(ids) != info.token_count:
                raise RecomputationFailed(
                    f"Activation {item_id!r} holds {info.token_count} tokens but MemOS's prompt "
                    f"for its source_text has {len(ids)} with this model's tokenizer: it was not "
                    "built by this model's chat template, so it cannot be proven.")
        result = recompute_cache(live, info, item_id, token_ids=ids)
        if not result.ok:
            raise RecomputationFailed(f"Activation {item_id!r} is not this model's: it "
                                      f"{describe(result)}. Pass --model with its producer.")
        provenance = {"kind": RECOMPUTED,
                      "detail": f"{describe(result)}; written from this prefill",
                      "model": pin.identity.weights_digest, "tokens": result.positions,
                      "max_error": 0.0,  # the file written is the prefill itself
                      "at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                          timespec="seconds")}
        # What is written is the prefill this pack ran, not the stored tensors it matched:
        # inside the proof's bound a stored cache can still steer an answer; the packer's own
        # prefill cannot (docs/explanation/proof-bound.md). So a cube labelled `recomputed` holds
        # bit for bit what its packer's model computed.
        write_kv_layers(result.layers, path, producer=info.producer,
                        token_ids=ids, metadata={**info.metadata, "provenance": provenance})
        proven[path.relative_to(staging).as_posix()] = provenance
    return proven


def _tokenizer_for(model: Any) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model.name_or_path))
