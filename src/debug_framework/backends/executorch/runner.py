"""``executorch``: the Hugging Face model exported to an ExecuTorch program and run by ExecuTorch's
runtime, or a ``.pte`` program the user exported (``--alternative-model FILE.pte``).

**The model's own program.** The model is exported with ``torch.export`` wrapped so that every
checkpoint is an extra output (forward hooks installed before the export append each checkpoint
to the outputs: :class:`~debug_framework.backends._graph_capture.CheckpointOutputs`), then lowered
for ``delegate``: ``"xnnpack"`` (default; what ExecuTorch runs on CPUs) or ``"portable"``. The
checkpoints are outputs of the program itself, so every layer is judged even where XNNPACK's
delegate runs it as one opaque call. A program is exported at the shape of the inputs it runs (the
first run of each shape exports; :attr:`ExecuTorchBackend.exports` lists them with their seconds, and
each run's ``Capture.meta`` names its program) and written under the session's artifact directory
(``version_info()["artifact_dir"]``) with its outputs sidecar, so the same file can be
given back as ``--alternative-model``. A layer is replayed (isolation) by exporting it alone,
called as the model calls it with the reference's input to it (its mask and rotary embeddings from
an eager forward stopped at the layer), and its MLP block alone the same way; each once per layer
and shape.

**A program of the user's own.** The file is checked before ExecuTorch reads it and loaded first by
a child interpreter (:mod:`.program`: a corrupt program is a DF004 error naming it, never a crash of
the session); its inputs are fed positionally and its outputs read as logits, logits and hidden
states, or as a sidecar names them (:mod:`.outputs`). Its layers cannot be replayed alone (the
program is one method): a broken layer is localized where the program exposes its output.

**Decode** (``--decode-steps N``, the model's own export): the model exported again with a static KV
cache held in the program (:mod:`.static_cache`): one program, methods ``prefill`` and ``decode``
sharing the cache, sized for the session's rows and ``N`` steps (exported once per shape and number
of steps), every checkpoint and each layer's cache its outputs; teacher-forced by the decode stage.
A user's program is not decoded (what its inputs and cache are is not known): the decode stage's
DF002 says so.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ...capture.keys import Capture, CheckpointKey, all_checkpoints
from ...errors import BackendInitializationError
from ...modelio.inputs import ModelInputs
from ...modelio.loader import LoadedModel
from .._graph_feeds import graph_inputs, layer_inputs_from
from ..decode import DecodePass, DecodeRun, collect_run, iter_runner_decode
from ..artifacts import run_directory
from ..base import BaseBackend, HiddenState, Taps, attention_block_or_mlp_checked, cpu_name, installed_version
from .lowering import check_delegate, lower_methods_to_file, lower_to_file
from .outputs import OutputMap, output_map, program_feeds, read_sidecar, sidecar_json, sidecar_path
from .inspector import InspectorEvidence
from .program import LoadedMethods, LoadedProgram, ProgramHeader, ProgramSignature, check_program_file, load_program, probe_program

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ...jsonio import JsonObject
    from .._graph_capture import CheckpointOutputs

__all__ = ["ExecuTorchBackend"]

#: the dtypes a user's program may compute at (its outputs' type), beyond float32
_LOWER_PRECISIONS = ("float16", "bfloat16")


class ExecuTorchBackend(BaseBackend):
    """ExecuTorch on the model's own export, or on a ``.pte`` program of the user's; float32.

    Args:
        delegate: ``"xnnpack"`` (default) or ``"portable"`` (:data:`~.lowering.DELEGATES`): what the
            model's own program is lowered for (a user's program runs as it was lowered).
        model_file: ``--alternative-model``: a ``.pte`` program of the session's model, run instead
            of an export of ours; checked here (header and sizes), loaded by a child first in ``prepare``.
        outputs: a sidecar naming the program's outputs (``{"outputs": ["post_processing", ...]}``);
            ``None``: the one beside the program (``model.pte.json``) where it exists, else the
            outputs are read as logits, or logits and hidden states.
        artifact_dir: where the exported programs go; ``None``: the session's artifact directory
            during a validation, else a temporary directory :meth:`close` removes.
        inspector: also run ExecuTorch's Inspector (:func:`~.inspector.numeric_gap`) on the model's
            logits for the inputs of the first run (the session's: the whole batch, else row by row at
            batch 1; see docs/executorch.md), its result or failure as :meth:`inspector_record`,
            which the session's result keeps as ``inspector`` beside its own per-layer judgement; the
            model's own export only (a user's program has no ETRecord).
    """

    name = "executorch"
    supported_dtypes = ("float32",)
    runs_onnx_files = False

    def __init__(self, delegate: str = "xnnpack", model_file: str | Path | None = None,
                 outputs: str | Path | None = None, artifact_dir: str | Path | None = None,
                 inspector: bool = False) -> None:
        super().__init__()
        self.delegate = check_delegate(str(delegate), self.name)
        self.model_file = None if model_file is None else Path(model_file).expanduser()
        self.header: ProgramHeader | None = None
        if self.model_file is not None:
            self.header = check_program_file(self.model_file)
            self.supported_dtypes = ("float32", *_LOWER_PRECISIONS)  # the program's precision is its own
        given = None if outputs is None else Path(outputs).expanduser()
        if given is None and self.model_file is not None and sidecar_path(self.model_file).is_file():
            given = sidecar_path(self.model_file)
        self.outputs_file = given
        self._named = None if given is None else read_sidecar(given)
        self.artifact_dir = None if artifact_dir is None else Path(artifact_dir)
        if inspector and self.model_file is not None:
            raise BackendInitializationError("ExecuTorch's Inspector needs the program's ETRecord, which a user's "
                                             "program does not come with", backend=self.name,
                                             hint="drop inspector=true, or let the backend export the model")
        self.inspector = bool(inspector)
        self.inspector_evidence: InspectorEvidence | None = None
        self._temporary: weakref.finalize | None = None
        self.signature: ProgramSignature | None = None
        self.outputs_read_as: str | None = None
        self._map: OutputMap = []
        self._program: LoadedProgram | None = None
        self.net: torch.nn.Module | None = None
        self._wrapper: CheckpointOutputs | None = None
        self._sink: list[torch.Tensor] = []
        #: (variant, input shapes) -> the loaded program and the checkpoints its outputs are
        self._programs: dict[tuple[object, ...], tuple[LoadedProgram, list[CheckpointKey]]] = {}
        #: (batch, length, steps) -> the static-cache program of a decode (:mod:`.static_cache`)
        self._decoders: dict[tuple[int, int, int], LoadedMethods] = {}
        #: the program's own seconds per call of the last decode (the prefill first, then each step)
        self.decode_seconds: list[float] = []
        #: one entry per program exported: its variant, shape, file and seconds
        self.exports: list[JsonObject] = []

    # -- availability and record ---------------------------------------------------------------------
    def availability(self) -> tuple[bool, str]:
        import importlib.util

        try:
            found = importlib.util.find_spec("executorch.extension.pybindings._C") is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return False, "executorch is not installed (pip install 'multi-backend-debug-framework[executorch]')"
        return True, ""

    def version_info(self) -> JsonObject:
        info: JsonObject = {
            **super().version_info(),
            "runtime": "executorch",
            "executorch": installed_version("executorch"),
            "torch": installed_version("torch"),
            "device_name": cpu_name(),
            "delegate": "as lowered by its author" if self.model_file else self.delegate,
            "artifact_dir": None if self.artifact_dir is None else str(self.artifact_dir),
        }
        if self.model_file is not None:
            info["model_file"] = str(self.model_file)
            info["outputs_read_as"] = self.outputs_read_as
            info["outputs_file"] = None if self.outputs_file is None else str(self.outputs_file)
            if self.signature is not None:
                info["signature"] = {"inputs": [s.to_dict() for s in self.signature.inputs],
                                     "outputs": [s.to_dict() for s in self.signature.outputs]}
        return info

    def declared_dtype(self, model: LoadedModel) -> tuple[str, str] | None:
        """The precision a user's program computes at (``--dtype auto``): its first floating
        output's type where that is float16 or bfloat16; None for an export of ours (float32)."""
        if self.model_file is None:
            return None
        signature = self.signature or probe_program(self.model_file, self.name)
        self.signature = signature
        found = next((s.dtype for s in signature.outputs if s.dtype.startswith(("float", "bfloat"))), None)
        if found in _LOWER_PRECISIONS:
            return found, f"the outputs of {self.model_file.name} are {found}"
        return None

    def checkpoints(self, model: LoadedModel) -> list[str] | None:
        """The checkpoints a user's program outputs (:mod:`.outputs`), in model order: what a
        session compares; None for the model's own export (every checkpoint)."""
        if self.model_file is None:
            return None
        self.signature = self.signature or probe_program(self.model_file, self.name)
        mapped, _ = output_map(self.signature, model, self._named, str(self.outputs_file or self.model_file))
        return [str(k) for k in all_checkpoints(model.num_layers, model.router_layers) if k in mapped]

    # -- preparation ---------------------------------------------------------------------------------
    def prepare(self, model: LoadedModel, dtype: str | None = None, device: str | None = None) -> None:
        """Build the model to export (its programs are exported on the first run of each input
        shape), or check, probe and load the user's program."""
        if device not in (None, "cpu"):
            raise BackendInitializationError(f"runs ExecuTorch's CPU runtime, not on {device!r}", backend=self.name,
                                             hint="leave --device at cpu")
        self._check_prepare(model, dtype, "cpu")
        self._programs.clear()
        self._decoders.clear()
        self.exports.clear()
        if self.model_file is not None:
            self._prepare_file(model)
            return
        import torch

        from .._graph_capture import CheckpointOutputs
        from ..pytorch import build_hf_model

        self.net = build_hf_model(model, torch.float32, "cpu")
        self._wrapper = CheckpointOutputs.for_model(self.net, model)
        self._sink = self._wrapper._sink  # the hooks' list (torch.export leaves a copy on the wrapper)
        self._artifact_dir()
        self.inspector_evidence = None

    def inspector_record(self) -> JsonObject | None:
        """What ExecuTorch's Inspector said on the session's inputs (:meth:`.InspectorEvidence.to_dict`:
        the gap per place in the model, or why it failed); None where ``inspector`` was not asked for
        or no run happened yet. The session's result keeps it as ``inspector``."""
        return None if self.inspector_evidence is None else self.inspector_evidence.to_dict()

    def _inspect(self, inputs: ModelInputs) -> InspectorEvidence:
        """ExecuTorch's Inspector on the model's logits for ``inputs`` (whole, else row by row)."""
        import torch

        from .._graph_capture import PlainOutput
        from .inspector import numeric_gap

        model = self._prepared()
        batch = tuple(torch.from_numpy(v) for v in graph_inputs(model, inputs).values())
        shape = "x".join(str(d) for d in batch[0].shape)
        path = self._artifact_dir() / f"{model.architecture}-{model.digest[:12]}-{self.delegate}-inspector-{shape}.pte"
        try:
            found = numeric_gap(PlainOutput(self.net), batch, path, self.delegate)
        finally:
            self._sink.clear()
        if not found.ran:
            found.notes.extend(self._known_causes(model))
        return found

    def _known_causes(self, model: LoadedModel) -> list[str]:
        """What is known to make the Inspector fail that this session has (docs/executorch.md)."""
        causes = []
        if self.delegate == "xnnpack":
            causes.append("the program is lowered to XNNPACK's delegate: the Inspector fails on every XNNPACK "
                          "program measured with executorch 1.5.1 (delegate=portable runs it)")
        heads = getattr(model.config, "num_attention_heads", None)
        kv_heads = getattr(model.config, "num_key_value_heads", None) or heads
        if heads and kv_heads and kv_heads < heads:
            causes.append(f"the model uses grouped-query attention ({heads} query heads, {kv_heads} key/value heads), "
                          "for which the Inspector is reported to fail upstream")
        return causes

    def _prepare_file(self, model: LoadedModel) -> None:
        """The user's program: loaded by a child first (a crash there is a DF004 error), then here."""
        assert self.model_file is not None
        self.signature = self.signature or probe_program(self.model_file, self.name)
        source = str(self.outputs_file or self.model_file)
        self._map, self.outputs_read_as = output_map(self.signature, model, self._named, source)
        self._program = load_program(self.model_file)

    def _artifact_dir(self) -> Path:
        """The directory for this run's programs: the one given, else the session's, else a temporary one."""
        if self._temporary is None:  # not yet a temporary directory of its own: the given, claimed or a new one
            self.artifact_dir, self._temporary = run_directory(self, self.artifact_dir, self.name, "df-executorch-")
        return self.artifact_dir

    def release_replays(self) -> None:
        """Drop the layers' and blocks' programs (exported again on need)."""
        for key in [k for k in self._programs if k[0] != "model"]:
            del self._programs[key]

    def close(self) -> None:
        """Drop the programs and remove the temporary artifact directory if this backend made one."""
        self._programs.clear()
        self._decoders.clear()
        self._program = None
        self.model = None
        if self._temporary is not None:
            self._temporary()
            self._temporary, self.artifact_dir = None, None

    # -- the programs of the model's own export -------------------------------------------------------
    def _exported(self, variant: tuple[object, ...], module: torch.nn.Module, args: tuple[torch.Tensor, ...],
                  keys: list[CheckpointKey], stem: str) -> tuple[LoadedProgram, list[CheckpointKey], bool]:
        """The program of ``module`` on ``args``' shapes (``variant`` + the shapes: its cache key),
        exported, lowered and loaded on first use; whether this call made it."""
        key = (*variant, tuple((tuple(a.shape), str(a.dtype)) for a in args))
        if key in self._programs:
            program, out_keys = self._programs[key]
            return program, out_keys, False
        model = self._prepared()
        shape = "x".join(str(d) for d in args[0].shape)
        path = self._artifact_dir() / f"{model.architecture}-{model.digest[:12]}-{self.delegate}-{stem}-{shape}.pte"
        try:
            lowered = lower_to_file(module, args, path, self.delegate, self.name)
        finally:
            self._sink.clear()  # the export traced the checkpoint hooks
        sidecar_path(path).write_text(json.dumps(sidecar_json(keys)), encoding="utf-8")
        program = load_program(path)
        self._programs[key] = (program, keys)
        self.exports.append({"variant": stem, "shape": [list(a.shape) for a in args][:1], "program": str(path),
                             "export_s": round(lowered.export_s, 4), "lower_s": round(lowered.lower_s, 4)})
        return program, keys, True

    def _model_program(self, inputs: ModelInputs) -> tuple[LoadedProgram, list[CheckpointKey], list[torch.Tensor], bool]:
        """The model's program for ``inputs``' shape and what it is fed."""
        import torch

        feeds = [torch.from_numpy(v) for v in graph_inputs(self._prepared(), inputs).values()]
        program, keys, made = self._exported(("model",), self._wrapper, tuple(feeds), list(self._wrapper.keys), "model")
        return program, keys, feeds, made

    # -- running -------------------------------------------------------------------------------------
    def run(self, inputs: ModelInputs, taps: Taps = None, *, capture_layer_inputs: bool = False) -> Capture:
        """Run the program (the model's export for ``inputs``' shape, or the user's) and return the
        requested checkpoints it outputs; one the user's program lacks is left out (reported missing)."""
        keys = self._keys(taps)
        self._check_inputs(inputs)
        model = self._prepared()
        meta: JsonObject = {"variant": "captured" if keys else "plain"}
        if self._program is not None:
            assert self.signature is not None and self.model_file is not None
            feeds = program_feeds(self.signature, model, inputs, str(self.model_file))
            program, out_keys = self._program, self._map
            meta.update(program=str(self.model_file), outputs_read_as=self.outputs_read_as)
        else:
            if self.inspector and self.inspector_evidence is None:  # on the session's inputs: its first run
                self.inspector_evidence = self._inspect(inputs)
            program, out_keys, feeds, made = self._model_program(inputs)  # type: ignore[assignment]
            meta.update(program=str(program.path), exported_in_this_call=made)
        start = time.perf_counter()
        outs = program.run(feeds)
        elapsed = time.perf_counter() - start
        got = {k: out for k, out in zip(out_keys, outs) if k is not None}
        return Capture(tensors={k: got[k] for k in keys if k in got}, backend=self.name, dtype=self.dtype,
                       elapsed_s=elapsed, meta=meta,
                       layer_inputs=layer_inputs_from(got, model.num_layers) if capture_layer_inputs else {})

    def can_decode(self) -> tuple[bool, str]:
        """The model's own export decodes through a static cache in its program (:mod:`.static_cache`);
        a user's program does not."""
        if self.model_file is not None:
            return False, (f"runs {self.model_file.name} as a program of the user's, whose inputs and KV cache it cannot "
                           "know: decode steps run on the model's own export (--alternative-backend executorch "
                           "without --alternative-model), exported with a static KV cache")
        from .static_cache import static_cache_support

        return static_cache_support(self._prepared(), self.net)

    def run_decode(self, inputs: ModelInputs, steps: int, taps: Taps = None, tokens: np.ndarray | None = None) -> DecodeRun:
        """The prefill and ``steps`` decode steps through the program's own static cache, every pass kept."""
        return collect_run(self.iter_decode(inputs, steps, taps, tokens), steps)

    def iter_decode(self, inputs: ModelInputs, steps: int, taps: Taps = None, tokens: np.ndarray | None = None,
                    prefill_taps: Taps = None) -> Iterator[DecodePass]:
        """:meth:`run_decode` pass by pass: the static-cache program (exported on first use for the
        inputs' shape and ``steps``) run as method ``prefill`` on the session's rows, then as
        ``decode`` once per step, each pass's checkpoints and the cache it wrote read from its outputs.

        Raises:
            BackendInitializationError: (DF002) a user's program, or a model whose cache is not static.
        """
        from .static_cache import ProgramDecoder

        ok, why = self.can_decode()
        if not ok:
            raise BackendInitializationError(f"cannot decode: {why}", backend=self.name)
        keys = self._keys(taps)
        first = keys if prefill_taps is None else self._keys(prefill_taps)
        self._check_inputs(inputs)
        wanted = set(keys) | set(first)
        decoder = ProgramDecoder(self._decode_program(inputs, steps), self._wrapper.keys, self._prepared().num_layers,
                                 steps)
        self.decode_seconds = decoder.seconds

        def wrap(tensors: dict[CheckpointKey, torch.Tensor], seconds: float) -> Capture:
            return Capture(tensors={k: v for k, v in tensors.items() if k in wanted}, backend=self.name,
                           dtype=self.dtype, elapsed_s=seconds)

        return iter_runner_decode(self.name, decoder, inputs, steps, keys, tokens, wrap, first)

    def _decode_program(self, inputs: ModelInputs, steps: int) -> LoadedMethods:
        """The static-cache program for ``inputs``' shape and ``steps``, exported, lowered and loaded on first use."""
        from .static_cache import StaticCacheSteps, decode_feeds

        batch, length = (int(d) for d in inputs.input_ids.shape)
        if (batch, length, steps) in self._decoders:
            return self._decoders[(batch, length, steps)]
        import torch

        model = self._prepared()
        module = StaticCacheSteps(self._wrapper, self._sink, batch, length + steps)
        prefill = decode_feeds(inputs, steps)
        step = (prefill[0][:, :1].contiguous(), prefill[1], prefill[2][:, :1].contiguous(),
                torch.tensor([length], dtype=torch.long))
        path = (self._artifact_dir() /
                f"{model.architecture}-{model.digest[:12]}-{self.delegate}-decode{steps}-{batch}x{length}.pte")
        try:
            lowered = lower_methods_to_file({"prefill": (module, prefill), "decode": (module, step)}, path,
                                            self.delegate, self.name)
        finally:
            self._sink.clear()  # the export traced the checkpoint hooks
        program = LoadedMethods(path)
        self._decoders[(batch, length, steps)] = program
        self.exports.append({"variant": f"decode{steps}", "shape": [[batch, length]], "program": str(path),
                             "export_s": round(lowered.export_s, 4), "lower_s": round(lowered.lower_s, 4)})
        return program

    def can_run_layer(self) -> tuple[bool, str]:
        """A layer of the model's own export is exported alone; a user's program is one method."""
        if self.model_file is not None:
            return False, f"runs {self.model_file.name} whole: a layer of a user's program cannot be run alone"
        return True, ""

    def can_run_block(self) -> tuple[bool, str]:
        """A layer's MLP block is exported alone for the from-math families' Hugging Face layout."""
        ok, why = self.can_run_layer()
        if not ok:
            return ok, why
        if self._prepared().architecture == "generic":
            return False, "exports a generic-tier layer whole (its MLP is judged with the whole layer)"
        return True, ""

    def run_layer(self, i: int, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Replay layer ``i`` as ExecuTorch runs it, on ``hidden_in`` (isolation): the layer
        exported alone (once per layer and input shape), called with the arguments the model passes
        it for ``inputs`` (an eager forward stopped at the layer), ``hidden_in`` as its hidden state;
        its ``post_attention:i`` and ``post_mlp:i`` are the program's outputs."""
        import torch

        from .._graph_capture import replay_arguments
        from .._layer_replay import LayerReplay, flatten

        model = self._prepared()
        ok, why = self.can_run_layer()
        if not ok:
            raise BackendInitializationError(f"cannot replay layer {i}: {why}", backend=self.name)
        hidden = torch.as_tensor(hidden_in).detach().to("cpu", torch.float32)
        name, layer, args, kwargs = replay_arguments(self.net, model, i, inputs, hidden, self._sink, "cpu", self.name)
        leaves, spec = flatten((args, kwargs))
        leaves = [t.clone() for t in leaves]  # normal tensors: the eager run made inference-mode ones
        replay = LayerReplay(layer, self._sink, spec).eval()
        program, keys, made = self._exported(("layer", i), replay, tuple(leaves), self._wrapper.keys_within(name),
                                             f"layer{i}")
        start = time.perf_counter()
        outs = program.run(leaves)
        elapsed = time.perf_counter() - start
        wanted = (CheckpointKey("post_attention", i), CheckpointKey("post_mlp", i))
        return Capture(tensors={k: o for k, o in zip(keys, outs) if k in wanted}, backend=self.name, dtype=self.dtype,
                       elapsed_s=elapsed, meta={"variant": f"layer {i}", "exported_in_this_call": made})

    def run_block(self, i: int, block: str, hidden_in: HiddenState, inputs: ModelInputs) -> Capture:
        """Block ``block`` of layer ``i`` on that block's own input: ``"mlp"``, the layer's MLP block
        (:func:`~debug_framework.capture.hooks.hf_mlp_block`) exported alone and run on the
        post-attention state ``hidden_in`` (``post_mlp:i``); ``"attention"``, :meth:`run_layer`'s
        ``post_attention:i``."""
        import torch

        from ...capture.hooks import find_module, hf_layer_modules, hf_mlp_block

        attention = attention_block_or_mlp_checked(self, i, hidden_in, inputs, block)
        if attention is not None:
            return attention
        model = self._prepared()
        layer = find_module(self.net, hf_layer_modules(model.architecture, model.num_layers)[i])
        hidden = torch.as_tensor(hidden_in).detach().to("cpu", torch.float32).clone()
        key = CheckpointKey("post_mlp", i)
        program, _, made = self._exported(("mlp", i), hf_mlp_block(model.architecture, layer).eval(), (hidden,),
                                          [key], f"mlp{i}")
        start = time.perf_counter()
        out = program.run([hidden])[0]
        self._sink.clear()
        return Capture(tensors={key: out}, backend=self.name, dtype=self.dtype, elapsed_s=time.perf_counter() - start,
                       meta={"variant": f"mlp block {i}", "exported_in_this_call": made})

