"""What the served-model tests share: real HTTP servers on loopback ports, answering as a test says."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

#: ``answer(request, body) -> (status, bytes)``: what a test server sends back for one request
#: (``request.command``, ``request.path`` and ``request.headers`` read as they came)
Answer = Callable[[BaseHTTPRequestHandler, bytes], "tuple[int, bytes]"]


@pytest.fixture(scope="session")
def loopback_http() -> Iterator[Callable[[Answer], str]]:
    """``start(answer) -> base URL`` (``http://127.0.0.1:PORT/v1``): a real HTTP server on a free
    loopback port, answering GET and POST with ``answer`` as JSON; every one shut down at the end."""
    servers: list[ThreadingHTTPServer] = []

    def start(answer: Answer) -> str:
        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                status, data = answer(self, self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/v1"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def tiny_llama_dir() -> Callable[..., str]:
    """``make(directory, vocab_size=, max_positions=, scale=) -> directory``: a tiny random Llama
    (2 layers, hidden 32, 4 heads over 2 KV heads, untied head) saved there; ``scale`` redraws every
    weight as ``scale x N(0, 1)`` (None keeps transformers' initialisation)."""

    def make(directory: object, vocab_size: int = 64, max_positions: int = 64, scale: float | None = None) -> str:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                             rms_norm_eps=1e-6, tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
        if scale is not None:
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(scale * torch.randn(p.shape, generator=gen))
        model.save_pretrained(str(directory))
        return str(directory)

    return make
