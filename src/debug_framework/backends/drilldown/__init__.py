"""The drill-down seam the engines build on, below the services: the records and the strategy
protocol (:mod:`.types`), the base of a strategy for one named backend (:mod:`.support`), module
paths and source lines (:mod:`.paths`), and the node-level drill-down of the engines that run ONNX
graphs (:mod:`.onnx`, :mod:`.onnx_graph`). An engine's own strategy lives in its package and is
named in its registry record; the services' :mod:`debug_framework.services.drilldown` chooses among
them and the generic ones.
"""
