"""``cubepack.yaml``: the cube's own config, beside MemOS's untouched ``config.json``.

MemOS forbids unknown keys in ``config.json``, so cubepack's pins live here: schema version,
cube id, per model role the pinned repo id, revision, dtype, KV dtype, quantization and weights
digest, which files hold which memory type, and each LoRA adapter (folder, digest, type, rank,
target modules, the role pinning its base). The lock records the same pins with full
identities; ``verify`` checks the two agree. Its ``pack`` mapping holds the settings a pack was
given that every later pack keeps unless told otherwise (a shard's bound): the lock does not
record them, as they decide how a cube is laid out, not what it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from .._util import canonical, constants
from ..errors import FormatError
from .sections import Adapter, Pin


def pin_view(pin: dict[str, Any] | Pin) -> dict[str, Any]:
    """What ``cubepack.yaml`` states of one lock pin (as pack builds it, or as a lock was
    read): the one definition build writes and verify compares, field for field."""
    if isinstance(pin, Pin):
        identity = pin.identity
        return {"repo_id": pin.repo_id, "revision": pin.revision, "strict": pin.strict,
                "dtype": identity and identity.dtype, "kv_dtype": identity and identity.kv_dtype,
                "quantization": identity and identity.quantization,
                "weights_digest": identity and identity.weights_digest}
    identity = pin.get("identity") or {}
    return {"repo_id": pin.get("repo_id"), "revision": pin.get("revision"),
            "strict": bool(pin.get("strict")), "dtype": identity.get("dtype"),
            "kv_dtype": identity.get("kv_dtype"), "quantization": identity.get("quantization"),
            "weights_digest": identity.get("weights_digest")}


#: What ``cubepack.yaml`` states of each adapter entry of the lock.
ADAPTER_VIEW = ("path", "digest", "peft_type", "rank", "target_modules", "model_role")


def adapter_view(entry: dict[str, Any] | Adapter) -> dict[str, Any]:
    if isinstance(entry, Adapter):
        targets = entry.target_modules
        return {"path": entry.path, "digest": entry.digest, "peft_type": entry.peft_type,
                "rank": entry.rank, "model_role": entry.model_role,
                "target_modules": targets if isinstance(targets, str) else list(targets)}
    return {key: entry[key] for key in ADAPTER_VIEW}


#: Each lock section ``cubepack.yaml`` states, and how it shows an entry.
SECTION_VIEWS = {"adapters": adapter_view}


def section_view(key: str, entries: Mapping[str, Any]) -> dict[str, Any]:
    """What ``cubepack.yaml`` states of the section ``key`` (a memory kind's), entry by entry
    (typed entries or the lock's JSON)."""
    return {name: SECTION_VIEWS[key](entry) for name, entry in sorted(entries.items())}


def build(*, cube_id: str | None, models: dict[str, dict[str, Any]],
          memories: dict[str, list[str]],
          adapters: dict[str, dict[str, Any]] | None = None,
          settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "schema_version": constants.CONFIG_SCHEMA_VERSION,
        "cube_id": cube_id,
        "models": {role: pin_view(pin) for role, pin in sorted(models.items())},
        "memories": {kind: paths for kind, paths in sorted(memories.items()) if paths},
    }
    if adapters:  # parametric memory: each adapter's folder, digest, LoRA facts and base role
        config["adapters"] = section_view("adapters", adapters)
    if settings:  # the pack settings a later pack keeps (each kind's own: ``Kind.settings``)
        config[SETTINGS] = dict(sorted(settings.items()))
    return config


#: The key of the pack settings a later pack keeps (``pack: {shard_size: 536870912}``).
SETTINGS = "pack"


def settings(text: str, where: str) -> dict[str, Any]:
    """The pack settings the cube's last ``cubepack.yaml`` (``text``, read from ``where``)
    recorded ({} when it records none). Each kind checks its own values.

    Raises:
        FormatError: the file is not a cubepack.yaml this cubepack reads, or its ``pack`` is
            not a mapping (naming the fix: a later pack would otherwise guess its settings).
    """
    try:
        config = parse(text)
    except FormatError as exc:
        raise FormatError(f"{where}: {exc} pack reads the settings its last pack recorded "
                          f"there ('{SETTINGS}': a shard's bound); fix the file, or remove it "
                          "and pack again with those settings (--shard-size SIZE).") from exc
    recorded = config.get(SETTINGS, {})
    if not isinstance(recorded, dict):
        raise FormatError(f"{where}: '{SETTINGS}' must be a mapping of pack settings, found "
                          f"{recorded!r}; fix it, or remove the key and pack again with those "
                          "settings (--shard-size SIZE).")
    return recorded


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # two roles may share a value; the strict reader refuses aliases


def dumps(config: dict[str, Any]) -> str:
    header = "# Written by cubepack pack; the pins here are checked against cubepack.lock.\n"
    return header + yaml.dump(config, Dumper=_Dumper, sort_keys=True, default_flow_style=False,
                              width=100)


def parse(text: str) -> dict[str, Any]:
    try:
        config = canonical.load_yaml_strict(text)
    except ValueError as exc:
        raise FormatError(f"cubepack.yaml is not valid YAML: {exc}") from exc
    version = config.get("schema_version") if isinstance(config, dict) else None
    if type(version) is not int:  # not 1.0 or true, which Python compares equal to 1
        raise FormatError(f"cubepack.yaml schema_version must be an integer, found {version!r}.")
    if version != constants.CONFIG_SCHEMA_VERSION:
        raise FormatError(f"cubepack.yaml has schema version {version!r}; this cubepack reads "
                          f"version {constants.CONFIG_SCHEMA_VERSION}.")
    if not isinstance(config.get("models"), dict) or not isinstance(config.get("memories"), dict):
        raise FormatError("cubepack.yaml must have 'models' and 'memories' mappings.")
    return config
