"""What a MemOS cube folder holds, read from its ``config.json``. Pure logic, no MemOS import.

MemOS's ``GeneralMemCube.dump`` writes ``config.json`` plus one file per initialised memory
(``textual_memory.json``, ``activation_memory.pickle``, ``parametric_memory.adapter``,
``preference_memory.json``...). The producer of activation memories is the ``act_mem``
extractor LLM; textual memories name an extractor LLM and an embedder.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from ..errors import CubepackError

#: Model roles, as the lock and cubepack.yaml name them: the activation producer (strict) and
#: the textual memory's extractor and embedder (informational).
ACT_ROLE = "act_mem"
TEXT_ROLES = ("text_mem.extractor_llm", "text_mem.embedder")
ROLES = (ACT_ROLE, *TEXT_ROLES)
KV_BACKENDS = ("kv_cache", "vllm_kv_cache")
DEFAULT_FILENAMES = {
    "text_mem": "textual_memory.json",
    "act_mem": "activation_memory.pickle",
    "para_mem": "parametric_memory.adapter",
    "pref_mem": "preference_memory.json",
}
MEMORY_KINDS = {"text_mem": "textual", "act_mem": "activation", "para_mem": "parametric",
                "pref_mem": "preference"}


@dataclass(frozen=True)
class ModelRef:
    """A model named in config.json: its role, backend and the name MemOS would load."""

    role: str
    backend: str | None
    name: str
    strict: bool  # activations depend on it exactly


def _section(config: dict[str, Any], key: str) -> dict[str, Any]:
    section = config.get(key)
    return section if isinstance(section, dict) else {}


def _llm_name(llm: Any) -> tuple[str | None, str | None]:
    if not isinstance(llm, dict):
        return None, None
    inner = llm.get("config") if isinstance(llm.get("config"), dict) else {}
    name = inner.get("model_name_or_path") or inner.get("model")
    return llm.get("backend"), name


def _role_entry(config: dict[str, Any], role: str) -> Any:
    """The ``{"backend": ..., "config": {...}}`` entry of a role inside a MemOS config dict."""
    if role == ACT_ROLE:
        return _section(_section(config, "act_mem"), "config").get("extractor_llm")
    section, _, key = role.partition(".")
    return _section(_section(config, section), "config").get(key)


def llm_config(config: dict[str, Any], role: str) -> dict[str, Any] | None:
    """The inner config dict (``model_name_or_path``...) of a role's LLM or embedder; editing
    it edits ``config``."""
    entry = _role_entry(config, role)
    inner = entry.get("config") if isinstance(entry, dict) else None
    return inner if isinstance(inner, dict) else None


def model_refs(config: dict[str, Any]) -> list[ModelRef]:
    """Every model the cube's config names, the activation producer first."""
    refs = []
    for role in ROLES:
        if role == ACT_ROLE and _section(config, "act_mem").get("backend") not in KV_BACKENDS:
            continue
        backend, name = _llm_name(_role_entry(config, role))
        if name:
            refs.append(ModelRef(role, backend, name, strict=role == ACT_ROLE))
    return refs


def act_backend(config: dict[str, Any]) -> str | None:
    return _section(config, "act_mem").get("backend")


def act_model_name(config: dict[str, Any]) -> str | None:
    """The model name config.json gives the activation producer (its extractor LLM)."""
    _, name = _llm_name(_role_entry(config, ACT_ROLE))
    return name if isinstance(name, str) and name else None


def opened_path(name: Any) -> str | None:
    """The cube path MemOS opens for a config ``memory_filename`` (``os.path.join(dir, name)``):
    ``./x`` and ``a/../x`` open ``x``; None when it opens something outside the cube (an
    absolute path, ``..``). Every rule about a config-named file goes through this, so another
    spelling of a name cannot slip past it."""
    if not isinstance(name, str) or not name or "\x00" in name:
        return None
    if name.startswith(("/", "~")):
        return None
    normal = posixpath.normpath(name)
    if normal in (".", "..") or normal.startswith("../"):
        return None
    return normal


def named_memory_files(config: dict[str, Any]) -> dict[str, str]:
    """Memory key -> the ``memory_filename`` config.json gives it (or MemOS's default), as
    written, for every memory kind."""
    names = {}
    for key in MEMORY_KINDS:
        name = _section(_section(config, key), "config").get("memory_filename")
        names[key] = name if isinstance(name, str) and name else DEFAULT_FILENAMES[key]
    return names


def activation_pickle_name(config: dict[str, Any]) -> str:
    name = named_memory_files(config)["act_mem"]
    return opened_path(name) or name


def pickled_memory_files(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(backend, file name) of every memory MemOS loads with ``pickle.load``: the activation
    memory of the kv_cache and vllm_kv_cache backends (MemOS 2.0.x)."""
    backend = _section(config, "act_mem").get("backend")
    return [(backend, named_memory_files(config)["act_mem"])] if backend in KV_BACKENDS else []


def memory_files(config: dict[str, Any], files: list[str]) -> dict[str, list[str]]:
    """Which of ``files`` hold which memory kind (config file, textual, parametric...), by the
    path MemOS opens (see :func:`opened_path`)."""
    present = set(files)
    result: dict[str, list[str]] = {"config": ["config.json"] if "config.json" in present else []}
    for key, name in named_memory_files(config).items():
        if key == "act_mem":
            continue
        opened = opened_path(name)
        result[MEMORY_KINDS[key]] = [opened] if opened in present else []
    return result


def escaping_memory_files(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(memory key, name) of each config-named memory file MemOS would open outside the cube."""
    return [(key, name) for key, name in named_memory_files(config).items()
            if opened_path(name) is None]


def is_hub_loadable(backend: str | None) -> bool:
    """Backends whose model name is a Hugging Face folder or repo id we can fingerprint."""
    return backend in (None, "huggingface", "huggingface_singleton", "vllm", "sentence_transformer")


def memos_prompt_ids(tokenizer: Any, source: Any) -> list[int]:
    """The token ids MemOS's ``HFLLM.build_kv_cache`` prefills for ``source`` (its chat-template
    path): a string becomes a system message "Below is some information about the user.\\n...",
    a list of strings is joined with spaces, a list of messages is used as is."""
    if isinstance(source, str):
        messages = [{"role": "system",
                     "content": f"Below is some information about the user.\n{source}"}]
    elif isinstance(source, list) and source and all(isinstance(s, str) for s in source):
        messages = [{"role": "system", "content": "Below is some information about the "
                     f"user.\n{' '.join(source)}"}]
    elif isinstance(source, list) and source and all(isinstance(m, dict) for m in source):
        messages = source
    else:
        raise CubepackError("The activation's source_text is neither text nor chat messages.")
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    return [int(t) for t in tokenizer(prompt)["input_ids"]]



#: Keys cubepack writes beside MemOS's own in an activation's KV-header metadata: the item id,
#: what pack converted it from, its producer label, and the KVCacheItem's ``records`` (the
#: scheduler's text memories, composed text and timestamp).
CUBEPACK_METADATA_KEYS = ("id", "converted_from", "provenance", "records")
#: Where MemOS's metadata goes whole when one of its own keys is named like cubepack's.
WHOLE_METADATA_KEY = "memos_metadata"


def header_metadata(memos_metadata: dict[str, Any], **cubepack: Any) -> dict[str, Any]:
    """An activation's KV-header metadata: MemOS's item metadata, with cubepack's keys beside
    it (None values left out). If MemOS's metadata already uses one of those names, it is kept
    whole under ``memos_metadata`` instead, so a round trip gives it back unchanged."""
    own = {key: value for key, value in cubepack.items() if value is not None}
    if any(key in memos_metadata for key in (*CUBEPACK_METADATA_KEYS, WHOLE_METADATA_KEY)):
        return {**own, WHOLE_METADATA_KEY: memos_metadata}
    return {**memos_metadata, **own}


def item_metadata(header: dict[str, Any]) -> dict[str, Any]:
    """MemOS's item metadata from a KV header's (the inverse of :func:`header_metadata`)."""
    whole = header.get(WHOLE_METADATA_KEY)
    if isinstance(whole, dict):
        return dict(whole)
    return {key: value for key, value in header.items() if key not in CUBEPACK_METADATA_KEYS}
