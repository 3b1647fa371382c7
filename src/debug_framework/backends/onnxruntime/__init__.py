"""The ``onnxruntime`` engine: ONNX Runtime on a model's ONNX export or an ONNX file.

Everything it knows is here: its runner (:mod:`.runner`, ``OnnxRuntimeBackend``: sessions,
optimisation levels, options, availability; the export, checkpoints, layer and block cuts are every
ONNX-graph engine's, :mod:`debug_framework.backends._onnx_export`), the plain sessions the float64
reference runners of an ONNX file open (:mod:`.sessions`), its node-level drill-down strategy
(:mod:`.drilldown`) and the culprit's repro (:mod:`.repro`). It registers in
:data:`debug_framework.backends.registry.BUILTIN_ENGINES`. Nothing is imported here: the registry
imports the modules on first use.
"""
