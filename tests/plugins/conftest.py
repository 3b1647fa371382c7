"""Fixtures of the plugin tests: the shipped examples, each C++ example built once per test run into a
build cache under the run's temporary directory (shared by the run's xdist workers: the engine's cache
is safe for concurrent builders, and a lock keeps the second worker from compiling the same source
again), and their op sweeps."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from debug_framework.plugins.manifest import load_manifest  # noqa: E402
from debug_framework.services.compilation_engine import CompilationEngine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "plugins"


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory) -> Path:
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    cache = base / "plugin-builds"
    cache.mkdir(exist_ok=True)
    return cache


@contextlib.contextmanager
def _one_builder(cache: Path) -> Iterator[None]:
    """Held while building: a worker that waits here then finds the other's build in the cache."""
    with open(cache / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def engine(build_cache) -> CompilationEngine:
    return CompilationEngine(build_cache)


@pytest.fixture(scope="session")
def cpp_build(engine):
    """The C++ example (gelu, rms_norm) built once: (definition, BuildResult)."""
    defn = load_manifest(EXAMPLES / "cpp" / "plugin.json")
    with _one_builder(engine.cache_dir):
        return defn, engine.build(defn)


@pytest.fixture(scope="session")
def buggy_build(engine):
    """The wrong rms_norm (eps outside the square root) built once."""
    defn = load_manifest(EXAMPLES / "cpp_buggy" / "plugin.json")
    with _one_builder(engine.cache_dir):
        return defn, engine.build(defn)


@pytest.fixture(scope="session")
def cpp_sweep(cpp_build):
    from debug_framework.plugins.sweep import sweep_plugin

    defn, build = cpp_build
    return sweep_plugin(defn, build.artifact)


@pytest.fixture(scope="session")
def buggy_sweep(buggy_build, tmp_path_factory):
    from debug_framework.plugins.sweep import sweep_plugin

    defn, build = buggy_build
    return sweep_plugin(defn, build.artifact, repro_dir=tmp_path_factory.mktemp("repros"))


def write_plugin(folder: Path, manifest: str, files: dict[str, str]) -> Path:
    """A plugin folder: ``plugin.json`` and its sources; the manifest's path."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "plugin.json").write_text(manifest)
    return folder / "plugin.json"


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    """A tiny Llama with transformers' own initialisation (embeddings of std 0.02, as real models)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                      rms_norm_eps=1e-5)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("swap_llama") / "hf"
    LlamaForCausalLM(cfg).save_pretrained(str(path))
    return path
