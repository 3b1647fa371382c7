"""Fuzzing ``load_model``: hundreds of mutated models over every format, each a DF004 or a correct load.

Deterministic (seeded) mutations of tiny models: truncations, byte flips, insertions, safetensors
headers that lie (dtype, shape, offsets, length), config.json garbage (every key given values of
the wrong type or out of bounds, whole-file garbage, JSON bombs), shard-index garbage, and .bin
pickles carrying payloads that must never run. A worker process loads the cases one by one; each
case has its own timeout (a hang is reported and the worker restarted past it), and after the run
no payload's marker file exists.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import select
import shutil
import struct
import subprocess
import sys
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ._tiny_files import BERT_CONFIG, LLAMA_CONFIG, tiny_state, write_model

CHILD = Path(__file__).with_name("_fuzz_child.py")
CASE_TIMEOUT_S = 15.0
MIN_CASES = 300

GARBAGE: list[Any] = ["x", "", "1e309", [1], [], {}, {"a": 1}, None, True, False, -1, 0, 2**31, 10**30, 1.5,
                      float("nan"), float("inf"), -1e-9, [[[[1]]]], "silu"]


class Cases:
    """Case directories under ``root``, each a copy of a base model with one mutation."""

    def __init__(self, root: Path, rng: random.Random) -> None:
        self.root, self.rng = root, rng
        self.items: list[dict[str, Any]] = []
        self.markers: list[Path] = []

    def add(self, base: Path, kind: str, mutate: Callable[[Path], Path | None]) -> None:
        """Copy the base model's directory and apply ``mutate`` (given the copy's load path; it may
        return another path to load)."""
        src_dir = base if base.is_dir() else base.parent
        case_dir = self.root / f"c{len(self.items):04d}"
        shutil.copytree(src_dir, case_dir)
        load = case_dir if base.is_dir() else case_dir / base.name
        load = mutate(load) or load
        self.items.append({"path": str(load), "kind": kind})


# ----------------------------------------------------------------------------- byte-level mutations
def _weight_file(load: Path, rng: random.Random) -> Path:
    if load.is_file():
        return load
    return rng.choice(sorted(p for p in load.iterdir() if p.suffix in (".safetensors", ".bin", ".zt")))


def _truncate(at: Callable[[int], int]) -> Callable[[Path], None]:
    def mutate(load: Path) -> None:
        f = _weight_file(load, random.Random(str(load)))
        data = f.read_bytes()
        f.write_bytes(data[: at(len(data))])
    return mutate


def _flip(rng: random.Random, count: int, header_only: bool) -> Callable[[Path], None]:
    seed = rng.random()

    def mutate(load: Path) -> None:
        r = random.Random(seed)
        f = _weight_file(load, r)
        data = bytearray(f.read_bytes())
        limit = len(data)
        if header_only and f.suffix == ".safetensors":
            limit = min(limit, 8 + struct.unpack("<Q", bytes(data[:8]))[0])
        for _ in range(count):
            i = r.randrange(limit)
            data[i] ^= r.randrange(1, 256)
        f.write_bytes(bytes(data))
    return mutate


def _splice(rng: random.Random) -> Callable[[Path], None]:
    seed = rng.random()

    def mutate(load: Path) -> None:
        r = random.Random(seed)
        f = _weight_file(load, r)
        data = f.read_bytes()
        i = r.randrange(len(data))
        junk = bytes(r.randrange(256) for _ in range(r.randrange(1, 16)))
        f.write_bytes(data[:i] + junk + data[i + r.randrange(0, 16):])
    return mutate


def byte_cases(cases: Cases, base: Path, fmt: str) -> None:
    rng = cases.rng
    for frac in (0.0, 0.001, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99):
        cases.add(base, f"{fmt}:truncate", _truncate(lambda n, frac=frac: int(n * frac)))
    for k in (1, 7, 8, 9, 16):
        cases.add(base, f"{fmt}:truncate", _truncate(lambda n, k=k: min(k, n)))
    cases.add(base, f"{fmt}:truncate", _truncate(lambda n: n - 1))
    for _ in range(10):
        cases.add(base, f"{fmt}:flip-header", _flip(rng, rng.randrange(1, 4), header_only=True))
    for _ in range(6):
        cases.add(base, f"{fmt}:flip", _flip(rng, rng.randrange(1, 8), header_only=False))
    for _ in range(4):
        cases.add(base, f"{fmt}:splice", _splice(rng))


# ----------------------------------------------------------------------------- safetensors header lies
def _edit_header(edit: Callable[[dict[str, Any], random.Random], Any], seed: float,
                 length: Callable[[int], int] = lambda n: n) -> Callable[[Path], None]:
    def mutate(load: Path) -> None:
        r = random.Random(seed)
        f = _weight_file(load, r)
        data = f.read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        out = edit(header, r)
        text = (out if isinstance(out, bytes) else json.dumps(header).encode())
        f.write_bytes(struct.pack("<Q", length(len(text))) + text + data[8 + n:])
    return mutate


def _some_tensor(header: dict[str, Any], r: random.Random) -> str:
    return r.choice(sorted(k for k in header if k != "__metadata__"))


def header_cases(cases: Cases, base: Path, fmt: str) -> None:
    rng = cases.rng

    def set_field(field: str, value: Any) -> Callable[[dict[str, Any], random.Random], None]:
        def edit(h: dict[str, Any], r: random.Random) -> None:
            h[_some_tensor(h, r)][field] = value
        return edit

    for dtype in ("F16", "BF16", "F64", "I32", "I64", "U8", "BOOL", "F8_E4M3", "C64", "XYZ", 5, None):
        cases.add(base, f"{fmt}:dtype-lie", _edit_header(set_field("dtype", dtype), rng.random()))
    for shape in ([], [0], [2**40], [-1], "x", [1.5], [2**64], None):
        cases.add(base, f"{fmt}:shape-lie", _edit_header(set_field("shape", shape), rng.random()))
    for offsets in ([0, 0], [8, 0], [0, 2**40], [-4, 4], ["a", "b"], [0], None, [2**64, 2**64 + 4]):
        cases.add(base, f"{fmt}:offsets-lie", _edit_header(set_field("data_offsets", offsets), rng.random()))

    def transpose(h: dict[str, Any], r: random.Random) -> None:
        name = r.choice(sorted(k for k in h if k != "__metadata__" and len(h[k]["shape"]) == 2))
        h[name]["shape"] = h[name]["shape"][::-1]

    def rename(h: dict[str, Any], r: random.Random) -> None:
        name = _some_tensor(h, r)
        h[name.replace("layers.1", "layers.7").replace("norm", "nrom") + ".x"] = h.pop(name)

    def duplicate_key(h: dict[str, Any], r: random.Random) -> bytes:
        name = _some_tensor(h, r)
        text = json.dumps(h)
        return text[:-1].encode() + b', "' + name.encode() + b'": ' + json.dumps(h[name]).encode() + b"}"

    def metadata(value: Any) -> Callable[[dict[str, Any], random.Random], None]:
        return lambda h, r: h.__setitem__("__metadata__", value)

    def extra_layer(h: dict[str, Any], r: random.Random) -> None:
        name = _some_tensor(h, r)
        h["model.layers.5." + name.split(".")[-2] + ".weight"] = dict(h[name])

    for edit in (transpose, rename, duplicate_key, metadata([1]), metadata({"a": {"b": 1}}), metadata("x"),
                 extra_layer, lambda h, r: b"[" * 5000 + b"]" * 5000, lambda h, r: b'{"a": ' + b"9" * 5000 + b"}",
                 lambda h, r: b"{}", lambda h, r: b"\xff\xfe{}", lambda h, r: b"null"):
        cases.add(base, f"{fmt}:header-lie", _edit_header(edit, rng.random()))
    for length in (lambda n: n + 1, lambda n: n - 1, lambda n: 0, lambda n: 2**63, lambda n: 2**64 - 1):
        cases.add(base, f"{fmt}:length-lie", _edit_header(lambda h, r: None, rng.random(), length))


# ----------------------------------------------------------------------------- config.json garbage
def _write_json_text(name: str, text: str | bytes) -> Callable[[Path], None]:
    def mutate(load: Path) -> None:
        d = load if load.is_dir() else load.parent
        (d / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return mutate


def _set_config(changes: dict[str, Any]) -> Callable[[Path], None]:
    def mutate(load: Path) -> None:
        d = load if load.is_dir() else load.parent
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(changes)
        (d / "config.json").write_text(json.dumps(cfg))
    return mutate


def config_cases(cases: Cases, base: Path, config: dict[str, Any], fmt: str, per_key: int) -> None:
    rng = cases.rng
    keys = [*config, "rope_scaling", "rope_parameters", "rope_theta", "attention_bias", "mlp_bias", "layer_types",
            "partial_rotary_factor", "position_embedding_type", "is_decoder"]
    for key in keys:
        for value in rng.sample(GARBAGE, per_key):
            cases.add(base, f"{fmt}:config-{key}", _set_config({key: value}))
    rope_garbage = [{"rope_type": "yarn", "factor": 2.0}, {"type": "dynamic", "factor": 2.0}, {"rope_type": "linear"},
                    {"rope_type": "llama3", "factor": 8.0}, {"rope_type": "linear", "factor": "x"},
                    {"rope_type": "linear", "factor": 2.0, "rope_theta": -1}, {"rope_type": ["linear"]},
                    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0}]
    for rope in rope_garbage:
        cases.add(base, f"{fmt}:config-rope", _set_config({rng.choice(["rope_scaling", "rope_parameters"]): rope}))
    whole = [b"", b"{", b"null", b"[]", b'"x"', b"\xff\xfe\x00", b"[" * 100_000 + b"]" * 100_000,
             b'{"vocab_size": ' + b"7" * 5000 + b"}", json.dumps({**config, "x": "y" * 10}).encode()[:-3],
             json.dumps({**config, "deep": json.loads("[" * 200 + "]" * 200)}).encode()]
    for text in whole:
        cases.add(base, f"{fmt}:config-file", _write_json_text("config.json", text))


# ----------------------------------------------------------------------------- shard-index garbage
def _edit_index(edit: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def mutate(load: Path) -> None:
        f = load / "model.safetensors.index.json"
        index = json.loads(f.read_text())
        out = edit(index)
        f.write_bytes(out if isinstance(out, bytes) else json.dumps(index).encode())
    return mutate


def index_cases(cases: Cases, base: Path) -> None:
    for value in (["a"], "model.safetensors", None, 3, {}, {"a": 1}, {"a": None}, [[["x"]]]):
        cases.add(base, "index:weight_map", _edit_index(lambda i, v=value: i.__setitem__("weight_map", v)))

    def set_shard(name: Any) -> Callable[[dict[str, Any]], None]:
        def edit(i: dict[str, Any]) -> None:
            i["weight_map"][sorted(i["weight_map"])[0]] = name
        return edit

    for name in ("../outside.safetensors", "/etc/passwd", "", ".", "..", "a\x00b.safetensors", "sub/x.safetensors",
                 "missing.safetensors", 5, None, "config.json", "model-00002-of-00002.safetensors"):
        cases.add(base, "index:shard-name", _edit_index(set_shard(name)))
    for whole in (b"", b"{", b"null", b"[]", b"[" * 100_000, b'{"weight_map": ' + b"1" * 5000 + b"}",
                  b'{"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}'):
        cases.add(base, "index:file", _edit_index(lambda i, w=whole: w))
    cases.add(base, "index:drop-entry", _edit_index(lambda i: i["weight_map"].pop(sorted(i["weight_map"])[-1])))

    def fifo(name: str) -> Callable[[Path], None]:
        def mutate(load: Path) -> None:
            (load / name).unlink()
            os.mkfifo(load / name)
        return mutate

    for name in ("model.safetensors.index.json", "config.json", "model-00001-of-00002.safetensors"):
        cases.add(base, "fifo", fifo(name))


# ----------------------------------------------------------------------------- pickles
class _Payload:
    """Unpickling this runs ``func(*args)``: the payload that must never run."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args


def _payloads(marker: Path) -> list[_Payload]:
    import builtins

    return [
        _Payload(os.system, f"touch {marker}"),
        _Payload(builtins.open, str(marker), "w"),
        _Payload(builtins.exec, f"open({str(marker)!r}, 'w').close()"),
        _Payload(subprocess.call, ["touch", str(marker)]),
        _Payload(shutil.copy, __file__, str(marker)),
    ]


def _torch_zip_with_pickle(good: bytes, payload: bytes) -> bytes:
    """A torch.save zip archive whose ``data.pkl`` is replaced by ``payload``."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(good)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            dst.writestr(item, payload if item.filename.endswith("data.pkl") else data)
    return out.getvalue()


def pickle_cases(cases: Cases, base_bin: Path) -> None:
    good = base_bin.read_bytes()
    state = tiny_state(LLAMA_CONFIG)
    for n in range(len(_payloads(cases.root / "MARKER"))):
        for proto in (2, 4, 5):
            marker = cases.root / f"marker-{n}-{proto}"
            cases.markers.append(marker)
            evil = pickle.dumps({"model.norm.weight": _payloads(marker)[n]}, protocol=proto)
            blob = _torch_zip_with_pickle(good, evil) if proto != 2 else evil
            cases.add(base_bin, "bin:payload", _write_bytes(blob))
    odd_states: list[Any] = [
        {**state, 7: torch.ones(2)}, {**state, "model.norm.weight": state["model.norm.weight"].to_sparse()},
        {**state, "model.norm.weight": state["model.norm.weight"].to(torch.complex64)},
        {**state, "model.norm.weight": state["model.norm.weight"].to(torch.int32)},
        {**state, "model.norm.weight": state["model.norm.weight"].to(torch.bool)},
        {**state, "x": "not a tensor"}, [state["model.norm.weight"]], {"state_dict": state}, {"state_dict": 5},
        {k: v.to(torch.bfloat16) for k, v in state.items()}, {k: v.t() if v.ndim == 2 else v for k, v in state.items()},
        torch.ones(3), None,
    ]
    for obj in odd_states:
        buf = io.BytesIO()
        torch.save(obj, buf)
        cases.add(base_bin, "bin:odd-state", _write_bytes(buf.getvalue()))


def _write_bytes(blob: bytes) -> Callable[[Path], None]:
    def mutate(load: Path) -> None:
        load.write_bytes(blob)
    return mutate


# ----------------------------------------------------------------------------- the run
def build_cases(root: Path) -> Cases:
    bases = root / "bases"
    llama = {fmt: write_model(bases / fmt, fmt=fmt) for fmt in ("safetensors", "sharded", "bin", "zt")}
    bert = write_model(bases / "bert", BERT_CONFIG)
    cases = Cases(root / "cases", random.Random(16))
    cases.root.mkdir()
    for fmt, base in llama.items():
        byte_cases(cases, base, fmt)
    byte_cases(cases, bert, "bert-safetensors")
    header_cases(cases, llama["safetensors"], "safetensors")
    header_cases(cases, llama["sharded"], "sharded")
    config_cases(cases, llama["safetensors"], LLAMA_CONFIG, "llama", 3)
    config_cases(cases, bert, BERT_CONFIG, "bert", 2)
    index_cases(cases, llama["sharded"])
    pickle_cases(cases, llama["bin"])
    return cases


def _run_worker(manifest: Path, first: int, results: dict[int, dict[str, Any]]) -> int:
    """Run the worker from case ``first``; returns the case it hung on, or -1 when it finished."""
    proc = subprocess.Popen([sys.executable, str(CHILD), str(manifest), str(first)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.stdout is not None
    current, deadline, buf = -1, time.monotonic() + 120.0, b""  # the first case includes the worker's imports
    try:
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return current if current >= 0 else first
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                proc.wait()
                return -1
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                word, _, rest = line.decode().partition(" ")
                if word == "start":
                    current, deadline = int(rest), time.monotonic() + CASE_TIMEOUT_S
                elif word == "done":
                    i, _, payload = rest.partition(" ")
                    results[int(i)] = json.loads(payload)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow  # ~3 s: a worker process and a few hundred loads
def test_fuzzed_models_end_in_df004_or_a_correct_load(tmp_path):
    cases = build_cases(tmp_path)
    assert len(cases.items) >= MIN_CASES, len(cases.items)
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(cases.items))
    results: dict[int, dict[str, Any]] = {}
    first = 0
    while first < len(cases.items):
        hung = _run_worker(manifest, first, results)
        if hung < 0:
            break
        results[hung] = {"outcome": "hang", "detail": f"no result within {CASE_TIMEOUT_S} s"}
        first = hung + 1
    outcomes = Counter(r["outcome"] for r in results.values())
    bad = {i: (cases.items[i]["kind"], r["detail"]) for i, r in results.items() if r["outcome"] not in ("df004", "ok")}
    assert not bad, bad
    assert len(results) == len(cases.items), (len(results), len(cases.items))
    assert outcomes["df004"] > outcomes["ok"] > 0, outcomes
    kinds = Counter(c["kind"].split(":")[0] for c in cases.items)
    assert {"safetensors", "sharded", "bin", "zt", "llama", "bert", "index", "fifo"} <= set(kinds), kinds
    ran = [m for m in cases.markers if m.exists()]
    assert not ran, f"a pickle payload ran: {ran}"
    assert cases.markers and not (tmp_path / "cases" / "MARKER").exists()


# ----------------------------------------------------------------------------- accepted configs read as transformers reads them
def _config_mutations(config: dict[str, Any], rng: random.Random) -> list[dict[str, Any]]:
    """Every key (and the optional keys the families read) given garbage, and rope variants."""
    keys = [*config, "rope_scaling", "rope_parameters", "tie_word_embeddings", "pad_token_id"]
    if config["model_type"] == "llama":
        keys += ["rope_theta", "attention_bias", "mlp_bias", "partial_rotary_factor"]
    out = [{key: value} for key in keys for value in rng.sample(GARBAGE, 6)]
    out += [{"rope_scaling": {"rope_type": "linear", "factor": rng.choice([0.5, 2.0, 3])}, "rope_theta": 300},
            {"rope_parameters": {"rope_type": "llama3", "factor": 4, "low_freq_factor": 1, "high_freq_factor": 2},
             "max_position_embeddings": 40},
            {"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_parameters": {"rope_theta": 50.0}},
            {"model_type": "qwen2"}, {"model_type": "qwen2", "attention_bias": True, "mlp_bias": True},
            {"attention_bias": True}, {"mlp_bias": True}]
    return out


@pytest.mark.slow  # ~1 s, ~4 s when it is the first to import transformers
def test_every_accepted_config_mutation_computes_what_transformers_computes(tmp_path):
    """A config the loader accepts is one the reference reads as transformers does: for every
    mutation that loads, the reference's output equals transformers' eager model's (float64)."""
    pytest.importorskip("transformers")
    rng = random.Random(16)
    checked = refused = 0
    differ: list[str] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only add overhead
    try:
        for base in (LLAMA_CONFIG, BERT_CONFIG):
            for n, changes in enumerate(_config_mutations(base, rng)):
                result = _compare_with_transformers(tmp_path / f"{base['model_type']}-{n}", {**base, **changes}, n)
                if result is None:
                    refused += 1
                elif result:
                    differ.append(f"{base['model_type']} {changes}: {result}"[:300])
                else:
                    checked += 1
    finally:
        torch.set_num_threads(threads)
    assert not differ, "\n".join(differ)
    assert checked >= 15 and refused >= 100, (checked, refused)


def _compare_with_transformers(d: Path, config: dict[str, Any], seed: int) -> str | None:
    """None when the loader refuses ``config``; else "" when the reference computes what
    transformers computes on a tiny model of it, or how they differ."""
    import numpy as np

    from debug_framework.architectures import build_reference
    from debug_framework.backends.pytorch import build_hf_model
    from debug_framework.errors import ModelLoadingError
    from debug_framework.modelio import ModelInputs, load_model
    from safetensors.torch import save_file

    raw = json.loads(json.dumps(config))
    try:
        state = tiny_state(raw, seed=seed)  # parses the config: the weights it implies, biases included
    except ModelLoadingError:
        return None
    d.mkdir()
    (d / "config.json").write_text(json.dumps(raw))
    save_file(state, str(d / "model.safetensors"))
    model = load_model(d)
    inputs = ModelInputs.random(model.config.vocab_size, batch=2, length=min(6, model.config.max_position_embeddings),
                                seed=seed)
    ours = build_reference(model.config, model.weights, np.float64).forward(
        inputs.input_ids, inputs.attention_mask, want={("post_processing", None)})[("post_processing", None)]
    try:
        net = build_hf_model(model, dtype=torch.float64)
        with torch.no_grad():
            out = net(**inputs.torch())
    except Exception as exc:  # noqa: BLE001 - transformers refusing what the loader accepted
        return f"transformers raised {type(exc).__name__}: {exc}"
    theirs = (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()
    if not np.allclose(ours, theirs, rtol=1e-4, atol=1e-6):
        return f"max |diff| {np.abs(ours - theirs).max():.3g}"
    return ""

