"""debug_framework never imports debug_module; nothing but debug_framework/_torch touches torch's private
packages (in src/ and benchmarks/)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PRIVATE = re.compile(r"^\s*(?:from|import)\s+torch\._(dynamo|functorch|inductor|decomp)\b", re.M)


def test_debug_framework_does_not_import_debug_module():
    offenders = [str(p) for p in (SRC / "debug_framework").rglob("*.py") if re.search(r"^\s*(from|import)\s+debug_module\b", p.read_text(), re.M)]
    assert not offenders


def test_private_torch_apis_live_in_one_layer():
    allowed = SRC / "debug_framework" / "_torch"
    bench = ROOT / "benchmarks"
    generated = bench / "results"  # run directories hold Inductor's generated code (git-ignored)
    files = [*SRC.rglob("*.py"), *(p for p in bench.rglob("*.py") if generated not in p.parents)]
    offenders = [str(p) for p in files if allowed not in p.parents and PRIVATE.search(p.read_text())]
    assert not offenders, offenders
