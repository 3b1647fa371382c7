"""The generic tier (issue 26): its cost beside the NumPy-reference session, and its diagnosis on
families without a reference written from the math, beside plain allclose.

* **cost**: one tiny Llama validated against eager PyTorch with its reference written from the math
  (``python_reference``, the default for Llama) and with the generic tier's reference
  (``float64_eager``: the model's own eager code in float64; calibration by the same code at the
  alternative's precision), same inputs and settings, median wall time of whole sessions (create +
  run). Target: the generic session at most 1.5x the NumPy-reference one (measured, not asserted).
* **diagnosis**: injected bugs in new families (a wrong attention scale in Mistral, a dropped q-norm
  in Qwen3, two swapped experts in Mixtral; layer 1 each) and the correct pair (eager PyTorch in
  float32) per family, over seeds: detected, localized (error source = layer 1 and the buggy block,
  introducing layers exactly [1]) and false alarms, for the defaults (calibrated, isolation) and for
  plain allclose at torch.testing's float32 defaults (no calibration, no isolation).

    python -m benchmarks.bench_generic [--seeds 5] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _scale_attention(net: Any) -> None:
    net.model.layers[1].self_attn.scaling *= 1.5


def _drop_q_norm(net: Any) -> None:
    import torch

    net.model.layers[1].self_attn.q_norm = torch.nn.Identity()


def _swap_experts(net: Any) -> None:
    import torch

    experts = net.model.layers[1].mlp.experts
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            w = getattr(experts, name)
            w.copy_(w[[1, 0, 2, 3]])


#: (family, bug name, injection, the block it lives in)
BUGS: list[tuple[str, str, Callable[[Any], None], str]] = [
    ("mistral", "attention scale x1.5", _scale_attention, "attention"),
    ("qwen3", "q-norm dropped", _drop_q_norm, "attention"),
    ("mixtral", "experts 0 and 1 swapped", _swap_experts, "mlp"),
]
ALLCLOSE = {"calibrate": False, "isolate": False, "precision_thresholds": {"rtol": 1.3e-6, "atol": 1e-5}}


def _session(engine: Any, path: Path, config: dict[str, Any], reference: str, alternative: str) -> dict[str, Any]:
    sid = engine.create_session(path, config, reference, alternative)
    return engine.run(sid).to_dict()


def _bug_backend(name: str, inject: Callable[[Any], None]) -> None:
    from debug_framework.backends import module_backend, register_backend
    from debug_framework.backends.pytorch import build_hf_model

    def builder(model: Any, dtype: Any, device: str) -> Any:
        net = build_hf_model(model, dtype, device)
        inject(net)
        return net

    register_backend(name, module_backend(name, builder), replace=True)


def cost(root: Path, repeats: int, shape: list[int]) -> dict[str, float]:
    """Median session seconds: reference from the math vs the generic tier's, on one tiny Llama."""
    from benchmarks.models.tiny_transformers import make_model
    from debug_framework.services.validation_engine import ValidationEngine

    path = make_model("llama", root / "llama")
    engine = ValidationEngine(database_path=root / "cost.db")
    config = {"input_shape": shape}
    times: dict[str, list[float]] = {"python_reference": [], "float64_eager": []}
    for _ in range(repeats + 1):  # the first round warms imports and caches up
        for reference in times:
            start = time.perf_counter()
            out = _session(engine, path, config, reference, "pytorch")
            times[reference].append(time.perf_counter() - start)
            assert out["verdict"] == "passed", (reference, out["first_divergence"])
    return {k: statistics.median(v[1:]) for k, v in times.items()}


def diagnosis(root: Path, seeds: int, shape: list[int]) -> dict[str, dict[str, list[int]]]:
    """Per judge: [detected, localized, cases] over the bugs and [false alarms, correct cases]."""
    from benchmarks.models import tiny_generic
    from debug_framework.backends import unregister_backend
    from debug_framework.services.validation_engine import ValidationEngine

    engine = ValidationEngine(database_path=root / "diag.db")
    tally = {"defaults (calibrated)": {"bugs": [0, 0, 0], "correct": [0, 0]},
             "allclose @ torch.testing": {"bugs": [0, 0, 0], "correct": [0, 0]}}
    for seed in range(seeds):
        for family, _, inject, block in BUGS:
            path = tiny_generic.save(family, root / f"seed{seed}", seed=seed)
            name = f"bench_bug_{family}"
            _bug_backend(name, inject)
            try:
                for judge, extra in (("defaults (calibrated)", {}), ("allclose @ torch.testing", ALLCLOSE)):
                    config = {"input_shape": shape, "seed": seed, **extra}
                    out = _session(engine, path, config, "auto", name)
                    t = tally[judge]["bugs"]
                    t[2] += 1
                    if out["verdict"] == "failed":
                        t[0] += 1
                        src = out["error_source"] or {}
                        first = (out["first_divergence"] or {}).get("layer")
                        if extra:  # no isolation: the first divergence is all it says
                            t[1] += int(first == 1)
                        else:
                            t[1] += int((src.get("layer"), src.get("block")) == (1, block)
                                        and out["introducing_layers"] == [1])
                    good = _session(engine, path, config, "auto", "pytorch")
                    tally[judge]["correct"][1] += 1
                    tally[judge]["correct"][0] += int(good["verdict"] != "passed")
            finally:
                unregister_backend(name)
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one seed, one repeat")
    args = parser.parse_args(argv)
    seeds, repeats = (1, 1) if args.quick else (args.seeds, args.repeats)
    import torch

    torch.set_num_threads(1)  # tiny models: one thread is fastest and steadiest
    shape = [2, 16]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        times = cost(root, repeats, shape)
        ratio = times["float64_eager"] / times["python_reference"]
        print(f"session cost (tiny llama vs pytorch, median of {repeats}): python_reference "
              f"{times['python_reference']:.3f} s, float64_eager {times['float64_eager']:.3f} s, "
              f"ratio {ratio:.2f}x (target <= 1.5x)")
        tally = diagnosis(root, seeds, shape)
    for judge, t in tally.items():
        det, loc, n = t["bugs"]
        fa, good = t["correct"]
        print(f"{judge:<26} detected {det}/{n} ({100 * det / max(n, 1):.0f} %), localized {loc}/{n} "
              f"({100 * loc / max(n, 1):.0f} %), false alarms {fa}/{good}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
