"""A tiny embedding model and an OpenAI-compatible embedding server that runs it, for tests.

The server answers ``POST /v1/embeddings`` (``{"model", "input"}``, float or base64 encoding)
with the mean-pooled vectors of a real transformers encoder, as an OpenAI-compatible provider
would, so MemOS's own ``universal_api`` embedder backend can be pointed at it on loopback.
"""

from __future__ import annotations

import base64
import json
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .._util.quiet import quiet_libraries
from ..kinds.vectors._embedder import embed_locally
from .tiny import VOCAB_SIZE, build_tokenizer


def build_encoder(folder: str | Path, *, seed: int, hidden: int = 32) -> Path:
    """A BERT-style encoder with the tiny tokenizer, saved to ``folder``."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB_SIZE, hidden_size=hidden, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=hidden * 2,
                        max_position_embeddings=128)
    folder = Path(folder)
    with quiet_libraries(verbose=False, progress=False):
        BertModel(config).eval().save_pretrained(folder)
        build_tokenizer().save_pretrained(folder)
    return folder


class EmbeddingServer:
    """``with EmbeddingServer(model_folder) as server: server.url`` (ends in ``/v1``)."""

    def __init__(self, model_folder: str | Path, model_name: str = "tiny-embedder"):
        self.model_folder, self.model_name = Path(model_folder), model_name
        self.calls = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
                server.calls += 1
                vectors = embed_locally(server.model_folder, texts)
                encoded = body.get("encoding_format") == "base64"
                data = [{"object": "embedding", "index": i,
                         "embedding": base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode()
                         if encoded else v} for i, v in enumerate(vectors)]
                payload = json.dumps({"object": "list", "data": data, "model": server.model_name,
                                      "usage": {"prompt_tokens": 0, "total_tokens": 0}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    @property
    def spec(self) -> str:
        """The ``--embedder`` spec for this server."""
        return f"openai:{self.url}#{self.model_name}"

    def __enter__(self) -> EmbeddingServer:
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
