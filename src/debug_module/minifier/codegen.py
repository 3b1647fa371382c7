"""Standalone repro directories, and running them in a fresh process.

Layout of one repro directory::

    repro.py             readable generated code of the graph + the check of the signature
    inputs.safetensors   the graph's inputs (and the parameters it uses), never pickled
    environment.json     torch/python versions, relevant config flags, the signature, sizes
    README.md            one line: how to run it
    backend_<name>.py    (only for backends that live in user code) a copy of the backend's file

``python repro.py`` exits 1 when the signature reproduces, 0 when it does not, 2 when the check
cannot run; it prints ``DEBUG_MODULE_OBSERVATION {json}`` so a caller can verify *which* failure
it saw. It needs torch and safetensors, never this project.
"""

from __future__ import annotations

import builtins
import datetime as _dt
import inspect
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx

from ..errors import MinifierError
from . import _runtime
from .signatures import ConstraintSignature, Signature

__all__ = ["write_repro_dir", "verify_repro", "VerifyResult", "OBSERVATION_PREFIX", "environment_info"]

OBSERVATION_PREFIX = "DEBUG_MODULE_OBSERVATION "

# In the fresh process: make this project unimportable, then run the script as __main__.
_BOOT = (
    "import runpy, sys\n"
    "for _m in ('debug_module', 'debug_framework'):\n"
    "    sys.modules[_m] = None\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


# --------------------------------------------------------------------------- code of the graph


def _global_import(name: str, obj: Any) -> str | None:
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


def environment_info(signature: Signature | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {
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


def write_repro_dir(gm: torch.fx.GraphModule, inputs: Sequence[Any], signature: Signature, out_dir: str | os.PathLike[str],
                    *, title: str = "", notes: dict[str, Any] | None = None) -> Path:
    """Write a standalone repro of ``signature`` on ``gm(*inputs)`` into ``out_dir`` (created; files replaced).
    Returns the path of ``repro.py``."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = _placeholder_names(gm)
    if len(names) != len(inputs):
        raise MinifierError(f"graph has {len(names)} inputs, {len(inputs)} values given")
    tensors: dict[str, torch.Tensor] = {}
    input_meta: list[dict[str, Any]] = []
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
        obj: Any = gm
        for part in target.split("."):
            obj = getattr(obj, part)
        if not isinstance(obj, torch.Tensor):
            raise MinifierError(f"attribute {target} is a {type(obj).__name__}, not a tensor")
        tensors[f"param.{target}"] = _storage_safe(obj)
    save_file(tensors, str(out / "inputs.safetensors"))

    src, imports, _ = graph_source(gm)
    sig = signature.to_dict()
    backend = signature.backend_ref()
    backend_json = backend.to_dict() if backend is not None else None
    if backend is not None and backend.kind == "file":
        local = f"backend_{Path(backend.path).stem}.py"
        shutil.copyfile(backend.path, out / local)
        backend_json = {"kind": "file", "path": local, "attr": backend.attr}

    env = environment_info(signature)
    env.update({"signature": sig, "signature_text": signature.describe(), "backend": backend_json,
                "nodes": sum(1 for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")),
                "inputs": input_meta, "parameters": params,
                "generated": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")})
    env.update(notes or {})
    (out / "environment.json").write_text(json.dumps(env, indent=2, default=str) + "\n", encoding="utf-8")
    script = _script(src, imports, sig, signature, backend_json, input_meta, params, title)
    (out / "repro.py").write_text(script, encoding="utf-8")
    (out / "README.md").write_text(
        f"Run `python repro.py` (needs torch + safetensors only): exits 1 when it reproduces "
        f"{signature.describe()}, 0 when it does not.\n", encoding="utf-8")
    return out / "repro.py"


def _observe_source(signature: Signature, backend_json: dict[str, Any] | None) -> str:
    if isinstance(signature, ConstraintSignature):
        if not signature.inlinable:
            return textwrap.dedent(f'''
                def observe(model, inputs):
                    print("the {signature.constraint!r} constraint has no standalone check; "
                          "check this graph with debug_module.constraints.check_graph", file=sys.stderr)
                    sys.exit(2)
                ''')
        return textwrap.dedent('''
            def observe(model, inputs):
                # The mock accelerator's constraint check, inlined: every ATen op that runs is checked.
                return observe_constraints(model, inputs, SIGNATURE["constraints"])
            ''')
    load = textwrap.dedent('''
        def compile_graph(model, inputs):
            """Compile the graph with the backend that showed the failure."""
            ref = BACKEND
            if ref["kind"] == "torch_compile":
                return torch.compile(model, backend=ref["name"])
            if ref["kind"] == "module":
                import importlib
                backend = getattr(importlib.import_module(ref["module"]), ref["attr"])
            else:
                import importlib.util
                spec = importlib.util.spec_from_file_location("repro_backend", os.path.join(HERE, ref["path"]))
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                backend = getattr(module, ref["attr"])
            gm = torch.fx.symbolic_trace(model)  # backends compile FX graphs
            return backend(gm, list(inputs))
        ''')
    if signature.kind == "exception":
        return load + textwrap.dedent('''
            def observe(model, inputs):
                return observe_exception(lambda: compile_graph(model, inputs)(*inputs))
            ''')
    return load + textwrap.dedent('''
        def observe(model, inputs):
            ratio = SIGNATURE.get("ratio")
            try:
                with torch.no_grad():
                    ref = model(*reference_inputs(inputs, SIGNATURE["reference"]))
                    alt = compile_graph(model, inputs)(*inputs)
                    base = model(*inputs) if ratio else None
            except Exception as e:
                return {"kind": "accuracy", "error": "%s: %s" % (type(e).__name__, e)}
            if ratio:
                return {"kind": "accuracy",
                        "outputs": ratio_outputs(ref, base, alt, ratio["multiplier"], ratio["floor"],
                                                 ratio.get("floor_rms", 0.0))}
            return {"kind": "accuracy", "outputs": compare_outputs(ref, alt, SIGNATURE["rtol"], SIGNATURE["atol"])}
        ''')


def _script(src: str, imports: list[str], sig: dict[str, Any], signature: Signature, backend_json: dict[str, Any] | None,
            input_meta: list[dict[str, Any]], params: list[str], title: str) -> str:
    runtime = inspect.getsource(_runtime)
    runtime = "\n".join(line for line in runtime.splitlines()
                        if not line.startswith(("import ", "from ")))
    doc = (title + "\n\n" if title else "") + (
        f"Expected failure: {signature.describe()}.\n"
        f"Run: python repro.py   (exit 1: reproduced, 0: not reproduced, 2: cannot check)\n"
        f"Generated by debug_module.minifier with torch {torch.__version__}; needs only torch and safetensors.")
    header_imports = ["import json", "import math", "import operator", "import os", "import re", "import sys",
                      "import traceback", "",
                      "import torch", "import torch.fx", "from safetensors.torch import load_file",
                      "from torch.utils._python_dispatch import TorchDispatchMode",
                      "from torch.utils._pytree import tree_flatten"]
    extra = [i for i in imports if i not in header_imports and i != "import torch"]
    return f'''#!/usr/bin/env python3
"""{doc}
"""
{chr(10).join(header_imports)}
{chr(10).join(extra)}

sys.dont_write_bytecode = True  # leave the repro directory as it is
HERE = os.path.dirname(os.path.abspath(__file__))
SIGNATURE = json.loads(r"""{json.dumps(sig)}""")
BACKEND = json.loads(r"""{json.dumps(backend_json)}""")
# Inputs in order; tensors are in inputs.safetensors under "input.<name>" (stored contiguous).
INPUTS = json.loads(r"""{json.dumps(input_meta)}""")
PARAMETERS = {json.dumps(params)}


# ----------------------------------------------------------------------------- the minimal graph
class Repro(torch.nn.Module):
    def __init__(self, tensors):
        super().__init__()
        for target in PARAMETERS:
            *path, last = target.split(".")
            mod = self
            for p in path:
                if not hasattr(mod, p):
                    mod.add_module(p, torch.nn.Module())
                mod = getattr(mod, p)
            mod.register_buffer(last, tensors["param." + target])

{src}


def load():
    tensors = load_file(os.path.join(HERE, "inputs.safetensors"))
    inputs = []
    for meta in INPUTS:
        if "value" in meta:
            inputs.append(meta["value"])
            continue
        t = tensors["input." + meta["name"]]
        if list(t.stride()) != meta["stride"]:  # restore the original (non-contiguous) layout
            t = torch.empty_strided(meta["shape"], meta["stride"], dtype=t.dtype).copy_(t)
        inputs.append(t)
    return Repro(tensors), inputs


# ----------------------------------------------------------------------------- checking the signature
# (debug_module/minifier/_runtime.py, inlined)
{runtime}

{_observe_source(signature, backend_json)}

def main():
    model, inputs = load()
    obs = observe(model, inputs)
    print("{OBSERVATION_PREFIX}" + json.dumps(obs, default=str))
    if matches(SIGNATURE, obs):
        print("REPRODUCED: " + {signature.describe()!r})
        return 1
    print("NOT REPRODUCED: " + {signature.describe()!r})
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


# --------------------------------------------------------------------------- verifying


@dataclass
class VerifyResult:
    """What a fresh process running ``repro.py`` showed."""

    reproduced: bool
    returncode: int | None
    observation: dict[str, Any] | None
    stdout: str = ""
    stderr: str = ""
    command: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"reproduced": self.reproduced, "returncode": self.returncode, "observation": self.observation,
                "stdout_tail": self.stdout[-2000:], "stderr_tail": self.stderr[-2000:], "command": self.command,
                "seconds": round(self.seconds, 3)}


def _parse_observation(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(OBSERVATION_PREFIX):
            try:
                return json.loads(line[len(OBSERVATION_PREFIX):])
            except json.JSONDecodeError:
                return None
    return None


def run_repro(repro: str | os.PathLike[str], signature_dict: dict[str, Any], *, timeout: float = 300.0,
              isolated: bool = True, python: str | None = None) -> VerifyResult:
    """Run ``repro.py`` in a fresh interpreter (``-I``, no PYTHONPATH, cwd a new temporary directory,
    this project's packages made unimportable when ``isolated``) and match its observation."""
    import time

    repro = Path(repro).resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    cmd = [python or sys.executable, "-I", "-c", _BOOT, str(repro)] if isolated else [python or sys.executable, str(repro)]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dm-repro-") as cwd:
        try:
            proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            return VerifyResult(False, None, None, str(e.stdout or ""), f"timed out after {timeout}s", cmd,
                                time.perf_counter() - t0)
    obs = _parse_observation(proc.stdout)
    if obs is None and signature_dict.get("kind") == "exception" and proc.returncode not in (0, 1, 2):
        rc = proc.returncode
        why = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        obs = {"kind": "exception", "raised": True, "type": "ProcessCrash", "mro": ["ProcessCrash"],
               "message": f"process died ({why}): {proc.stderr[-1000:]}"}
        reproduced = _runtime.matches(signature_dict, obs)
    else:
        reproduced = proc.returncode == 1 and _runtime.matches(signature_dict, obs)
    return VerifyResult(reproduced, proc.returncode, obs, proc.stdout, proc.stderr, cmd, time.perf_counter() - t0)


def verify_repro(repro: str | os.PathLike[str], signature: Signature, *, timeout: float = 300.0) -> VerifyResult:
    """Run a written repro where this project cannot be imported and require ``signature``."""
    return run_repro(repro, signature.to_dict(), timeout=timeout, isolated=True)
