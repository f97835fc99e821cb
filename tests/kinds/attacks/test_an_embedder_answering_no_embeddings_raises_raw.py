"""Adversary #39: an embedder that answers, but not with embeddings, crashes every verb that
asks it with a raw Python error.

Promise (README's principles, the errors page): errors are typed (one ``CubepackError`` tree
that decides the exit code), say what differed and what to do; ``verify`` records a failed
check rather than stopping (an unreachable embedder is reported as a failed ``embedder``
check).

Attack: an OpenAI-compatible endpoint answering 200 with what is not an embeddings answer (an
HTML page, an error object, items without their ``index``, numbers as strings, NaN), given as
``--embedder`` to ``verify``, ``pack`` and ``migrate`` of a preference cube MemOS dumped. What
happened: ``JSONDecodeError``, ``KeyError('data')``, ``KeyError('index')``, ``TypeError`` out of
all three (the embedder's answer was read by key, never checked); NaN was taken as a vector
(verify: "cosine nan ... another embedder made these vectors"; migrate: "textual_memory.json is
not valid JSON", blaming the cube's file for the embedder's answer).
"""

from __future__ import annotations

import http.server
import json
import threading

import pytest

import cubepack
from cubepack._util import constants

pytest.importorskip("memos", reason="MemoryOS is installed in the memos environment only")

ANSWERS = {
    "an html page": lambda n: b"<html>502 Bad Gateway</html>",
    "an error object": lambda n: json.dumps({"error": {"message": "quota exceeded"}}).encode(),
    "items without index": lambda n: json.dumps(
        {"data": [{"embedding": [0.1] * 32} for _ in range(n)]}).encode(),
    "numbers as strings": lambda n: json.dumps(
        {"data": [{"index": i, "embedding": ["0.1"] * 32} for i in range(n)]}).encode(),
    "nan": lambda n: json.dumps(
        {"data": [{"index": i, "embedding": [float("nan")] * 32} for i in range(n)]}).encode(),
    "too few vectors": lambda n: json.dumps(
        {"data": [{"index": 0, "embedding": [0.1] * 32}]}).encode(),
}


class _Answers(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = ANSWERS[self.path.split("/")[1].replace("-", " ")](len(asked["input"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def endpoint():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("answer", sorted(ANSWERS))
def test_an_embedders_wrong_answer_is_a_typed_refusal_naming_the_embedder(default_dump, tmp_path,
                                                                          endpoint, answer):
    cubepack.pack(default_dump)
    lock = (default_dump / constants.LOCK_FILENAME).read_bytes()
    spec = f"openai:{endpoint}/{answer.replace(' ', '-')}#m"
    report = cubepack.verify(default_dump, embedder=spec, raise_on_failure=False)
    failed = [c for c in report.checks if c.name == "embedder" and c.ok is False]
    assert failed and all("/embeddings" in c.detail for c in failed), [c.detail for c in failed]
    for verb in (lambda: cubepack.pack(default_dump, embedder=spec),
                 lambda: cubepack.migrate(default_dump, out=tmp_path / "moved", embedder=spec)):
        with pytest.raises(cubepack.CubepackError, match="/embeddings"):
            verb()
    # A failed command leaves everything as it was.
    assert (default_dump / constants.LOCK_FILENAME).read_bytes() == lock
    assert not (tmp_path / "moved").exists()
