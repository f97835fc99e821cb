"""Test machinery shipped with cubepack: tiny models and an instrumented local Hub.

Used by cubepack's own tests, ``python -m cubepack.demo`` and ``bench/``; nothing in the runtime
package imports it. Users may use it to test their own integrations offline:

- :mod:`cubepack.testing.tiny`: real transformers models and a trained tokenizer, built in
  milliseconds with no download;
- :mod:`cubepack.testing.hub`: :class:`~cubepack.testing.hub.InstrumentedHub`, the local
  endpoint plus fault injection, a bandwidth cap, request and byte counters, and
  :func:`~cubepack.testing.hub.upload_folder` to publish a folder to any endpoint.
"""
