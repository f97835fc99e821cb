"""Sharing cubes through a Hub at exact revisions: :func:`push` (one commit) and :func:`pull`
(one commit, verified before it is placed), through one :class:`HubClient` carrying endpoint
and token, pins checked against the Hub's file metadata (``_remote``), a cube's lineage
followed to its root (:func:`lineage`, ``_lineage``), the cubes whose pins match a model
found through the Hub's list API (:func:`search`, ``_search``), and a remote cube opened at
one commit whose memories load one at a time, each by its byte range (:func:`open_cube`,
``_open``: ``cubepack.open``).

Works with huggingface_hub 0.36 and 2.x, against the Hub or any compatible endpoint (such as
``cubepack hub serve``); ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HUB_OFFLINE`` and ``HF_HUB_CACHE``
are honoured through huggingface_hub itself.
"""

from ._client import HubClient, parse_repo_spec
from ._lineage import LineageResult, lineage
from ._open import RemoteCube, open_cube
from ._pull import PullOptions, PullResult, pull, resolve_revision
from ._push import PushOptions, PushResult, push
from ._remote import verify_remote
from ._search import SearchResult, search

__all__ = ["HubClient", "LineageResult", "PullOptions", "PullResult", "PushOptions", "PushResult",
           "RemoteCube", "SearchResult", "lineage", "open_cube", "parse_repo_spec", "pull",
           "push", "resolve_revision", "search", "verify_remote"]
