"""The ``openvino`` engine: OpenVINO on a model's ONNX export (or an ONNX file).

Its runner (:mod:`.runner`, ``OpenVinoBackend``: compilation, precision hints and the bfloat16
emulation, availability; the export, checkpoints, layer and block cuts are every ONNX-graph
engine's, :mod:`debug_framework.backends._onnx_export`) and its node-level drill-down strategy
(:mod:`.drilldown`). It registers in :data:`debug_framework.backends.registry.BUILTIN_ENGINES`.
Nothing is imported here: the registry imports the modules on first use.
"""
