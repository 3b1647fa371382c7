"""torchao's quantized weights in a module backend: recognised, reproduced on the trusted model, and
seen through by the drill-down.

torchao (``torchao.quantization.quantize_``) swaps a linear's weight for a tensor subclass whose
``__torch_function__`` runs the quantized kernel: ``Int8Tensor`` (``Int8WeightOnlyConfig``: an
``aten.mm`` on the int8 data then the scales; ``Int8DynamicActivationInt8WeightConfig``: the
activation quantized per row, then ``aten._int_mm``), ``Int4OpaqueTensor``
(``PrototypeInt4WeightOnlyConfig(group_size=...)``: ``aten._weight_int4pack_mm_for_cpu``).

* :mod:`.weights`: :func:`~.weights.torchao_weights` finds them in any module (:class:`~.weights.QuantizedWeight`: the module, the
  scheme, the group size, the tensor class); :data:`~.weights.SCHEMES` names the schemes as the results do.
* :mod:`.reference`: :class:`~.reference.TorchaoReferenceBackend` is a correct run at that quantization: the trusted eager model
  (transformers' code, the file's weights) quantized by torchao with the same configuration at the
  same modules. :class:`~.reference.TorchaoPrecision` is the precision a module backend holding
  torchao weights declares (its ``emulated_precision(model)``, the seam llama.cpp uses too), whose
  trusted emulation that backend is: the calibration of a session judged at the alternative's
  quantization (``--dtype auto``: ``emulated_precision`` ``"int8_weight_only"``) and the precision
  diagnosis's candidate (``consistent_with`` ``"int8_weight_only"``).
* :mod:`.leaves`: :func:`~.leaves.quantized_leaves` makes each quantized linear one operator of a traced layer graph
  (``debug_framework::quantized_linear``, its weight's inner tensors as graph inputs), which the
  replay drill-down runs on the alternative's own quantized weight and judges against the trusted
  layer's float64 output of that module; :func:`~.leaves.kernel_of` names the kernel it runs
  (``aten._int_mm.default``...), :func:`~.leaves.correct_quantized_error` is what a correct quantization of the
  reference's weight errs there.

torchao is imported only where a module already holds its tensors (it is in ``sys.modules`` then).
This package's ``__init__`` imports nothing: ``torch_module`` reads :mod:`.weights` alone.
"""
