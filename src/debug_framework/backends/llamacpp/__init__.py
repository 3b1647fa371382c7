"""The ``llamacpp`` engine: a GGUF run in llama.cpp through the C API of the pinned ``xllamacpp``
wheel (:mod:`.binding`), its graph nodes read and replaced through the eval callback (:mod:`.graph`),
the canonical checkpoints, replays and decode (:mod:`.runner`; isolation's replays resumed along one
pass: :mod:`.chain`), and the precision it computes at
with a trusted emulation of it (:mod:`.precision`); docs/gguf.md. It registers in
:data:`debug_framework.backends.registry.BUILTIN_ENGINES` (its drill-down strategy:
``services.drilldown.ggml``). Nothing is imported here: the registry imports the runner on first use.
"""
