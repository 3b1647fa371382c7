"""The ``executorch`` engine: PyTorch's deployment runtime on the model's own export or on a ``.pte``
program of the user's (docs/executorch.md).

Its runner (:mod:`.runner`, ``ExecuTorchBackend``: the export with every checkpoint an output,
layer and block replay, a user's program read as logits, hidden states or a sidecar), decode through a
static KV cache held in the program (:mod:`.static_cache`), the lowering
to XNNPACK or the portable kernels (:mod:`.lowering`), the ``.pte`` file checked and loaded where a
crash cannot take the session down (:mod:`.program`), the outputs' mapping (:mod:`.outputs`) and
ExecuTorch's own Inspector evidence (:mod:`.inspector`). It registers in
:data:`debug_framework.backends.registry.BUILTIN_ENGINES`. Nothing is imported here: the registry
imports the modules on first use.
"""
