"""llama.cpp's ``llama-server`` (from the xllamacpp wheel) serving one GGUF file on a loopback port,
in a process of its own: what the served-model tests and ``bench_served`` validate against.

    python -m benchmarks.llama_server --model tiny.gguf --port 8080 [--f32-cache] [--no-flash-attn]
                                      [--api-key-from VAR] [--threads 1] [--slots 4]

``--f32-cache --no-flash-attn`` makes the server compute in float32 throughout (its defaults keep
the KV cache in float16, and its CPU flash attention goes through float16 too). The API key, where
one is wanted, is read from the environment variable named by ``--api-key-from`` (never an
argument: a process's arguments are visible to every user of the machine).

:func:`serving` starts one in a process group of its own, waits for its ``/health`` and stops the
whole group on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["serving", "free_port", "main"]


def free_port() -> int:
    """A loopback port free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def serving(model: Path, *, f32: bool = True, api_key_from: str | None = None, env: Mapping[str, str] | None = None,
            slots: int = 4, threads: int = 1, start_timeout: float = 60.0) -> Iterator[str]:
    """Serve ``model`` on a free loopback port; yields its OpenAI-compatible base URL (``.../v1``).
    ``f32``: float32 throughout (``--f32-cache --no-flash-attn``), else llama.cpp's defaults."""
    port = free_port()
    cmd = [sys.executable, "-m", "benchmarks.llama_server", "--model", str(model), "--port", str(port),
           "--slots", str(slots), "--threads", str(threads)]
    if f32:
        cmd += ["--f32-cache", "--no-flash-attn"]
    if api_key_from:
        cmd += ["--api-key-from", api_key_from]
    root = Path(__file__).resolve().parents[1]
    environ = {**os.environ, **(env or {})}
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(cmd, env=environ, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + start_timeout
        while not _healthy(port):
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode} before serving {model}")
            if time.monotonic() > end:
                raise RuntimeError(f"llama-server did not serve {model} within {start_timeout} s")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue


def main(argv: list[str] | None = None) -> int:
    """Serve until killed."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llama_server", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--f32-cache", action="store_true", help="keep the KV cache in float32")
    parser.add_argument("--no-flash-attn", action="store_true", help="plain attention (its CPU flash attention "
                        "computes in float16)")
    parser.add_argument("--api-key-from", metavar="VAR", help="require the API key held by this environment variable")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--slots", type=int, default=4)
    args = parser.parse_args(argv)
    import xllamacpp as xl

    params = xl.CommonParams()
    params.model.path = args.model
    params.port = args.port
    params.hostnames = ["127.0.0.1"]
    params.n_parallel = args.slots
    params.n_ctx = 256 * args.slots
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.warmup = False
    if args.f32_cache:
        params.cache_type_k = xl.ggml_type.GGML_TYPE_F32
        params.cache_type_v = xl.ggml_type.GGML_TYPE_F32
    if args.no_flash_attn:
        params.flash_attn_type = xl.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED
    if args.api_key_from:
        key = os.environ.get(args.api_key_from, "")
        if not key:
            parser.error(f"--api-key-from {args.api_key_from}: the variable is not set")
        params.api_keys = [key]
    server = xl.Server(params)
    assert server.listening_address  # serving from here on, in the server's own threads
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    os._exit(0)  # the server's own threads are not Python's: nothing to wait for


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    raise SystemExit(main())
