"""What identifies a tokenizer: the ids it maps text to, and the prompt format around them.

``tokenizer_digest`` (strict) covers everything that changes the ids a text maps to. It hashes
the canonical ``tokenizer.json`` without the sections that do not change ids or that libraries
rewrite on load (``truncation``, ``padding``, ``decoder``, ``post_processor``) *and* the ids the
tokenizer produces for a fixed probe set, special tokens added, through the ``tokenizers``
library (no torch). The post-processor is thereby normalised rather than dropped: two
post-processors that give the same ids (a rewrite by another library version) give the same
digest, and one that inserts a BOS token does not.

``prompt_format_digest`` (reported as a warning, never a refusal) covers the chat template and
the special tokens: they change future prompts, not an existing cache.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .._util import canonical
from ..errors import CubepackError, FormatError

_VOLATILE_KEYS = ("truncation", "padding", "decoder", "post_processor")
#: Texts whose ids pin the tokenizer's behaviour: plain words, digits, punctuation, whitespace,
#: non-ASCII, an empty string, and a pair (post-processors treat pairs separately).
PROBES = ("The user is a Chinese man who likes green tea.", "", " leading and  double  spaces ",
          "Numbers 0123456789 and punctuation: !?.,;()[]{}", "naïve café 東京 🤖", "\n\tcode()\n")
PAIR = ("Question?", "Answer.")
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token")
#: Tokenizer files of slow (non-``tokenizer.json``) tokenizers, hashed as bytes.
SLOW_TOKENIZER_FILES = ("tokenizer.model", "vocab.json", "merges.txt", "vocab.txt",
                        "spiece.model", "sentencepiece.bpe.model")


def _document(text: str) -> dict[str, Any]:
    try:
        document = canonical.loads_strict(text)
    except ValueError as exc:
        raise FormatError(f"tokenizer.json is not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise FormatError("tokenizer.json must hold a JSON object.")
    return document


def tokenizer_digest_from_json(text: str) -> str:
    """The strict tokenizer digest of a ``tokenizer.json`` text (structure plus probe ids)."""
    from tokenizers import Tokenizer

    document = _document(text)
    structure = {k: v for k, v in document.items() if k not in _VOLATILE_KEYS}
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:
        raise FormatError(f"tokenizer.json cannot be loaded by the tokenizers library: {exc}") \
            from exc
    tokenizer.no_truncation()
    tokenizer.no_padding()
    ids = [tokenizer.encode(probe, add_special_tokens=True).ids for probe in PROBES]
    ids.append(tokenizer.encode(*PAIR, add_special_tokens=True).ids)
    return "sha256:" + canonical.digest({"structure": structure, "probe_ids": ids})


def legacy_tokenizer_digest_v1(text: str) -> str:
    """The tokenizer digest of KV format 1 (structure only), kept to upgrade old files."""
    document = _document(text)
    return "sha256:" + canonical.digest({k: v for k, v in document.items()
                                          if k not in _VOLATILE_KEYS})


def tokenizer_digest_from_object(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None) or tokenizer
    if hasattr(backend, "to_str"):
        return tokenizer_digest_from_json(backend.to_str())
    raise CubepackError(
        f"Cannot fingerprint a {type(tokenizer).__name__} tokenizer: pass a fast tokenizer, or "
        "fingerprint the model folder that holds tokenizer.json."
    )


def prompt_format_from_folder(folder: Path) -> str | None:
    """Digest of the chat template and special tokens a model folder declares, or None."""
    config = _read_json(folder / "tokenizer_config.json")
    specials = _read_json(folder / "special_tokens_map.json")
    specials.update({name: config[name] for name in _SPECIAL_NAMES if name in config})
    template_file = folder / "chat_template.jinja"
    template = (template_file.read_text(encoding="utf-8") if template_file.is_file()
                else config.get("chat_template"))
    if not specials and template is None:
        return None
    return prompt_format_digest(template, specials)


def prompt_format_from_object(tokenizer: Any) -> str:
    specials = dict(getattr(tokenizer, "special_tokens_map", {}) or {})
    return prompt_format_digest(getattr(tokenizer, "chat_template", None), specials)


def prompt_format_digest(template: Any, specials: dict[str, Any]) -> str:
    tokens = {}
    for name in _SPECIAL_NAMES:
        value = specials.get(name)
        if isinstance(value, dict):  # an AddedToken written as a dict
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    return "sha256:" + canonical.digest({"chat_template": canonical.json_safe(template),
                                          "special_tokens": tokens})


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise FormatError(f"{path} is not valid JSON: {exc}") from exc
    return value if isinstance(value, dict) else {}
