"""The Hub's list API (``GET /api/models``, ``GET /api/datasets``), as huggingface_hub's
``list_models(...)`` and ``list_datasets(...)`` (0.36 and 2.x) send it and parse the answer.

A query is parsed once into a :class:`ListQuery` (an unknown ``sort`` or ``expand`` value, a
malformed ``limit`` or cursor: 400, as the Hub answers). Each repo's tags are derived from its
card's YAML front matter (``README.md`` at the head of ``main``) as the Hub derives them
(:func:`card_tags`); ``filter`` values must all be tags of a repo, ``search`` values all
substrings of its id (case-folded), ``author`` its namespace. Pages are ordered by the sort key,
then the id, and a page's ``Link: <...>; rel="next"`` carries a cursor naming the last repo it
listed (the key and id, not an offset: a repo created or deleted between two pages shifts
nothing). Whether a private repo is listed is the caller's rule (``may_read``), the one every
route reads by.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from .._util import canonical
from ._errors import StoreError, shown
from ._ids import RepoRef

#: Repos a page lists when the query names no smaller ``limit`` (the Hub's page is 1,000).
PAGE_SIZE = 1_000
#: Largest card read for its front matter; a larger README lists with no card data.
MAX_CARD_BYTES = 1024 * 1024
#: Largest front matter parsed (PyYAML reads ~130 KiB a second: a 1 MiB one cost 7.7 s of CPU;
#: this one at most ~0.13 s, once per card); a cubepack card's is under 1 KiB.
MAX_FRONT_MATTER_BYTES = 16 * 1024
#: ``sort`` values the clients send (``last_modified`` and the like arrive camel-cased) -> the
#: property they sort by.
SORTS = {"lastModified": "lastModified", "createdAt": "createdAt", "downloads": "downloads",
         "likes": "likes", "trendingScore": "trendingScore", "id": "id",
         "downloadsAllTime": "downloadsAllTime"}
#: ``expand`` values the clients document, by kind. Those served are in SERVED; the others are
#: official properties this endpoint has no value for: left out of the answer (the client reads
#: None), never a 400. Anything else is a 400, as on the Hub.
EXPANDABLE = {
    "models": frozenset({
        "author", "baseModels", "cardData", "childrenModelCount", "config", "createdAt",
        "disabled", "downloads", "downloadsAllTime", "evalResults", "gated", "gguf", "inference",
        "inferenceProviderMapping", "lastModified", "library_name", "likes", "mask_token",
        "model-index", "pipeline_tag", "private", "resourceGroup", "safetensors", "sha",
        "siblings", "spaces", "tags", "transformersInfo", "trendingScore", "usedStorage",
        "widgetData", "xetEnabled"}),
    "datasets": frozenset({
        "author", "cardData", "citation", "createdAt", "description", "disabled", "downloads",
        "downloadsAllTime", "gated", "lastModified", "likes", "mainSize", "paperswithcode_id",
        "private", "resourceGroup", "sha", "siblings", "tags", "trendingScore", "usedStorage",
        "xetEnabled"}),
}
SERVED = frozenset({"author", "cardData", "createdAt", "disabled", "downloads",
                    "downloadsAllTime", "gated", "lastModified", "likes", "private", "sha",
                    "siblings", "tags", "trendingScore", "xetEnabled"})
#: What an answer holds without ``expand`` (``full`` adds siblings and the card's data).
DEFAULT = ("author", "private", "gated", "disabled", "downloads", "likes", "trendingScore",
           "tags", "lastModified", "sha")
#: Card keys whose values the Hub turns into ``key:value`` tags, by kind (what the clients'
#: filters name: ``list_datasets(language=...)`` sends ``language:...``).
_PREFIXED = {
    "models": ("license", "language", "base_model", "datasets"),
    "datasets": ("license", "language", "language_creators", "multilinguality",
                 "size_categories", "task_categories", "task_ids", "benchmark"),
}
#: The tag prefix a card key is listed under where it differs from the key.
_PREFIX = {"datasets": "dataset"}
#: Card keys the Hub lists as tags unprefixed (models: the library and the pipeline).
_PLAIN = {"models": ("library_name", "pipeline_tag"), "datasets": ()}
_CURSOR = re.compile(r"[A-Za-z0-9_-]{1,512}={0,2}")
_TRUE = ("true", "1", "True")


@dataclass(frozen=True)
class ListQuery:
    """A list request's parameters, parsed."""

    kind: str
    search: tuple[str, ...] = ()
    author: str | None = None
    filters: tuple[str, ...] = ()
    gated: bool | None = None
    sort: str = "id"
    descending: bool = False
    limit: int | None = None
    full: bool = False
    card_data: bool = False
    expand: tuple[str, ...] = ()
    cursor: tuple[Any, str] | None = None

    @classmethod
    def parse(cls, kind: str, query: dict[str, list[str]]) -> ListQuery:
        """The parameters huggingface_hub sends (lists arrive as repeated keys).

        Raises:
            StoreError: 400 for a ``sort``, ``expand``, ``limit``, ``direction`` or cursor the
                Hub would refuse, or ``expand`` combined with ``full``, ``cardData`` or
                ``config``.
        """
        def one(key: str) -> str | None:
            values = query.get(key)
            return values[-1] if values else None

        sort = one("sort")
        if sort is not None and sort not in SORTS:
            raise StoreError(400, f"Invalid sort {shown(sort)}: one of {', '.join(sorted(SORTS))}.")
        direction = one("direction")
        if direction is not None and direction not in ("-1", "1"):
            raise StoreError(400, f"Invalid direction {shown(direction)}: -1 or 1.")
        # Sorted by a property, the Hub lists the largest first (2.x sends no direction).
        descending = sort is not None and direction != "1"
        limit = one("limit")
        if limit is not None and not re.fullmatch(r"[1-9][0-9]{0,8}", limit):
            raise StoreError(400, f"Invalid limit {shown(limit)}: a positive integer.")
        expand = tuple(dict.fromkeys(query.get("expand", [])))
        unknown = [value for value in expand if value not in EXPANDABLE[kind]]
        if unknown:
            raise StoreError(400, f"Invalid expand value {shown(unknown[0])} for {kind}.")
        full, card = one("full") in _TRUE, one("cardData") in _TRUE
        if expand and (full or card or one("config") in _TRUE):
            raise StoreError(400, "expand cannot be combined with full, cardData or config.")
        gated = one("gated")
        return cls(kind=kind, search=tuple(s.lower() for s in query.get("search", []) if s),
                   author=(one("author") or None), filters=tuple(query.get("filter", [])),
                   gated=None if gated is None else gated in _TRUE,
                   sort=SORTS[sort] if sort else "id", descending=descending,
                   limit=int(limit) if limit else None, full=full, card_data=card,
                   expand=expand, cursor=_read_cursor(one("cursor")))

    def properties(self) -> tuple[str, ...]:
        """What each listed repo's entry holds (besides ``id`` and ``_id``)."""
        if self.expand:
            return tuple(value for value in self.expand if value in SERVED)
        extra = ("cardData", "siblings", "createdAt") if self.full else ()
        return DEFAULT + extra + (("cardData",) if self.card_data and not self.full else ())


def _read_cursor(text: str | None) -> tuple[Any, str] | None:
    """A cursor this endpoint wrote: base64url of ``[key, id]``; anything else is a 400."""
    if text is None:
        return None
    try:
        if not _CURSOR.fullmatch(text):
            raise ValueError("not base64url")
        value = json.loads(base64.urlsafe_b64decode(text.encode("ascii")))
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], str)
                and isinstance(value[0], (str, int)) and not isinstance(value[0], bool)):
            raise ValueError("not a cursor")
    except ValueError:
        raise StoreError(400, f"Invalid cursor {shown(text)}: pass the one a page's Link "
                              "header names.") from None
    return value[0], value[1]


def _write_cursor(key: Any, repo_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([key, repo_id]).encode()).decode("ascii")


def card_metadata(text: bytes) -> dict[str, Any]:
    """The YAML front matter of a README (``---`` block first), read strictly (bounded
    nesting, no aliases); {} when there is none, it is larger than
    :data:`MAX_FRONT_MATTER_BYTES`, it does not parse, or it is no mapping."""
    if len(text) > MAX_CARD_BYTES:
        return {}
    from huggingface_hub.repocard import REGEX_YAML_BLOCK  # the block the Hub reads

    block = REGEX_YAML_BLOCK.search(text.decode("utf-8", errors="replace"))
    if block is None or len(block.group(2).encode()) > MAX_FRONT_MATTER_BYTES:
        return {}
    try:
        data = canonical.load_yaml_strict(block.group(2))
    except ValueError:  # a limit (LimitError) or a syntax error: no card data, as on the Hub
        return {}
    return data if isinstance(data, dict) else {}


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, str)]
    return []


def card_tags(kind: str, metadata: dict[str, Any]) -> list[str]:
    """A repo's tags as the Hub derives them from its card: the card's ``tags`` as written,
    then ``key:value`` for the keys its filters name (``license:mit``, ``language:en``;
    ``base_model:<id>`` and ``dataset:<id>`` for a model), then a model's library and pipeline
    tag. Each once, in that order."""
    tags = _strings(metadata.get("tags"))
    for key in _PREFIXED[kind]:
        tags += [f"{_PREFIX.get(key, key)}:{value}" for value in _strings(metadata.get(key))]
    for key in _PLAIN[kind]:
        tags += _strings(metadata.get(key))
    return list(dict.fromkeys(tags))


@dataclass(frozen=True)
class Listed:
    """One repo as a list answers it: every property it can be sorted or expanded by."""

    repo: RepoRef
    private: bool
    sha: str
    last_modified: str
    created_at: Callable[[], str]
    siblings: Callable[[], list[dict[str, Any]]]
    metadata: dict[str, Any]

    def tags(self) -> list[str]:
        return card_tags(self.repo.kind, self.metadata)

    def key(self, sort: str) -> Any:
        if sort == "lastModified":
            return self.last_modified
        if sort == "createdAt":
            return self.created_at()
        if sort == "id":
            return self.repo.repo_id.lower()
        return 0  # downloads, likes, trending: none counted here

    def entry(self, properties: Iterable[str]) -> dict[str, Any]:
        values = {"author": lambda: self.repo.namespace, "private": lambda: self.private,
                  "gated": lambda: False, "disabled": lambda: False, "downloads": lambda: 0,
                  "downloadsAllTime": lambda: 0, "likes": lambda: 0, "trendingScore": lambda: 0,
                  "xetEnabled": lambda: False, "tags": self.tags, "sha": lambda: self.sha,
                  "lastModified": lambda: self.last_modified, "createdAt": self.created_at,
                  "siblings": self.siblings, "cardData": lambda: self.metadata}
        data = {"_id": self.repo.repo_id, "id": self.repo.repo_id}
        if self.repo.kind == "models":
            data["modelId"] = self.repo.repo_id
        data.update({name: values[name]() for name in properties})
        return data


def selected(query: ListQuery, repos: Iterable[Listed]) -> list[Listed]:
    """The repos ``query`` names, in its order (the sort key, then the id), from its cursor on."""
    chosen = []
    for listed in repos:
        repo_id = listed.repo.repo_id.lower()
        if query.author is not None and listed.repo.namespace.lower() != query.author.lower():
            continue
        if any(term not in repo_id for term in query.search):
            continue
        if query.gated:  # no repo here is gated
            continue
        if query.filters and not set(query.filters) <= set(listed.tags()):
            continue
        chosen.append(listed)
    chosen.sort(key=lambda item: (item.key(query.sort), item.repo.repo_id.lower()),
                reverse=query.descending)
    if query.cursor is not None:
        mark = query.cursor
        chosen = [item for item in chosen
                  if _after((item.key(query.sort), item.repo.repo_id.lower()), mark,
                            query.descending)]
    return chosen


def _after(position: tuple[Any, str], mark: tuple[Any, str], descending: bool) -> bool:
    if type(position[0]) is not type(mark[0]):  # a cursor of another sort: compare as text
        position, mark = (str(position[0]), position[1]), (str(mark[0]), mark[1])
    return position < mark if descending else position > mark


def page(query: ListQuery, chosen: list[Listed], page_size: int, path: str,
         raw_query: dict[str, list[str]]) -> tuple[list[dict[str, Any]], str | None]:
    """The page's entries and the ``Link`` header naming the next page (None: the last)."""
    size = min(page_size, query.limit) if query.limit else page_size
    shown_now = chosen[:size]
    entries = [item.entry(query.properties()) for item in shown_now]
    if len(chosen) <= size or not shown_now:
        return entries, None
    last = shown_now[-1]
    params = [(key, value) for key, values in raw_query.items() if key != "cursor"
              for value in values]
    params.append(("cursor", _write_cursor(last.key(query.sort), last.repo.repo_id.lower())))
    return entries, f'<{path}?{urlencode(params)}>; rel="next"'
