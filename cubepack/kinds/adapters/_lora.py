"""Parametric memory: LoRA adapters in PEFT's layout, pinned to the base model they adapt.

A cube holds each adapter as a folder ``parametric/<name>/`` with PEFT's ``adapter_config.json``
and ``adapter_model.safetensors`` (what ``PeftModel.save_pretrained`` writes; its README.md may
stay beside them). The name PEFT records for the base (``base_model_name_or_path``) is a claim:
pack may use it to find the base, but the pin is the base's own fingerprint (a strict model
role ``adapter.<name>`` in the lock), and every LoRA tensor's shape is checked against the
base's weight shapes, read from its safetensors headers (no torch): ``lora_A`` is
``(r, in_features)`` and ``lora_B`` ``(out_features, r)`` for a target weight ``(out, in)``.

Everything here reads JSON and safetensors headers only: deciding whether an adapter fits a
base never imports torch or peft (:mod:`._load` applies one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ..._util import canonical, constants, patterns
from ..._util.budget import checkpoint
from ..._util.canonical import digest_of_file_hashes
from ..._util.paths import resolve_inside
from ..._util.safetensors_header import Header, read_header
from ...format.sections import Adapter, Pin
from ...errors import (
    FormatError,
    HubError,
    IdentityMismatch,
    Mismatch,
    ModelNotFoundError,
    UnsupportedError,
    UsageError,
)
from ...format._fileset import is_bookkeeping
from ...format._lock import BASE_CLAIM
from ...identity._fingerprint import fingerprint, resolve_model_folder, weight_files
from ...identity._identity import compare

#: The lock's model role of an adapter's base: ``adapter.<name>``.
ROLE_PREFIX = "adapter."
_NAME = re.compile(constants.ADAPTER_NAME_PATTERN)
#: PEFT prefixes every saved key with the wrapper's path to the base model.
_PEFT_PREFIX = "base_model.model."
#: LoRA tensor suffixes cubepack checks: (suffix, part).
_PARTS = ((".lora_A.weight", "A"), (".lora_B.weight", "B"), (".lora_B.bias", "B.bias"),
          (".lora_embedding_A", "embedding_A"), (".lora_embedding_B", "embedding_B"),
          (".lora_magnitude_vector", "magnitude"))
#: ``init_lora_weights`` values whose initialisation only sets the LoRA weights (which the
#: saved ones then replace). The others (pissa, olora, corda, loftq, eva, lora_ga...) rewrite
#: the base model's weights or need data when PEFT loads the adapter.
SAFE_INITS = (True, False, "gaussian", "orthogonal")
#: PEFT's LoraConfig keys cubepack understands, as an allow-list: metadata PEFT ignores when it
#: applies an adapter, and the LoRA settings whose effect cubepack checks (rank and targets
#: against the tensors, alpha and its patterns, rsLoRA scaling, DoRA and lora_bias against the
#: tensors present, safe initialisations only). Any other key (``modules_to_save``,
#: ``trainable_token_indices``, ``layer_replication``, ``target_parameters``, the
#: ``*_config`` variants, a key of a newer PEFT) must be absent or off: each replaces or adds
#: base weights, changes the architecture, or is a rule cubepack has not read.
UNDERSTOOD = frozenset({
    "task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path",
    "revision", "inference_mode", "runtime_config", "megatron_core",  # metadata
    "r", "target_modules", "exclude_modules", "lora_alpha", "lora_dropout", "fan_in_fan_out",
    "bias", "use_rslora", "init_lora_weights", "layers_to_transform", "layers_pattern",
    "rank_pattern", "alpha_pattern", "use_dora", "lora_bias", "qalora_group_size",
    "loftq_config"})  # loftq_config: used only by init_lora_weights="loftq", refused below
#: What "off" looks like for a key outside :data:`UNDERSTOOD` (PEFT's defaults).
_OFF = (None, False, [], {}, "")


def role(name: str) -> str:
    return ROLE_PREFIX + name


def is_adapter_role(role_name: str) -> bool:
    return role_name.startswith(ROLE_PREFIX)


def folder_of(name: str) -> str:
    return f"{constants.PARAMETRIC_DIR}/{name}"


@dataclass(frozen=True)
class AdapterInfo:
    """One adapter as its files describe it (a claim until checked against a base)."""

    name: str
    folder: str
    peft_type: str
    rank: int
    lora_alpha: Any
    target_modules: Any  # a sorted list of names, or a regex string (PEFT's two forms)
    claimed_base: str | None
    dtype: str
    fan_in_fan_out: bool
    #: module -> {"kind": linear | embedding, "rank", "in", "out"} implied by the tensors
    modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


def adapter_folders(files: list[str]) -> dict[str, str]:
    """name -> folder of each adapter among a cube's ``files``; a download's bookkeeping
    (the file-set rule's: ``hf download --local-dir`` keeps a ``.metadata`` and a ``.lock``
    per file there, named after it) is no adapter file, wherever it names one.

    Raises:
        FormatError: a file directly in ``parametric/``, an adapter folder lacking one of
            PEFT's two files, a name that is not a plain name, or PEFT files anywhere else
            (an adapter outside ``parametric/<name>/`` would ship unpinned).
    """
    names: dict[str, set[str]] = {}
    for path in files:
        if is_bookkeeping(path):
            continue
        parts = path.split("/")
        base = parts[-1]
        peft_file = base == constants.ADAPTER_CONFIG or base.startswith("adapter_model")
        if parts[0] == constants.PARAMETRIC_DIR:
            if len(parts) < 3:
                raise FormatError(f"{path} sits directly in {constants.PARAMETRIC_DIR}/; each "
                                  f"adapter is a folder {constants.PARAMETRIC_DIR}/NAME/ holding "
                                  f"{constants.ADAPTER_CONFIG} and {constants.ADAPTER_WEIGHTS}.")
            names.setdefault(parts[1], set())
            if len(parts) == 3:
                names[parts[1]].add(base)
                if base.startswith("adapter_model") and base != constants.ADAPTER_WEIGHTS:
                    raise FormatError(f"{path}: an adapter's weights are one "
                                      f"{constants.ADAPTER_WEIGHTS} (safetensors), not {base}.")
                continue
        if peft_file:
            raise FormatError(f"{path} is a PEFT adapter file outside "
                              f"{constants.PARAMETRIC_DIR}/NAME/, so nothing pins it to a base "
                              f"model; move its folder to {constants.PARAMETRIC_DIR}/NAME/.")
    for name, present in names.items():
        if not _NAME.fullmatch(name):
            raise FormatError(f"{constants.PARAMETRIC_DIR}/{name}/: an adapter's name must be "
                              "a plain name (letters, digits, '.', '_', '-').")
        lacking = [f for f in (constants.ADAPTER_CONFIG, constants.ADAPTER_WEIGHTS)
                   if f not in present]
        if lacking:
            raise FormatError(f"{folder_of(name)}/ lacks {' and '.join(lacking)}; an adapter is "
                              "PEFT's layout (save it with PeftModel.save_pretrained).")
    return {name: folder_of(name) for name in sorted(names)}


# --- reading an adapter ----------------------------------------------------------------------

def read_adapter(cube: Path, name: str) -> AdapterInfo:
    """Read ``parametric/<name>/``'s config and safetensors header (no tensor bytes).

    Raises:
        FormatError: a malformed config or header, LoRA tensors that do not pair up or whose
            rank contradicts the config.
        UnsupportedError: not a LoRA adapter, or one that replaces base weights or rewrites
            them at load (``modules_to_save``, ``pissa`` initialisation...).
    """
    folder = folder_of(name)
    where = f"Adapter {name!r} ({folder}/)"
    config_path = resolve_inside(cube, f"{folder}/{constants.ADAPTER_CONFIG}")
    try:
        config = canonical.loads_strict(config_path.read_bytes())
    except ValueError as exc:
        raise FormatError(f"{where}: {constants.ADAPTER_CONFIG} is not valid JSON: {exc}") from exc
    header = read_header(resolve_inside(cube, f"{folder}/{constants.ADAPTER_WEIGHTS}"))
    return adapter_info(name, config, header)


def adapter_info(name: str, config: Any, header: Header) -> AdapterInfo:
    """:func:`read_adapter` from a parsed config and header (pure)."""
    where = f"Adapter {name!r} ({folder_of(name)}/)"
    if not isinstance(config, dict):
        raise FormatError(f"{where}: {constants.ADAPTER_CONFIG} must hold a JSON object.")
    if config.get("peft_type") != "LORA":
        raise UnsupportedError(f"{where} is a {config.get('peft_type')!r} PEFT adapter; cubepack "
                               "pins LoRA adapters (peft_type LORA) only.")
    rank = config.get("r")
    if type(rank) is not int or rank <= 0:
        raise FormatError(f"{where}: r must be a positive integer, found {rank!r}.")
    alpha = config.get("lora_alpha", 8)
    if type(alpha) not in (int, float):
        raise FormatError(f"{where}: lora_alpha must be a number, found {alpha!r}.")
    targets = config.get("target_modules")
    if isinstance(targets, list) and all(isinstance(t, str) for t in targets) and targets:
        targets = sorted(set(targets))
    elif not isinstance(targets, str) or not targets:
        raise FormatError(f"{where}: target_modules must be a list of module names or a regex, "
                          f"found {targets!r}.")
    init = config.get("init_lora_weights", True)
    if not any(init is safe or (isinstance(init, str) and init == safe) for safe in SAFE_INITS):
        raise UnsupportedError(
            f"{where} has init_lora_weights {init!r}: PEFT runs that initialisation when it loads "
            "the adapter, rewriting the base model's weights (or needing data), so the base "
            "would no longer be the pinned one. Convert it to a plain LoRA adapter (PEFT's "
            "save_pretrained(..., path_initial_model_for_weight_conversion=...)) and pack again.")
    for key, value in sorted(config.items()):
        if key not in UNDERSTOOD and not any(value is off or value == off for off in _OFF):
            raise UnsupportedError(f"{where} sets {key} ({str(value)[:80]}): cubepack applies "
                                   "plain LoRA deltas to existing modules only, and this setting "
                                   "replaces or adds base-model weights, changes the "
                                   "architecture, or is one cubepack does not read; save the "
                                   "adapter without it.")
    if not isinstance(config.get("use_rslora", False), bool):
        raise FormatError(f"{where}: use_rslora must be true or false.")
    if config.get("bias", "none") != "none":
        raise UnsupportedError(f"{where} sets bias {config['bias']!r}: its bias tensors "
                               "replace the base model's; save it with bias='none'.")
    for key in ("rank_pattern", "alpha_pattern"):
        if not isinstance(config.get(key) or {}, dict):
            raise FormatError(f"{where}: {key} must be an object.")
    # Every pattern PEFT will match (when the adapter is applied, with Python's unbounded re)
    # must have a shape that cannot backtrack without bound: checked here, at read.
    for key, value in _regexes(config):
        patterns.check_shape(value, where=f"{where}: {key}")
    fan_in_fan_out = config.get("fan_in_fan_out", False)
    if not isinstance(fan_in_fan_out, bool):
        raise FormatError(f"{where}: fan_in_fan_out must be true or false.")
    claimed = config.get("base_model_name_or_path")
    modules, dtypes = _modules(where, header)
    for module, entry in sorted(modules.items()):
        checkpoint(f"the rank_pattern of module {module}")
        expected = _pattern_rank(where, config.get("rank_pattern") or {}, module, rank)
        if entry["rank"] != expected:
            raise FormatError(f"{where}: the tensors of {module} have rank {entry['rank']}, but "
                              f"{constants.ADAPTER_CONFIG} says r={expected} for it (r, or "
                              "its rank_pattern): PEFT would build a layer of another shape.")
    # PEFT initialises a DoRA magnitude or a lora_B bias the file lacks (from random LoRA
    # weights, with init_lora_weights false), and ignores one its config does not ask for.
    for flag, part, what in (("use_dora", "magnitude", "lora_magnitude_vector"),
                             ("lora_bias", "B.bias", "lora_B.bias")):
        wanted = config.get(flag, False)
        if not isinstance(wanted, bool):
            raise FormatError(f"{where}: {flag} must be true or false.")
        for module, entry in sorted(modules.items()):
            if entry["kind"] == "linear" or part == "magnitude":
                if (part in entry["parts"]) != wanted:
                    raise FormatError(
                        f"{where}: {module} {'lacks' if wanted else 'has'} a {what} tensor but "
                        f"{constants.ADAPTER_CONFIG} sets {flag} {str(wanted).lower()}: PEFT "
                        f"would {'initialise it afresh' if wanted else 'ignore it'}.")
    return AdapterInfo(name=name, folder=folder_of(name), peft_type="LORA", rank=rank,
                       lora_alpha=alpha, target_modules=targets,
                       claimed_base=claimed if isinstance(claimed, str) and claimed else None,
                       dtype=sorted(dtypes)[0] if len(dtypes) == 1 else "mixed",
                       fan_in_fan_out=fan_in_fan_out, modules=modules, config=config)


def _regexes(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, pattern) of every regular expression PEFT reads from a LoRA config."""
    found = [(f"{key} key", pattern) for key in ("rank_pattern", "alpha_pattern")
             for pattern in (config.get(key) or {})]
    for key in ("target_modules", "exclude_modules"):
        if isinstance(config.get(key), str) and config[key] != "all-linear":
            found.append((key, config[key]))
    layers = config.get("layers_pattern")
    found += [("layers_pattern", pattern) for pattern in
              ([layers] if isinstance(layers, str) else layers if isinstance(layers, list) else [])
              if isinstance(pattern, str)]
    return found


def _pattern_rank(where: str, pattern: dict[str, Any], module: str, rank: int) -> int:
    """The rank PEFT gives ``module``: the first ``rank_pattern`` key matching the end of its
    name (PEFT's ``get_pattern_key``), else ``r``."""
    for key, value in pattern.items():
        if patterns.match(rf"(.*\.)?({key})$", module, where=f"{where}: rank_pattern key"):
            if type(value) is not int or value <= 0:
                raise FormatError(f"{where}: rank_pattern {key!r} must be a positive integer.")
            return value
    return rank


def _modules(where: str, header: Header) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """module -> kind, rank, in, out, from the LoRA tensors' names and shapes."""
    parts: dict[str, dict[str, tuple[int, ...]]] = {}
    dtypes = set()
    for tensor_name, tensor in header.tensors.items():
        key = tensor_name.removeprefix(_PEFT_PREFIX)
        found = next(((key[: -len(suffix)], part) for suffix, part in _PARTS
                      if key.endswith(suffix)), None)
        if not tensor_name.startswith(_PEFT_PREFIX) or found is None:
            raise UnsupportedError(
                f"{where}: tensor {tensor_name!r} is not a LoRA weight (lora_A, lora_B, "
                "lora_embedding_A/B, lora_magnitude_vector)"
                + ("; it is a base-model weight the adapter would replace (saved with "
                   "save_embedding_layers): save the adapter with save_embedding_layers=False"
                   if ".base_layer." in tensor_name else "")
                + ". cubepack pins adapters that only add low-rank deltas to a base.")
        module, part = found
        parts.setdefault(module, {})[part] = tensor.shape
        dtypes.add(tensor.dtype_name)
    if not parts:
        raise FormatError(f"{where}: {constants.ADAPTER_WEIGHTS} holds no LoRA tensors.")
    modules = {}
    for module, shapes in sorted(parts.items()):
        linear = "A" in shapes or "B" in shapes
        first, second = ("A", "B") if linear else ("embedding_A", "embedding_B")
        if first not in shapes or second not in shapes or (linear and (
                "embedding_A" in shapes or "embedding_B" in shapes)):
            raise FormatError(f"{where}: {module} has LoRA tensors {sorted(shapes)}; a LoRA "
                              f"module has exactly one lora_{first[-1]} and one lora_{second[-1]}.")
        a, b = shapes[first], shapes[second]
        if len(a) != 2 or len(b) != 2 or a[0] != b[1]:
            raise FormatError(f"{where}: {module}'s {first} {list(a)} and {second} {list(b)} "
                              "do not share a rank (A is (r, in), B is (out, r)).")
        entry = {"kind": "linear" if linear else "embedding", "rank": a[0], "in": a[1],
                 "out": b[0], "parts": sorted(shapes)}
        for extra in ("B.bias", "magnitude"):
            if extra in shapes and shapes[extra] != (b[0],):
                raise FormatError(f"{where}: {module}'s {extra} has shape {list(shapes[extra])}, "
                                  f"not [{b[0]}] (its out_features).")
        modules[module] = entry
    return modules, dtypes


# --- the base: shapes and coverage -----------------------------------------------------------

def expected_base_shape(info: AdapterInfo, entry: dict[str, Any]) -> list[int]:
    """The weight shape of the base module an adapter module implies: Linear ``(out, in)``
    (``(in, out)`` for a ``fan_in_fan_out`` Conv1D), Embedding ``(num_embeddings, dim)``."""
    if entry["kind"] == "embedding":
        return [entry["in"], entry["out"]]
    return [entry["in"], entry["out"]] if info.fan_in_fan_out else [entry["out"], entry["in"]]


def shape_mismatches(info: AdapterInfo, shapes: dict[str, tuple[int, ...]]) -> list[Mismatch]:
    """Every adapted module that is absent from the base (``shapes``: its weight tensors'
    names -> shapes) or whose weight shape the LoRA tensors contradict, then every module the
    config targets in the base that has no tensors (PEFT would initialise it afresh), and every
    tensor for a module the config does not target (PEFT would ignore it)."""
    problems = []
    for module, entry in sorted(info.modules.items()):
        found = shapes.get(module + ".weight")
        expected = expected_base_shape(info, entry)
        if found is None:
            problems.append(Mismatch(f"module {module}", f"a weight of shape {expected}",
                                     "absent from the base model"))
        elif list(found) != expected:
            a, b = ("lora_A", "lora_B") if entry["kind"] == "linear" else \
                ("lora_embedding_A", "lora_embedding_B")
            problems.append(Mismatch(
                f"module {module}", f"a base weight {expected} ({a} [{entry['rank']}, "
                f"{entry['in']}], {b} [{entry['out']}, {entry['rank']}])", f"{list(found)}"))
    targeted = targeted_modules(info.config, shapes)
    if targeted is not None:
        for module in sorted(targeted - set(info.modules)):
            problems.append(Mismatch(f"module {module}", "LoRA tensors (target_modules selects "
                                     "it in the base)", "none in the adapter"))
        for module in sorted(set(info.modules) - targeted):
            if module + ".weight" in shapes:
                problems.append(Mismatch(f"module {module}", "a module target_modules selects",
                                         "tensors for a module it does not select (PEFT "
                                         "would ignore them)"))
    return problems


def targeted_modules(config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> set[str] | None:
    """The base modules (with a 2-D weight) PEFT would adapt under ``config``, by PEFT's rule
    (a regex string must match the whole module name; a list entry must equal it or its last
    dotted part(s)); None when the config selects modules in a way cubepack does not compute
    (``all-linear``, ``layers_to_transform``): the shape check still runs."""
    targets, excluded = config.get("target_modules"), config.get("exclude_modules")
    if targets == "all-linear" or config.get("layers_to_transform") is not None \
            or not isinstance(excluded, (list, str, type(None))):
        return None
    candidates = [name[: -len(".weight")] for name, shape in shapes.items()
                  if name.endswith(".weight") and len(shape) == 2]
    return {name for name in candidates
            if checkpoint(f"the target_modules of {name}") is None
            and _selects(targets, name, "target_modules")
            and not (excluded and _selects(excluded, name, "exclude_modules"))}


def _selects(selection: Any, module: str, where: str) -> bool:
    if isinstance(selection, str):
        return patterns.fullmatch(selection, module, where=where)
    return any(module == p or module.endswith("." + p) for p in selection)


def literal_config(config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """``config`` with every pattern PEFT would match replaced by what cubepack's bounded
    matcher found it selects on this base (``shapes``): ``target_modules`` the list of module
    names, ``rank_pattern`` / ``alpha_pattern`` keyed by each matching module's escaped full
    name, ``exclude_modules`` applied and dropped. PEFT then matches literals only, never a
    pattern the cube's author wrote (its ``re`` has no bound); what it builds is the same.
    A config that selects modules another way (``all-linear``, ``layers_to_transform``) keeps
    its selection, refused by shape at read if it could backtrack."""
    import re as _re

    literal = dict(config)
    targets = targeted_modules(config, shapes)
    if targets is None:
        return literal
    literal["target_modules"] = sorted(targets)
    literal.pop("exclude_modules", None)
    for key in ("rank_pattern", "alpha_pattern"):
        pattern = config.get(key) or {}
        resolved = {}
        for module in sorted(targets):
            checkpoint(f"{key} of module {module}")
            for patt, value in pattern.items():  # PEFT's get_pattern_key: the first that ends it
                if patterns.match(rf"(.*\.)?({patt})$", module, where=f"{key} key"):
                    resolved[_re.escape(module)] = value
                    break
        literal[key] = resolved
    return literal


def folder_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """A model folder's weight tensors' shapes, from their safetensors headers.

    Raises:
        UnsupportedError: its weights are not safetensors (reading a pickle's shapes would
            mean unpickling it).
    """
    files = weight_files(folder)
    if not files or any(path.suffix != ".safetensors" for path in files):
        raise UnsupportedError(f"{folder}'s weights are not safetensors, so cubepack cannot read "
                               "their shapes to check an adapter against them (it never "
                               "unpickles); save the base with safe_serialization=True.")
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        shapes.update({name: t.shape for name, t in read_header(path).tensors.items()})
    return shapes


def model_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """A loaded model's parameter and buffer shapes, by their state-dict names (the names its
    safetensors files use)."""
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


# --- the lock's entry ------------------------------------------------------------------------

def adapter_digest(config_sha256: str, weights_sha256: str) -> str:
    """The adapter's own digest: the same definition as a model folder's ``adapters`` field, so
    it equals what :func:`cubepack.fingerprint` reports for the folder PEFT saved."""
    return digest_of_file_hashes([(constants.ADAPTER_CONFIG, config_sha256),
                                  (constants.ADAPTER_WEIGHTS, weights_sha256)])


def lock_entry(info: AdapterInfo, digests: dict[str, str], base_shapes: dict[str, list[int]],
               base: dict[str, Any]) -> dict[str, Any]:
    """The lock's ``adapters`` entry of one adapter. ``base``: how pack found the base (its
    ``source`` and the config's ``claimed`` name, a claim only)."""
    config_file = f"{info.folder}/{constants.ADAPTER_CONFIG}"
    weights_file = f"{info.folder}/{constants.ADAPTER_WEIGHTS}"
    return {
        "path": info.folder, "config_file": config_file, "weights_file": weights_file,
        "digest": adapter_digest(digests[config_file], digests[weights_file]),
        "peft_type": info.peft_type, "rank": info.rank, "lora_alpha": info.lora_alpha,
        "target_modules": info.target_modules, "dtype": info.dtype,
        "model_role": role(info.name),
        **scaling(info.config),
        "modules": {module: {"kind": entry["kind"], "rank": entry["rank"],
                             "shape": base_shapes[module]}
                    for module, entry in sorted(info.modules.items())},
        "base": base,
    }


def scaling(config: dict[str, Any]) -> dict[str, Any]:
    """What scales each LoRA delta beside ``lora_alpha`` (recorded in a version-4 lock entry):
    per-module ranks and alphas (``rank_pattern``, ``alpha_pattern``) and rsLoRA's
    ``alpha / sqrt(r)`` (``use_rslora``)."""
    return {"rank_pattern": dict(config.get("rank_pattern") or {}),
            "alpha_pattern": dict(config.get("alpha_pattern") or {}),
            "use_rslora": bool(config.get("use_rslora", False))}


def _plain(value: Any) -> Any:
    """A typed entry's value as the lock's JSON holds it (a tuple is a list, a mapping a
    dict), to compare with what a file says and to report."""
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return value


def entry_mismatches(entry: Adapter, info: AdapterInfo) -> list[Mismatch]:
    """Where the lock's entry disagrees with what the adapter's files say (pure); the scaling
    keys when the entry records them (a version-4 lock)."""
    recorded_facts = {"peft_type": entry.peft_type, "rank": entry.rank,
                      "lora_alpha": entry.lora_alpha, "target_modules": entry.target_modules,
                      "dtype": entry.dtype, "rank_pattern": entry.rank_pattern,
                      "alpha_pattern": entry.alpha_pattern, "use_rslora": entry.use_rslora}
    problems = [Mismatch(key, _plain(recorded_facts[key]), getattr(info, key))
                for key in ("peft_type", "rank", "lora_alpha", "target_modules", "dtype")
                if _plain(recorded_facts[key]) != getattr(info, key)]
    problems += [Mismatch(key, _plain(recorded_facts[key]), value)
                 for key, value in scaling(info.config).items()
                 if recorded_facts[key] is not None and _plain(recorded_facts[key]) != value]
    if sorted(entry.modules) != sorted(info.modules):
        problems.append(Mismatch("modules", sorted(entry.modules), sorted(info.modules)))
        return problems
    for module, fit in sorted(entry.modules.items()):
        live = info.modules[module]
        implied = expected_base_shape(info, live)
        recorded = {"kind": fit.kind, "rank": fit.rank, "shape": list(fit.shape)}
        if (fit.kind, fit.rank, list(fit.shape)) != (live["kind"], live["rank"], implied):
            problems.append(Mismatch(f"modules.{module}", recorded,
                                     {"kind": live["kind"], "rank": live["rank"],
                                      "shape": implied}))
    return problems


# --- pinning the base at pack ----------------------------------------------------------------

def resolve_base(info: AdapterInfo, given: Any, remembered: Pin | None
                 ) -> tuple[Any, str | None, str]:
    """(the base to fingerprint, its revision, how it was chosen): ``given`` (pack's
    ``adapter_base``), else the pin the cube's last pack recorded, else the config's claim.

    Raises:
        UsageError: nothing names a base.
    """
    if given is not None:
        source, revision = "--adapter-base", None
        if isinstance(given, str) and not Path(given).expanduser().exists() and "@" in given:
            given, revision = given.rsplit("@", 1)
        return given, revision, source
    if remembered is not None and remembered.repo_id and remembered.revision:
        return remembered.repo_id, remembered.revision, "the last pack's pin"
    if info.claimed_base:
        return info.claimed_base, None, "adapter_config.json's base_model_name_or_path"
    raise UsageError(f"Adapter {info.name!r}'s {constants.ADAPTER_CONFIG} names no base model; "
                     "say which model it adapts: cubepack pack CUBE --adapter-base MODEL.")


def pin_base(info: AdapterInfo, given: Any, remembered: Pin | None
             ) -> tuple[dict[str, Any], dict[str, list[int]], dict[str, Any]]:
    """Fingerprint the adapter's base and check the adapter against it: (the pin, the base
    shapes of the adapted modules, how the base was found).

    Raises:
        ModelNotFoundError: the base cannot be found (for a claimed name: pass --adapter-base).
        IdentityMismatch: a module absent from the base, or shapes that disagree, each named
            with expected and found.
    """
    base, revision, source = resolve_base(info, given, remembered)
    try:
        if isinstance(base, (str, Path)):
            folder, _, _ = resolve_model_folder(str(base), revision)
            identity = fingerprint(str(base), revision=revision)
            shapes = folder_shapes(folder)
        else:
            identity = fingerprint(base)
            shapes = model_shapes(base)
    except (ModelNotFoundError, UsageError, HubError) as exc:  # HubError: not on the Hub
        if source.startswith("adapter_config"):
            raise ModelNotFoundError(
                f"Adapter {info.name!r}'s {constants.ADAPTER_CONFIG} names its base "
                f"{info.claimed_base!r}, which cannot be found here ({exc}). That name is a "
                "claim: pass the base explicitly, cubepack pack CUBE --adapter-base MODEL "
                "(a folder or a Hub id).") from exc
        raise
    problems = shape_mismatches(info, shapes)
    if problems:
        raise IdentityMismatch(
            f"Adapter {info.name!r} ({info.folder}/)", problems,
            "Pass --adapter-base with the model the adapter was trained on.",
            finding=f"does not fit the base {base} ({source})")
    name = str(base) if isinstance(base, (str, Path)) else \
        (identity.model_id or getattr(base, "name_or_path", None))
    pin = {"name": name, "strict": True, "repo_id": identity.model_id if identity.revision
           else None, "revision": identity.revision, "identity": identity.pinned()}
    base_shapes = {module: list(shapes[module + ".weight"]) for module in info.modules}
    how = {"source": source, BASE_CLAIM: info.claimed_base}
    return pin, base_shapes, how


def check_live_base(name: str, entry: Adapter, pin: Pin, live: Any,
                    shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse a base (``live``: its identity; ``shapes``: its weight shapes) the adapter was
    not pinned to, naming every differing field: the pin's strict fields (weights digest,
    dtype, geometry...), then each module whose shape differs.

    Raises:
        IdentityMismatch: the base is not the pinned one.
    """
    assert pin.identity is not None  # an adapter's base is a strict pin (the lock's rule)
    problems = compare(pin.identity, live)
    for module, fit in sorted(entry.modules.items()):
        found = shapes.get(module + ".weight")
        if found is None or list(found) != list(fit.shape):
            problems.append(Mismatch(f"module {module}", list(fit.shape),
                                     list(found) if found is not None else "absent"))
    if problems:
        where = f"{pin.repo_id}@{pin.revision}" if pin.revision else \
            "a local folder, by weights digest"
        raise IdentityMismatch(
            f"Adapter {name!r} ({entry.path}/)", problems,
            "Apply it to the base it was packed for (the same weights, in the same dtype), or "
            "pack it again for this base if it was trained on it.",
            finding=f"is pinned to another base ({where})")


def describe_entry(entry: Adapter, pin: Pin | None) -> str:
    """One line about an adapter: type, rank, targets, base."""
    base = (f"{pin.repo_id}@{pin.revision}" if pin is not None and pin.revision
            else f"weights {pin.identity.weights_digest if pin and pin.identity else None}")
    targets = entry.target_modules if isinstance(entry.target_modules, str) else \
        ", ".join(entry.target_modules)
    return (f"{entry.peft_type} r={entry.rank} on {len(entry.modules)} modules "
            f"({targets}); base {base}")


def memory_files(files: list[str]) -> list[str]:
    """The cube files that belong to adapters (for ``cubepack.yaml``'s memories)."""
    return sorted(f for f in files if PurePosixPath(f).parts[:1] == (constants.PARAMETRIC_DIR,))
