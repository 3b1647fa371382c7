"""The ``openai_server`` engine: a model behind an OpenAI-compatible server, judged by its token
log-probabilities (docs/served.md).

:mod:`.client` is the HTTP client (httpx; the API key from ``OPENAI_API_KEY``, never written
anywhere; connect and read timeouts, a whole-session limit, bounded retries with backoff on
429/5xx, at most ``concurrency`` requests in flight); :mod:`.protocols` the request plans and
answers of the servers it knows (llama.cpp's ``llama-server``: one request per position, its prompt
cache reused; vLLM: one request per row with its ``prompt_logprobs`` extension; SGLang: one request
per row to its native ``/generate``; TGI: one request per position to its native ``/generate``, the
prompt as text its tokenization checked); :mod:`.backend`
the backend on the engine seam (``Engine("openai_server", ...)`` in the registry, which names it the
engine of ``alternative_endpoint``), a :class:`~debug_framework.backends.endpoints.LogprobBackend`: it
gives out no hidden states, only the top-k log-probabilities at every position it is asked for.
Nothing is imported here.
"""
