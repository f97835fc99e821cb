"""What a MemOS cube folder holds, read from its ``config.json``. Pure logic, no MemOS import.

MemOS's ``GeneralMemCube.dump`` writes ``config.json`` plus one file per initialised memory
(``textual_memory.json``, ``activation_memory.pickle``, ``parametric_memory.adapter``,
``preference_memory.json``...). The producer of activation memories is the ``act_mem``
extractor LLM; textual memories name an extractor LLM and an embedder.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._util import constants
from .._util.canonical import LimitError, loads_strict, walk_containers
from ..errors import CubepackError

#: Model roles, as the lock and cubepack.yaml name them: ``act_mem``, the activation producer
#: (strict), and ``<memory type>.<key>`` for every other model a memory type's config names
#: (``text_mem.extractor_llm``, ``text_mem.embedder``, ``para_mem.extractor_llm``,
#: ``pref_mem.embedder``...: informational), found by :func:`roles`, not listed.
ACT_ROLE = "act_mem"
KV_BACKENDS = ("kv_cache", "vllm_kv_cache")
DEFAULT_FILENAMES = {
    "text_mem": "textual_memory.json",
    "act_mem": "activation_memory.pickle",
    "para_mem": "parametric_memory.adapter",
    # MemOS 2.0.x's preference memory inherits the text memory's default name (its config
    # class is a text memory config): two memories at their defaults write one file, which
    # the preference kind refuses (kinds/preferences/_dump.filename_collision).
    "pref_mem": "textual_memory.json",
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


def roles(config: dict[str, Any]) -> list[str]:
    """Every model role ``config`` names, the activation producer first: each key of each
    memory type's config (:data:`MEMORY_KINDS`) that holds a model factory (``backend`` and a
    ``config`` naming ``model_name_or_path`` or ``model``). Swept from the document, so a
    memory type's new model key (MemOS's preference memory, its reranker) is pinned too."""
    found = []
    for memory in MEMORY_KINDS:
        for key, entry in _section(_section(config, memory), "config").items():
            _, name = _llm_name(entry)
            if isinstance(entry, dict) and "backend" in entry and isinstance(name, str):
                role = ACT_ROLE if (memory, key) == ("act_mem", "extractor_llm") \
                    else f"{memory}.{key}"
                found.append(role)
    return sorted(found, key=lambda role: (role != ACT_ROLE, role))


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
    for role in roles(config):
        if role == ACT_ROLE and _section(config, "act_mem").get("backend") not in KV_BACKENDS:
            continue
        backend, name = _llm_name(_role_entry(config, role))
        if name:
            refs.append(ModelRef(role, backend, name, strict=role == ACT_ROLE))
    return refs


#: MemOS backends that load a model's weights in this process (its ``model_name_or_path`` is a
#: folder or Hub id MemOS reads); every other backend sends the name to a server (vLLM, Ollama,
#: an OpenAI-compatible API), which holds the weights.
LOCAL_BACKENDS = frozenset({"huggingface", "huggingface_singleton", "sentence_transformer"})


def role_backend(config: dict[str, Any], role: str) -> str | None:
    """The MemOS backend of a role's LLM or embedder (``huggingface``, ``vllm``...)."""
    backend, _ = _llm_name(_role_entry(config, role))
    return backend if isinstance(backend, str) else None


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
    config_file = constants.MEMOS_CONFIG
    result: dict[str, list[str]] = {"config": [config_file] if config_file in present else []}
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


# --- settings that run code ----------------------------------------------------------------------

#: Keys that make the library building a model run Python code from the model's repository (or
#: choose which code): transformers' and sentence-transformers' ``trust_remote_code``, the
#: ``code_revision`` that picks the code's commit, and ``auto_map``, which names the classes in
#: that code. MemOS 2.0.33 passes ``trust_remote_code`` to ``SentenceTransformer`` (default
#: true) and forbids the others as unknown fields, but a cube is read by whichever MemOS its
#: user runs, so each is refused wherever it appears. Backends are looked up in MemOS's fixed
#: tables (never imported by name) and ``model_schema`` is reset by MemOS: neither runs code.
CODE_KEYS = ("trust_remote_code", "code_revision", "auto_map")
#: MemOS backends whose config defaults ``trust_remote_code`` to true when it is absent.
REMOTE_CODE_BY_DEFAULT = ("sentence_transformer",)
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class CodeSetting:
    """A setting in a MemOS config that would run (or choose) code from a model's repository:
    its JSON path (``text_mem.config.embedder.config.trust_remote_code``), what was found, and
    the change that removes it."""

    path: str
    found: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path} ({self.found}; {self.fix})"


def dotted(path: tuple[Any, ...]) -> str:
    """A path of keys and indices as MemOS's configs nest: ``act_mem.config.extractor_llm``,
    list items as ``[0]``, a key that is not a plain name quoted (``["a.b"]``)."""
    text = ""
    for key in path:
        if isinstance(key, int):
            text += f"[{key}]"
        elif _PLAIN_KEY.fullmatch(key):
            text += f".{key}" if text else key
        else:
            text += f"[{json.dumps(key)}]"
    return text or "(the document)"


def code_running_settings(config: Any) -> list[CodeSetting]:
    """Every setting in a parsed MemOS config (a cube's ``config.json``) that would make MemOS,
    transformers or sentence-transformers run Python code from a model's repository when MemOS
    builds the cube's models, LLMs and embedders: any :data:`CODE_KEYS` key at any depth
    (``trust_remote_code`` unless it is ``false``; ``code_revision`` and ``auto_map`` unless
    null), and a :data:`REMOTE_CODE_BY_DEFAULT` backend whose config leaves
    ``trust_remote_code`` out (MemOS then passes true). Pure: no I/O, no import of MemOS; the
    walk is bounded (a document nested deeper than the strict reader's limit is one finding,
    never a RecursionError)."""
    found: list[CodeSetting] = []
    try:
        for path, node in walk_containers(config):
            if not isinstance(node, dict):
                continue
            for key in CODE_KEYS:
                if key not in node:
                    continue
                value = node[key]
                if (value is False) if key == "trust_remote_code" else value is None:
                    continue
                fix = "set it to false" if key == "trust_remote_code" else "remove it"
                found.append(CodeSetting(dotted(path + (key,)), _shown(value), fix))
            inner = node.get("config")
            if node.get("backend") in REMOTE_CODE_BY_DEFAULT and isinstance(inner, dict) \
                    and "trust_remote_code" not in inner:
                found.append(CodeSetting(
                    dotted(path + ("config", "trust_remote_code")),
                    f"absent, and MemOS's {node['backend']} backend defaults it to true",
                    'add "trust_remote_code": false'))
    except LimitError as exc:
        where = dotted(getattr(exc, "path", ()))
        found.append(CodeSetting(where if len(where) <= 80 else where[:77] + "...",
                                 f"{exc}, so its settings cannot be checked", "flatten it"))
    return found


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True) if isinstance(
        value, (dict, list, str, int, float, bool, type(None))) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def code_settings_message(settings: list[CodeSetting], where: str, then: str) -> str:
    """One sentence naming every code-running setting of ``where`` (a config.json, or "" when
    the caller names it) and the fix; ``then`` says what to do once it is fixed."""
    shown = "; ".join(str(setting) for setting in settings[:8])
    more = f"; and {len(settings) - 8} more" if len(settings) > 8 else ""
    subject = f"{where} has" if where else "has"
    return (f"{subject} {len(settings)} setting{'s' if len(settings) != 1 else ''} that would "
            f"make MemOS run Python code from a model's repository when it builds the cube's "
            f"models: {shown}{more}. cubepack refuses them; make that change in config.json, "
            f"then {then}.")


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


def memos_config_problems(config: dict[str, Any], files: list[str]) -> list[tuple[str, str]]:
    """(file, why) for each file of ``files`` that MemOS would read with ``pickle.load`` under
    this cube config, by the path MemOS opens whatever the spelling (``./x`` is ``x``): a packed
    cube must hold none (a verified text file named as the activation memory's
    ``memory_filename`` would still be unpickled by plain MemOS). And config.json itself when it
    names a memory file MemOS would open outside the cube, or a setting that would make MemOS
    run code from a model's repository (:func:`~._code_running_settings`)."""
    present = set(files)
    problems = [(opened, f"is named by config.json ({name!r}) as the {backend} activation "
                         "memory, which MemOS reads with pickle.load; a packed cube must not "
                         "hold it")
                for backend, name in pickled_memory_files(config)
                if (opened := opened_path(name)) in present]
    problems += [(constants.MEMOS_CONFIG, f"names the {key} memory file {name!r}, which MemOS "
                  "would open outside the cube")
                 for key, name in escaping_memory_files(config)]
    settings = code_running_settings(config)
    if settings:
        problems.append((constants.MEMOS_CONFIG, code_settings_message(
            settings, "", "pack the cube again (or ask its publisher to)")))
    return problems


def read_config(cube: Path, names: list[str]) -> dict[str, Any]:
    """MemOS's ``config.json`` of a cube whose files were checked already (``names``: the ones
    that may be read), as strict JSON; {} when it holds none or it is not an object."""
    if constants.MEMOS_CONFIG not in names:
        return {}
    config = loads_strict((cube / constants.MEMOS_CONFIG).read_bytes())
    return config if isinstance(config, dict) else {}


def rename_model(inner: dict[str, Any] | None, name: str) -> None:
    """Name ``name`` as the model of a role's settings ``inner`` (``llm_config``'s), under the
    key MemOS reads there (``model`` where only that is set, else ``model_name_or_path``)."""
    if inner is None:
        return
    key = "model" if "model" in inner and "model_name_or_path" not in inner \
        else "model_name_or_path"
    inner[key] = name
