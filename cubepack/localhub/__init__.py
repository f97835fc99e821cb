"""A local, Hugging Face Hub-compatible endpoint: ``cubepack hub serve``.

A stand-in for air-gapped teams, tests and the demo, not a Hub replacement: it stores dataset
and model repos on disk (immutable commits, content-addressed blobs, branches, tags, pull
requests and discussions) and answers the routes the real ``huggingface_hub`` client (0.36 and
2.x) uses to create, push, propose and merge, tag, list refs, read repo info with file metadata,
and download. No Xet, no web UI. It binds to 127.0.0.1 unless told otherwise.
"""

from ._objects import collect_garbage
from ._server import LocalHub
from ._store import HubStore

__all__ = ["HubStore", "LocalHub", "collect_garbage"]
