"""Test machinery shipped with cubepack: tiny models and an instrumented local Hub.

Used by cubepack's own tests, ``python -m cubepack.demo`` and ``bench/``; nothing in the runtime
package imports it. Users may use it to test their own integrations offline:

- :mod:`cubepack.testing.tiny`: real transformers models and a trained tokenizer, built in
  milliseconds with no download;
- :mod:`cubepack.testing.reader`: the demo's two tiny models that answer from their context
  (weights shipped, with the script that trains them again);
- :mod:`cubepack.testing.hub`: :class:`~cubepack.testing.hub.InstrumentedHub`, the local
  endpoint plus fault injection, a bandwidth cap, request and byte counters, and
  :func:`~cubepack.testing.hub.upload_folder` to publish a folder to any endpoint.
"""

import socket as _socket

__all__ = ["free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, for an endpoint started in another process.
    Kept here, away from any Hub import: the demo needs it before huggingface_hub reads its
    environment."""
    with _socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
