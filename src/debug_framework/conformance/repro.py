"""The conformance sweep's repro of one sample, in the one repro format
(:mod:`debug_framework.repro_format`, writer ``op-conformance``).

The directory holds the sample's tensors (exact storage, strides and offsets) in
``inputs.safetensors``, ``repro.json`` (the operator's OpInfo name and variant, the backend, the
sample's layout, the rule) and ``repro.py``, which needs torch alone (it reads the safetensors file itself): it finds the
operator in torch's own OpInfo database, compiles it with ``torch.compile`` and the backend (a
registered name, or the backend file copied beside it), runs it eagerly in float64 and in the
sample's dtype, and says ``REPRO: reproduced`` (exit 1) while an output is outside the sweep's
calibrated bound, has another shape or dtype, or the compiled call raises. Where PyTorch's
decomposition computes the operator otherwise than eager's kernel, the output must be outside the
bound against both (as in the sweep, :mod:`.judge`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ..comparison import FLOOR_EPS, NOISE_MARGIN
from ..plugins.evaluate import FLOAT64_FLOOR_EPS
from ..plugins.repro import SAMPLE_DECODER, save_sample
from ..plugins.samples import Sample
from ..jsonio import JsonObject
from ..repro_format import MANIFEST, SAFETENSORS_READER, SCRIPT, read_manifest, script_source, write_repro_files

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo

__all__ = ["write_op_repro", "upgrade_repros"]

_BODY = SAFETENSORS_READER + SAMPLE_DECODER + '''

def flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (bool, int, float, complex)):
        return [torch.tensor(out)]
    return [t for x in out for t in flat(x)]


def real(t):
    t = t.detach().cpu()
    return torch.view_as_real(t.resolve_conj()).double() if t.is_complex() else t.double()


def rmse(x, oracle):
    both = torch.isfinite(x) & torch.isfinite(oracle)
    return float(((x - oracle)[both] ** 2).mean().sqrt()) if both.any() else 0.0


def overflows(x, oracle, big, rel):
    """Infinities of the oracle's sign where the oracle is finite and within rel of the largest value big."""
    if big is None or rel == float("inf"):
        return 0
    return int((x.isinf() & oracle.isfinite() & ((x > 0) == (oracle > 0)) & (oracle.abs() * (1 + rel) >= big)).sum())


def same(a, b):
    """Two lists of tensors bit for bit (NaN where NaN)."""
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and bool(((x == y) | (x.isnan() & y.isnan())).all())
        for x, y in zip(a, b))


def nonfinite_mismatches(x, oracle):
    return int(((~torch.isfinite(x) | ~torch.isfinite(oracle)) & ~((x == oracle) | (x.isnan() & oracle.isnan()))).sum())


def grads(fn, args, kwargs, in_float64):
    """Gradients of sum(output x seeded cotangent) over the floating outputs, for every floating input."""
    leaves = []

    def conv(v):
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            leaf = (v.detach().double() if in_float64 else v.detach()).requires_grad_(True)
            leaves.append(leaf)
            return leaf
        if isinstance(v, list):
            return [conv(x) for x in v]
        return up(v) if in_float64 else v

    a = conv(list(args))
    k = {name: conv(v) for name, v in kwargs.items()}
    outs = [o for o in flat(fn(*a, **k)) if o.is_floating_point() and o.requires_grad]
    gen = torch.Generator().manual_seed(0)
    loss = sum((o * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)).sum() for o in outs)
    found = torch.autograd.grad(loss, leaves, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(found, leaves)]


def load_backend(spec):
    if spec["backend_file"] is None:
        return spec["backend"]
    import importlib.util
    path = os.path.join(HERE, spec["backend_file"])
    module_spec = importlib.util.spec_from_file_location("opsweep_backend", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, spec["backend_attr"])


def check():
    spec = manifest()["check"]
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except Exception as exc:
        raise CannotCheck("torch's OpInfo database cannot be imported: %s" % exc)
    found = [o for o in op_db if o.name == spec["opinfo"] and o.variant_test_name == spec["variant"]]
    if not found:
        raise CannotCheck("this torch has no OpInfo operator %s" % spec["op"])
    op = found[0].op
    storages = load_file(os.path.join(HERE, "inputs.safetensors"))
    args = [value(a, storages, spec["device"]) for a in spec["args"]]
    kwargs = {k: value(v, storages, spec["device"]) for k, v in spec["kwargs"].items()}

    def call(*a, **k):
        return op(*a, **k)

    what = "%s %s %s on sample %s (%s)" % (spec["op"], "run by" if spec.get("runtime") else "compiled with",
                                          spec["backend_label"], spec["sample"]["label"], spec["sample"]["dtype"])
    if spec["grad"]:
        what = "the backward of " + what

        def pair():
            return grads(op, args, kwargs, False), grads(op, args, kwargs, True)
    else:
        def pair():
            return flat(op(*args, **kwargs)), flat(op(*up(args), **up(kwargs)))
    baseline, oracle = pair()
    definitions = [("eager's kernel", baseline, oracle)]
    second = decomposition(pair)
    if second is not None and not all(same(x, y) for x, y in zip(second, (baseline, oracle))):
        definitions.append(("PyTorch's decomposition", second[0], second[1]))
    if spec.get("runtime"):
        return judge(runtime_call(op, spec), args, kwargs, definitions, spec, what)
    backend = load_backend(spec)
    # the sweep compiled each operator once for all its samples, so a sample may have run the graph
    # Dynamo recompiled with dynamic shapes: static shapes first, then dynamic ones
    for dynamic in (False, True):
        torch.compiler.reset()
        compiled = torch.compile(call, backend=backend, dynamic=dynamic)
        result = judge(compiled, args, kwargs, definitions, spec, what + (" with dynamic shapes" if dynamic else ""))
        if result[0]:
            return result
    return result


def decomposition(fn):
    """fn() run by PyTorch's decomposition (what tracing runs), as the sweep's second definition;
    None where this torch cannot."""
    try:
        from torch._dispatch.python import enable_python_dispatcher
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        return None

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    try:
        with enable_python_dispatcher(), PassThrough():
            return fn()
    except Exception:
        return None


def outside(out, baseline, oracle, dtype, spec, what):
    """Why ``out`` is outside the calibrated bound against one definition's pair (None when within)."""
    if len(out) != len(baseline):
        return "%s: %d outputs, eager returns %d" % (what, len(out), len(baseline)), {}
    has_float = any(b.is_floating_point() or b.is_complex() for b in baseline)
    observation = {"outputs": []}
    for i, (o, b, t) in enumerate(zip(oracle, baseline, out)):
        floating = b.is_floating_point() or b.is_complex()
        if t.dtype != b.dtype or t.shape != b.shape:
            return "%s: output %d is %s %s, eager's %s %s" % (what, i, t.dtype, list(t.shape), b.dtype,
                                                            list(b.shape)), observation
        if not floating and has_float:
            continue
        big = torch.finfo(b.dtype).max if b.is_floating_point() else None
        o, b, t = real(o), real(b), real(t)
        k, e = rmse(t, o), rmse(b, o)
        fin = o[torch.isfinite(o)].abs()
        peak = float(fin.max()) if fin.numel() else 0.0
        rms = peak * float(((fin / peak) ** 2).mean().sqrt()) if peak > 0 else 0.0
        eps = torch.finfo(dtype).eps if floating else 0.0
        floor = spec["float64_floor_eps"] if dtype == torch.float64 else spec["floor_eps"]
        bound = spec["margin"] * e + floor * eps * rms
        # an infinity where float64 is finite but within the bound of the largest value: a rounding
        # that overflowed, counted for neither run (as in the sweep)
        rel = bound / rms if rms > 0 else float("inf")
        nonfinite = (nonfinite_mismatches(t, o) - overflows(t, o, big, rel)
                     > nonfinite_mismatches(b, o) - overflows(b, o, big, rel))
        observation["outputs"].append({"output": i, "backend_error": k, "eager_error": e, "bound": bound,
                                       "nonfinite_mismatch": nonfinite})
        if nonfinite or not k <= bound:
            return "%s: output %d RMSE vs float64 eager %.3e, eager in %s %.3e, bound %.3e%s" % (
                what, i, k, spec["sample"]["dtype"], e, bound,
                "; more non-finite mismatches than eager" if nonfinite else ""), observation
    return None, observation


def judge(compiled, args, kwargs, definitions, spec, what):
    """Reproduced while the compiled call is outside the bound against every definition's pair
    (eager's kernel, and PyTorch's decomposition where it computes otherwise), or raises."""
    try:
        out = grads(compiled, args, kwargs, False) if spec["grad"] else flat(compiled(*args, **kwargs))
    except Exception as exc:
        return True, "%s: the compiled call raised %s: %s" % (what, type(exc).__name__, exc), {"raised": str(exc)}
    dtype = getattr(torch, spec["sample"]["dtype"])
    first = None
    for name, baseline, oracle in definitions:
        why, observation = outside(out, baseline, oracle, dtype, spec, what)
        if why is None:
            return False, "%s: every output within the calibrated bound (against %s)" % (what, name), observation
        first = first or (why, observation)
    if len(definitions) > 1:
        first = (first[0] + "; against PyTorch's decomposition too", first[1])
    return True, first[0], first[1]
'''


_RUNTIME_BODY = """

def runtime_call(op, spec):
    \"\"\"The operator as the sweep ran it: exported alone with torch.onnx (dynamo), run by the
    runtime's ``run_graph`` (its source comes from the runtime).\"\"\"

    def split(v, found):
        if isinstance(v, torch.Tensor):
            found.append(v)
            return ("input", len(found) - 1)
        if isinstance(v, (list, tuple)):
            return type(v)(split(x, found) for x in v)
        if isinstance(v, dict):
            return {k: split(x, found) for k, x in v.items()}
        return v

    def fill(v, tensors):
        if isinstance(v, tuple) and len(v) == 2 and v[0] == "input":
            return tensors[v[1]]
        if isinstance(v, (list, tuple)):
            return type(v)(fill(x, tensors) for x in v)
        if isinstance(v, dict):
            return {k: fill(x, tensors) for k, x in v.items()}
        return v

    class OneOp(torch.nn.Module):
        def __init__(self, a, k):
            super().__init__()
            self.a, self.k = a, k

        def forward(self, *tensors):
            return op(*fill(self.a, tensors), **fill(self.k, tensors))

    def call(*args, **kwargs):
        found = []
        a, k = split(list(args), found), split(dict(kwargs), found)
        example = tuple(t.detach().cpu().contiguous() for t in found)
        data = torch.onnx.export(OneOp(a, k), example, dynamo=True, verbose=False).model_proto.SerializeToString()
        return run_graph(data, found, spec)

    return call
"""


def write_op_repro(op: str, info: OpInfo, sample: Sample, folder: Path, *, backend: str, backend_file: str | None,
                   backend_attr: str, device: str, status: str, grad: bool = False, runtime: str | None = None) -> Path:
    """Write the repro of ``sample`` of operator ``op`` into a new directory under ``folder``; the
    path of its ``repro.py``. ``backend_file`` is copied beside it when the backend comes from a file.
    With ``runtime`` the repro exports the operator alone with torch.onnx and runs it by that ONNX
    runtime (which it then needs, with onnx and onnxscript), as the sweep did."""
    out, args, kwargs = save_sample(sample, folder, f"{op}-{sample.dtype}-{sample.source}-{sample.label}")
    local_file = None
    if backend_file is not None:
        local_file = f"backend_{Path(backend_file).name}"
        shutil.copyfile(backend_file, out / local_file)
    check: JsonObject = {"op": op, "opinfo": info.name, "variant": info.variant_test_name, "backend": backend,
                         "backend_file": local_file, "backend_attr": backend_attr,
                         "backend_label": backend if backend_file is None else f"{Path(backend_file).name}:{backend_attr}",
                         "device": device, "margin": NOISE_MARGIN, "floor_eps": FLOOR_EPS,
                         "float64_floor_eps": FLOAT64_FLOOR_EPS, "args": args, "kwargs": kwargs,
                         "sample": sample.describe(), "status": status, "grad": grad}
    if runtime is not None:
        from .runtime_lookup import find_runtime
        from .runtimes import check_runtime

        check.update(runtime=runtime, runtime_target=check_runtime(runtime, device), backend_label=runtime,
                     precision_hint=find_runtime(runtime).precision_hint, device="cpu")
    failure = (f"{'the backward of ' if grad else ''}operator {op} {'run by' if runtime else 'compiled with'} "
               f"{check['backend_label']} differs from eager beyond the calibrated bound "
               f"(or raises) on sample {sample.source}/{sample.label} in {sample.dtype}")
    requires, body = _template(check)
    return write_repro_files(out, writer="op-conformance", failure=failure, body=body, requires=requires,
                             imports=_IMPORTS, check=check)


_IMPORTS = ["import torch"]


def _template(check: JsonObject) -> tuple[list[str], str]:
    """The packages a repro of ``check`` (its manifest's ``check`` entries) needs and its script's body:
    torch alone, or with the runtime's packages and its ``run_graph`` (the runtime asked, never named here)."""
    name = check.get("runtime")
    if not isinstance(name, str):
        return ["torch"], _BODY
    from .runtime_lookup import find_runtime

    runtime = find_runtime(name)
    return ["torch", *runtime.packages], _BODY + _RUNTIME_BODY + runtime.repro_runner


def upgrade_repros(root: Path) -> list[Path]:
    """Rewrite the ``repro.py`` of every conformance repro directory at or under ``root`` to the
    current template (its script is generic: all it knows is in ``repro.json``, which is kept, bar
    ``requires``), so repros written by an older version of the sweep (one that needed the
    safetensors package) run with torch alone; their data files are not touched. The rewritten
    scripts, sorted; directories of other writers are left alone.

    Raises:
        ConfigurationError (DF005): ``root`` is not a directory.
    """
    import json

    from ..errors import ConfigurationError

    if not root.is_dir():
        raise ConfigurationError(f"{root}: not a directory of repros", option="--upgrade-repros")
    done = []
    for found in sorted(root.rglob(MANIFEST)):
        try:
            manifest = read_manifest(found.parent)
        except (OSError, ValueError):
            continue
        if not isinstance(manifest, dict) or manifest.get("writer") != "op-conformance":
            continue
        requires, body = _template(manifest["check"])
        script = script_source(writer="op-conformance", failure=manifest["failure"], body=body, imports=_IMPORTS,
                               requires=requires)
        manifest["requires"] = requires
        found.write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")
        (found.parent / SCRIPT).write_text(script, encoding="utf-8")
        done.append(found.parent / SCRIPT)
    return done
