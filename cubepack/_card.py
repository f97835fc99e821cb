"""The cube's model card (``README.md``), rendered from ``templates/`` with huggingface_hub.

``DatasetCard.from_template`` validates the YAML front matter the Hub reads: tags (``memcube``,
``memos``, ``kv-cache``), ``base_model`` (the pinned models' repo ids), ``pretty_name`` and the
license when given. The card carries no timestamp, so packing an unchanged cube re-renders it
byte-identically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import CubepackError

TAGS = ["memcube", "memos", "kv-cache", "cubepack"]
MARKER = "<!-- cubepack:card"


def template_path() -> Path:
    """The card template, packaged inside the wheel or at the repository's top level."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates" / "cube_card.md", here.parent / "templates" / "cube_card.md"):
        if candidate.is_file():
            return candidate
    raise CubepackError("The cubepack card template is missing from this installation.")


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def render(*, lock: dict[str, Any], memories: dict[str, list[str]], pretty_name: str,
           license: str | None, repo_id: str, cubepack_version: str) -> str:
    """Render the card text for a cube described by ``lock`` (its README.md entry aside)."""
    from huggingface_hub import DatasetCard, DatasetCardData

    files = lock["files"]
    base_models = sorted({pin["repo_id"] for pin in lock["models"].values()
                          if pin.get("repo_id") and pin.get("identity")})
    metadata: dict[str, Any] = {"pretty_name": pretty_name, "tags": TAGS}
    if license:
        metadata["license"] = license
    if base_models:
        metadata["base_model"] = base_models
    card_data = DatasetCardData(**metadata)
    models = []
    for role, pin in sorted(lock["models"].items()):
        identity = pin.get("identity")
        models.append({
            "role": role, "strict": pin.get("strict"), "repo_id": pin.get("repo_id"),
            "revision": pin.get("revision"), "identity": identity, "name": pin.get("name"),
            "reason": pin.get("reason"),
            "quantization": (identity or {}).get("quantization") or "none",
        })
    memory_rows = [{"kind": kind, "files": paths,
                    "size": human_size(sum(files[p]["size"] for p in paths if p in files))}
                   for kind, paths in memories.items() if paths]
    activations = [{"id": item_id, **entry, "size": human_size(files[entry["file"]]["size"])}
                   for item_id, entry in sorted(lock["activations"].items())]
    card = DatasetCard.from_template(
        card_data, template_path=str(template_path()), pretty_name=pretty_name,
        memories=memory_rows, activations=activations, models=models, repo_id=repo_id,
        content_digest=lock["content_digest"], cubepack_version=cubepack_version,
    )
    return str(card).rstrip("\n") + "\n"


def is_cubepack_card(text: str) -> bool:
    return MARKER in text
