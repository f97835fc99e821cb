"""The cube's model card (``README.md``), rendered from ``templates/`` with huggingface_hub.

``DatasetCard.from_template`` validates the YAML front matter the Hub reads: tags (``memcube``,
``memos``, ``kv-cache``, and ``cubepack-weights-<16 hex>`` per pinned model: the hint
``cubepack search`` filters the Hub's list on), ``base_model`` (the pinned models' repo ids),
``pretty_name`` and the license when given. The card carries no timestamp, so packing an
unchanged cube re-renders it byte-identically.

A README cubepack did not write (MemOS writes a one-line one into every cube) is never lost:
its text goes into the card under its own heading, between markers so a re-pack finds it
again, and its front matter is merged into the card's. Settings given once (license, pretty
name) are read back from the previous card, so a re-pack without them keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util import canonical, constants
from ..errors import CubepackError, FormatError

TAGS = ["memcube", "memos", "kv-cache", "cubepack"]
#: A plain bundle's tags (no MemOS config.json, no text memory): not a MemCube.
PLAIN_TAGS = ["kv-cache", "cubepack"]
MARKER = "<!-- cubepack:card"
KEPT_START = "<!-- cubepack:kept-readme (the README this cube had before cubepack; kept as is) -->"
KEPT_END = "<!-- /cubepack:kept-readme -->"
#: The tag naming a pinned model's weights (its digest's first 16 hex digits): a hint the Hub's
#: list API filters on (``cubepack search --model``), never evidence: a match is decided by the
#: pins read from the lock.
WEIGHTS_TAG_PREFIX = "cubepack-weights-"
#: Front-matter keys cubepack writes itself (a kept README's values for them are replaced).
OWN_KEYS = ("pretty_name", "tags", "base_model", "license")


@dataclass
class PreviousCard:
    """What a cube's existing README.md contributes to the next card."""

    metadata: dict[str, Any] = field(default_factory=dict)  # front matter not cubepack's own
    tags: list[str] = field(default_factory=list)
    license: str | None = None
    pretty_name: str | None = None
    kept_text: str | None = None  # the README cubepack did not write


def read_previous(text: str | None) -> PreviousCard:
    """Parse the README a cube holds (cubepack's card or anyone else's).

    Raises:
        FormatError: its front matter goes beyond a limit of the strict YAML reader (nesting,
            aliases, numbers), which huggingface_hub's plain ``yaml.safe_load`` would not stop.
    """
    from huggingface_hub import RepoCard
    from huggingface_hub.repocard import REGEX_YAML_BLOCK  # the block RepoCard parses

    if not text:
        return PreviousCard()
    block = REGEX_YAML_BLOCK.search(text)
    if block:
        try:
            canonical.load_yaml_strict(block.group(2))
        except canonical.LimitError as exc:
            raise FormatError(f"{constants.CARD_FILENAME}'s front matter is refused: {exc}.") \
                from exc
        except ValueError:
            pass  # a syntax error: kept as text below, as RepoCard fails on it too
    try:
        card = RepoCard(text, ignore_metadata_errors=True)
        metadata, body = card.data.to_dict(), card.text
    except Exception:  # noqa: BLE001 - front matter that does not parse: keep it all as text
        metadata, body = {}, text
    previous = PreviousCard(
        metadata={k: v for k, v in metadata.items() if k not in OWN_KEYS},
        tags=[t for t in metadata.get("tags") or [] if isinstance(t, str) and t not in TAGS
              and not t.startswith(WEIGHTS_TAG_PREFIX)],  # the pins' tags are made anew
        license=metadata.get("license") if isinstance(metadata.get("license"), str) else None,
        pretty_name=metadata.get("pretty_name") if isinstance(metadata.get("pretty_name"), str)
        else None)
    if is_cubepack_card(text):
        if KEPT_START in body and KEPT_END in body:
            previous.kept_text = body.split(KEPT_START, 1)[1].split(KEPT_END, 1)[0].strip("\n")
    else:
        previous.kept_text = body.strip("\n") or None
        previous.pretty_name = None  # another tool's title is not a setting the user gave us
    return previous


def weights_tag(weights_digest: str) -> str:
    """The card tag of a model whose weights digest is ``weights_digest`` (``sha256:<hex>``
    or ``state-dict-sha256:<hex>``)."""
    return WEIGHTS_TAG_PREFIX + weights_digest.rpartition(":")[2][:16].lower()


def template_path() -> Path:
    """The card template, packaged inside the wheel or at the repository's top level."""
    package = Path(__file__).resolve().parents[1]  # cubepack/
    for candidate in (package / "templates" / "cube_card.md",
                      package.parent / "templates" / "cube_card.md"):
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


#: The card summarises: at most this many activation rows and file names per memory kind (the
#: lock lists every one), so it stays small whatever the cube holds.
CARD_ROWS = 50
CARD_FILES = 5


def render(*, lock: dict[str, Any], memories: dict[str, list[str]], pretty_name: str,
           license: str | None, repo_id: str, cubepack_version: str,
           previous: PreviousCard | None = None, memos: bool = True) -> str:
    """Render the card text for a cube described by ``lock`` (its README.md entry aside);
    ``memos``: a MemOS cube (else a plain bundle of caches and their sources)."""
    from huggingface_hub import DatasetCard, DatasetCardData

    previous = previous or PreviousCard()
    files = lock["files"]
    base_models = sorted({pin["repo_id"] for pin in lock["models"].values()
                          if pin.get("repo_id") and pin.get("identity")})
    weights = sorted({weights_tag(pin["identity"]["weights_digest"])
                      for pin in lock["models"].values() if pin.get("identity")})
    metadata: dict[str, Any] = {**previous.metadata, "pretty_name": pretty_name,
                                "tags": (TAGS if memos else PLAIN_TAGS) + weights
                                + previous.tags}
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
            "reason": pin.get("reason"), "vectors": pin.get("vectors"),
            "quantization": (identity or {}).get("quantization") or "none",
        })
    memory_rows = [{"kind": kind, "files": paths[:CARD_FILES],
                    "more": max(0, len(paths) - CARD_FILES), "count": len(paths),
                    "size": human_size(sum(files[p]["size"] for p in paths if p in files))}
                   for kind, paths in memories.items() if paths]
    everything = sorted(lock["activations"].items())
    activations = [{"id": item_id, **entry, "size": human_size(files[entry["file"]]["size"])}
                   for item_id, entry in everything[:CARD_ROWS]]
    adapters = []
    for name, entry in sorted((lock.get("adapters") or {}).items()):
        pin = lock["models"].get(entry["model_role"]) or {}
        targets = entry["target_modules"]
        adapters.append({"name": name, **entry, "pin": pin,
                         "targets": targets if isinstance(targets, str) else ", ".join(targets),
                         "base_dtype": (pin.get("identity") or {}).get("dtype"),
                         "weights_digest": (pin.get("identity") or {}).get("weights_digest")})
    kinds: dict[str, int] = {}
    for _, entry in everything:
        kind = (entry.get("provenance") or {}).get("kind", "none")
        kinds[kind] = kinds.get(kind, 0) + 1
    card = DatasetCard.from_template(
        card_data, template_path=str(template_path()), pretty_name=pretty_name,
        memories=memory_rows, activations=activations, models=models, repo_id=repo_id,
        adapters=adapters, lineage=_lineage_rows(lock.get("lineage")),
        more_activations=len(everything) - len(activations), activation_count=len(everything),
        provenance_counts=", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())),
        content_digest=lock["content_digest"], cubepack_version=cubepack_version,
        kept_text=previous.kept_text, kept_start=KEPT_START, kept_end=KEPT_END, memos=memos,
    )
    return str(card).rstrip("\n") + "\n"


def _lineage_rows(lineage: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the card says of the cube a migrated one derives from (the lock holds the rest)."""
    if not lineage:
        return None
    parent, changes = lineage["parent"], lineage["changes"]
    moved = [f"{role}: {change['from']} -> {change['to']}"
             for role, change in sorted(changes["models"].items())]
    if changes.get("embedder"):
        moved.append(f"embedder: {changes['embedder']['from']} -> {changes['embedder']['to']}")
    return {"parent": (f"{parent['repo_id']}@{parent['revision']}" if parent["repo_id"]
                       else parent["cube_id"] or "a local cube"),
            "lock_digest": parent["lock_digest"], "changes": moved,
            "retokenized": len(changes["retokenized"]), "reembedded": changes["reembedded"],
            "adapters_dropped": changes["adapters_dropped"]}


def is_cubepack_card(text: str) -> bool:
    return MARKER in text
