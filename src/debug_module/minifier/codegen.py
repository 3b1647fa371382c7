"""The minifier's repro directories, in the one repro format (:mod:`debug_framework.repro_format`),
and running them in a fresh process.

Layout of one repro directory::

    repro.py             readable generated code of the graph + the check of the signature
    repro.json           the manifest: the failure, torch/python versions, relevant config flags; its
                         ``check``: the signature, the backend reference, the inputs and parameters
    inputs.safetensors   the graph's inputs (and the parameters it uses), never pickled
    backend_<name>.py    (only for backends that live in user code) a copy of the backend's file

``python repro.py`` says ``REPRO: reproduced`` and exits 1 when the signature reproduces, ``REPRO:
fixed`` and 0 when it does not, ``REPRO: error`` and 2 when the check cannot run; before that its
observation line (``REPRO-OBSERVATION: {json}``) lets a caller verify *which* failure it saw. It
needs torch alone (it reads the safetensors file itself), never this project.
"""

from __future__ import annotations

import builtins
import inspect
import os
import platform
import shutil
import textwrap
import types
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.fx

from debug_framework.jsonio import JsonObject
from debug_framework.repro_format import (INPUTS, OBSERVATION_PREFIX, SAFETENSORS_READER, VerifyResult, verify,
                                          write_repro_files)

from ..errors import MinifierError
from . import _runtime
from .signatures import ConstraintSignature, Signature

__all__ = ["write_repro_dir", "verify_repro", "run_repro", "VerifyResult", "OBSERVATION_PREFIX", "environment_info"]


# --------------------------------------------------------------------------- code of the graph


def _global_import(name: str, obj: object) -> str | None:
    if name in ("inf", "nan"):
        return f"from math import {name}"
    if name == "NoneType":
        return "NoneType = type(None)"
    if isinstance(obj, types.ModuleType):
        return f"import {obj.__name__}" if obj.__name__ == name else f"import {obj.__name__} as {name}"
    if getattr(builtins, name, None) is obj:
        return None
    if obj is torch.device:
        return "from torch import device"
    module, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if module and qual and "." not in qual and "<" not in qual:
        if module == "_operator":
            module = "operator"
        return f"from {module} import {qual}" + ("" if qual == name else f" as {name}")
    raise MinifierError(f"generated code needs global {name}={obj!r}, which cannot be imported by name",
                        hint="minify an ATen graph (make_fx/AOT output) or a Dynamo graph without such objects")


def graph_source(gm: torch.fx.GraphModule) -> tuple[str, list[str], list[tuple[str, str]]]:
    """(class body source, import lines, [(placeholder name, kind)]) for ``gm`` with every ``get_attr``
    turned into a parameter loaded from the safetensors file."""
    code = gm.graph.python_code(root_module="self", verbose=False)
    imports = []
    for name, obj in sorted(code.globals.items()):
        line = _global_import(name, obj)
        if line and line not in imports:
            imports.append(line)
    src = textwrap.indent(code.src.strip("\n"), "    ")
    return src, imports, []


def _placeholder_names(gm: torch.fx.GraphModule) -> list[str]:
    return [n.target for n in gm.graph.nodes if n.op == "placeholder"]


def _param_targets(gm: torch.fx.GraphModule) -> list[str]:
    return sorted({n.target for n in gm.graph.nodes if n.op == "get_attr"})


# --------------------------------------------------------------------------- environment


def environment_info(signature: Signature | None = None) -> JsonObject:
    info: JsonObject = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.version.cuda,
        "default_dtype": str(torch.get_default_dtype()),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "num_threads": torch.get_num_threads(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("MOCK_", "TORCH_COMPILE", "TORCHINDUCTOR_", "TORCHDYNAMO_"))},
    }
    try:
        import safetensors

        info["safetensors"] = safetensors.__version__
    except Exception:  # pragma: no cover
        pass
    backend = signature.backend_ref() if signature is not None else None
    if backend is not None and (backend.kind == "torch_compile" or (backend.module or "").startswith("torch._inductor")):
        from debug_framework._torch import inductor

        info["inductor_config"] = inductor.config_flags()
    return info


# --------------------------------------------------------------------------- writing


def _storage_safe(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous().clone()


def _module_stacks(gm: torch.fx.GraphModule) -> list[JsonObject]:
    """Per compute node of ``gm``, in order: its op and the ``nn_module_stack`` Dynamo recorded (module
    path and class name per entry), so a backend that selects nodes by module (``docs/kerneldiff.md``'s
    ``buggy_backend``) finds them in the repro's traced graph too (:func:`._runtime.restore_module_stacks`)."""
    out: list[JsonObject] = []
    for n in gm.graph.nodes:
        if n.op not in _runtime.COMPUTE_OPS:
            continue
        stack = n.meta.get("nn_module_stack") or {}
        out.append({"op": _runtime.node_op(n),
                    "stack": {str(k): [str(v[0]), getattr(v[1], "__qualname__", str(v[1]))] for k, v in stack.items()}})
    return out


def write_repro_dir(gm: torch.fx.GraphModule, inputs: Sequence[object], signature: Signature, out_dir: str | os.PathLike[str],
                    *, title: str = "", notes: JsonObject | None = None) -> Path:
    """Write a standalone repro of ``signature`` on ``gm(*inputs)`` into ``out_dir`` (created; files replaced).
    Returns the path of ``repro.py``."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = _placeholder_names(gm)
    if len(names) != len(inputs):
        raise MinifierError(f"graph has {len(names)} inputs, {len(inputs)} values given")
    tensors: dict[str, torch.Tensor] = {}
    input_meta: list[JsonObject] = []
    for name, value in zip(names, inputs):
        if isinstance(value, torch.Tensor):
            tensors[f"input.{name}"] = _storage_safe(value)
            input_meta.append({"name": name, "shape": list(value.shape), "stride": list(value.stride()),
                               "dtype": str(value.dtype).removeprefix("torch.")})
        elif value is None or isinstance(value, (bool, int, float)):
            input_meta.append({"name": name, "value": value})
        else:
            raise MinifierError(f"input {name} is a {type(value).__name__}; repros take tensors and numbers")
    params = _param_targets(gm)
    for target in params:
        obj: object = gm
        for part in target.split("."):
            obj = getattr(obj, part)
        if not isinstance(obj, torch.Tensor):
            raise MinifierError(f"attribute {target} is a {type(obj).__name__}, not a tensor")
        tensors[f"param.{target}"] = _storage_safe(obj)
    save_file(tensors, str(out / INPUTS))

    src, imports, _ = graph_source(gm)
    backend = signature.backend_ref()
    backend_json = backend.to_dict() if backend is not None else None
    if backend is not None and backend.kind == "file":
        local = f"backend_{Path(backend.path).stem}.py"
        shutil.copyfile(backend.path, out / local)
        backend_json = {"kind": "file", "path": local, "attr": backend.attr}
    check = {"signature": signature.to_dict(), "signature_text": signature.describe(), "backend": backend_json,
             "nodes": sum(1 for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")),
             "inputs": input_meta, "parameters": params, "module_stacks": _module_stacks(gm), **(notes or {})}
    extra = [i for i in imports if i not in _IMPORTS]
    return write_repro_files(out, writer="minifier", failure=signature.describe(), title=title,
                             body=_body(src, signature), imports=[*_IMPORTS, *extra],
                             requires=["torch"], check=check, environment=environment_info(signature))


#: What every minifier repro imports (the shared head of repro.py adds json, os, sys, traceback).
_IMPORTS = ["import contextlib", "import math", "import operator", "import re", "import torch", "import torch.fx",
            "from torch.utils._python_dispatch import TorchDispatchMode",
            "from torch.utils._pytree import tree_flatten"]


def _observe_source(signature: Signature) -> str:
    if isinstance(signature, ConstraintSignature):
        if not signature.inlinable:
            return textwrap.dedent(f'''
                def observe(model, inputs, spec):
                    raise CannotCheck("the {signature.constraint!r} constraint has no standalone check; "
                                      "check this graph with debug_module.constraints.check_graph")
                ''')
        return textwrap.dedent('''
            def observe(model, inputs, spec):
                # The mock accelerator's constraint check, inlined: every ATen op that runs is checked.
                return observe_constraints(model, inputs, spec["signature"]["constraints"])
            ''')
    load = textwrap.dedent('''
        def compile_graph(model, inputs, spec):
            """Compile the graph with the backend that showed the failure (``spec["backend"]``: repro.json's)."""
            ref = spec["backend"]
            if ref["kind"] == "torch_compile":
                return torch.compile(model, backend=ref["name"])
            if ref["kind"] == "module":
                import importlib
                backend = getattr(importlib.import_module(ref["module"]), ref["attr"])
            else:
                import importlib.util
                path = os.path.join(HERE, ref["path"])
                if not os.path.isfile(path):
                    raise CannotCheck("the backend's file %s is missing" % ref["path"])
                found = importlib.util.spec_from_file_location("repro_backend", path)
                module = importlib.util.module_from_spec(found)
                found.loader.exec_module(module)
                backend = getattr(module, ref["attr"])
            gm = torch.fx.symbolic_trace(backend_copy(model))  # backends compile FX graphs; theirs to edit
            restore_module_stacks(gm, spec.get("module_stacks"))
            return backend(gm, list(inputs))
        ''')
    if signature.kind == "exception":
        return load + textwrap.dedent('''
            def observe(model, inputs, spec):
                return observe_exception(lambda: compile_graph(model, inputs, spec)(*inputs))
            ''')
    return load + textwrap.dedent('''
        def observe(model, inputs, spec):
            return observe_accuracy(model, lambda fresh_inputs: compile_graph(model, fresh_inputs, spec),
                                    inputs, spec["signature"])
        ''')


def _body(src: str, signature: Signature) -> str:
    """The minifier's part of ``repro.py``: the graph, ``load()``, the inlined runtime and ``check()``."""
    runtime = inspect.getsource(_runtime)
    runtime = "\n".join(line for line in runtime.splitlines() if not line.startswith(("import ", "from ")))
    return f'''{SAFETENSORS_READER}
# ----------------------------------------------------------------------------- the minimal graph
class Repro(torch.nn.Module):
    def __init__(self, tensors, parameters):
        super().__init__()
        for target in parameters:
            *path, last = target.split(".")
            mod = self
            for p in path:
                if not hasattr(mod, p):
                    mod.add_module(p, torch.nn.Module())
                mod = getattr(mod, p)
            mod.register_buffer(last, tensors["param." + target])

{src}


def load():
    """The graph (its parameters loaded) and its inputs, in order; tensors are in inputs.safetensors
    under "input.<name>" (stored contiguous) and "param.<target>"."""
    spec = manifest()["check"]
    tensors = load_file(os.path.join(HERE, "inputs.safetensors"))
    inputs = []
    for meta in spec["inputs"]:
        if "value" in meta:
            inputs.append(meta["value"])
            continue
        t = tensors["input." + meta["name"]]
        if list(t.stride()) != meta["stride"]:  # restore the original (non-contiguous) layout
            t = strided_like(t, meta["stride"])
        inputs.append(t)
    return Repro(tensors, spec["parameters"]), inputs


def strided_like(t, stride):
    """``t``'s values in a tensor of its shape with ``stride``, also where elements share memory (an
    expand's stride 0, into which ``copy_`` refuses to write): each element's storage index is computed
    and the values are written there (elements sharing one hold equal values)."""
    if t.numel() == 0:
        return torch.empty_strided(t.shape, stride, dtype=t.dtype)
    span = 1 + sum((d - 1) * st for d, st in zip(t.shape, stride))
    where = torch.arange(span).as_strided(t.shape, stride)
    storage = torch.empty(span, dtype=t.dtype)
    storage[where.reshape(-1)] = t.reshape(-1)
    return storage.as_strided(t.shape, stride)


# ----------------------------------------------------------------------------- checking the signature
# (debug_module/minifier/_runtime.py, inlined)
{runtime}

{_observe_source(signature)}

def check():
    model, inputs = load()
    spec = manifest()["check"]
    observation = observe(model, inputs, spec)
    reproduced = matches(spec["signature"], observation)
    return reproduced, ("" if reproduced else "not seen: ") + spec["signature_text"], observation
'''


# --------------------------------------------------------------------------- verifying


def run_repro(repro: str | os.PathLike[str], signature_dict: JsonObject, *, timeout: float = 300.0,
              isolated: bool = True, python: str | None = None, log: bool = False) -> VerifyResult:
    """Run ``repro.py`` in a fresh interpreter (:func:`debug_framework.repro_format.verify`: cwd a new
    temporary directory, this project unimportable when ``isolated``) and require ``signature_dict``:
    verified when the repro says it reproduced (exit 1) *and* its observation shows that signature.
    A process that dies without a verdict is observed as ``ProcessCrash`` (an exception signature
    may be that crash). With ``log``, ``verify.log`` beside the script keeps what it printed."""
    res = verify(repro, timeout=timeout, isolated=isolated, python=python, log=log)
    if res.verdict is None and res.returncode not in (None, 0, 1, 2) and signature_dict.get("kind") == "exception":
        rc = res.returncode
        why = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        res.observation = {"kind": "exception", "raised": True, "type": "ProcessCrash", "mro": ["ProcessCrash"],
                           "message": f"process died ({why}): {res.stderr[-1000:]}"}
        res.reproduced = _runtime.matches(signature_dict, res.observation)
    else:
        res.reproduced = res.reproduced and _runtime.matches(signature_dict, res.observation)
    return res


def verify_repro(repro: str | os.PathLike[str], signature: Signature, *, timeout: float = 300.0) -> VerifyResult:
    """Run a written repro where this project cannot be imported and require ``signature``."""
    return run_repro(repro, signature.to_dict(), timeout=timeout, isolated=True, log=True)
