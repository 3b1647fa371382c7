"""The architecture's import rules, checked on the source (imports inside functions and under
``TYPE_CHECKING`` count: they tie modules together as much as top-level ones):

* no import cycle anywhere in ``src/`` (the AST approach of ``shared/tools/import_cycles.py``);
* ``debug_framework`` is layered (:data:`LAYERS`, top to bottom): a module never imports from a
  higher layer, and every module belongs to a layer;
* debug_framework never imports debug_module; nothing but debug_framework/_torch touches torch's
  private packages (in src/ and benchmarks/).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PRIVATE = re.compile(r"^\s*(?:from|import)\s+torch\._(dynamo|functorch|inductor|decomp)\b", re.M)

#: debug_framework's layers, top to bottom. A module may import its own layer and the layers below.
#: Module prefixes: an entry covers the module and its submodules, the longest matching entry decides;
#: the top-level entry ``debug_framework`` covers the package's ``__init__`` only. Update this table
#: when a module or package is added or moves (an unplaced module fails the suite).
LAYERS: dict[str, tuple[str, ...]] = {
    "front": ("debug_framework", "debug_framework.cli", "debug_framework.demo", "debug_framework.integrations",
              "debug_framework.dashboard"),
    "services": ("debug_framework.services", "debug_framework.reports", "debug_framework.conformance"),
    # compat: the spec's faces over the stores, the comparison core and the records' data (the
    # records inherit their spec verbs from it, so it sits in their layer and imports none of them)
    "models": ("debug_framework.models", "debug_framework.compat"),
    "storage": ("debug_framework.storage",),
    # measure times and samples backends (it hooks layers with capture.hooks), so it sits with them
    "execution": ("debug_framework.backends", "debug_framework.capture", "debug_framework.architectures",
                  "debug_framework.modelio", "debug_framework.measure", "debug_framework.plugins"),
    "core": ("debug_framework.comparison", "debug_framework.errors", "debug_framework.config",
             "debug_framework._torch", "debug_framework.jsonio", "debug_framework.suggest",
             "debug_framework.backend_prefixes", "debug_framework.checkpoint_ids",
             "debug_framework.repro_format", "debug_framework.termtext", "debug_framework.safefiles",
             "debug_framework.report_formats", "debug_framework.orphans"),
}
_ORDER = list(LAYERS)


@cache
def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module under src/: dotted name -> (file, is a package ``__init__``)."""
    mods = {}
    for f in SRC.rglob("*.py"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return mods


def _resolve(name: str) -> str | None:
    """The module ``name`` refers to: itself, or the package defining the imported attribute."""
    mods = _modules()
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _module_imports(mod: str, is_pkg: bool, source: str) -> dict[str, int]:
    """{module of src/ that ``mod`` imports: first line}, every import statement included."""
    out: dict[str, int] = {}
    package = mod if is_pkg else mod.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{node.module}" if node.module else anchor
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target is not None and target != mod:
                out.setdefault(target, node.lineno)
    return out


@cache
def _imports() -> dict[str, dict[str, int]]:
    """module -> {imported module of src/: first line}, for every module under src/."""
    return {mod: _module_imports(mod, is_pkg, path.read_text()) for mod, (path, is_pkg) in _modules().items()}


def _layer(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for layer, prefixes in LAYERS.items():
        for p in prefixes:
            covers = module == p or ("." in p and module.startswith(p + "."))
            if covers and (best is None or len(p) > best[0]):
                best = (len(p), layer)
    return None if best is None else best[1]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _cycle_edges() -> dict[str, set[str]]:
    """The import graph as import_cycles.py sees it: a package importing its own submodules and a
    module naming one of its parent packages are not edges (Python loads parents first anyway)."""
    mods = _modules()
    graph = {}
    for mod, targets in _imports().items():
        graph[mod] = {t for t in targets
                      if not (mods[mod][1] and t.startswith(mod + ".")) and not mod.startswith(t + ".")}
    return graph


def test_no_import_cycle_in_src():
    cycles = _cycles(_cycle_edges())
    assert not cycles, "import cycles (lazy and TYPE_CHECKING imports count):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_layer_table_places_modules_by_longest_entry():
    assert _layer("debug_framework") == "front"
    assert _layer("debug_framework.storage.sessions") == "storage"
    assert _layer("debug_framework.not_in_the_table") is None  # the package entry covers __init__ only


def test_every_debug_framework_module_has_a_layer():
    unplaced = sorted(m for m in _modules() if m.split(".")[0] == "debug_framework" and _layer(m) is None)
    assert not unplaced, f"add these modules to LAYERS in {Path(__file__).name}: {unplaced}"


def _upward(mod: str, targets: dict[str, int]) -> list[str]:
    """One message per import of ``mod`` that reaches a higher layer."""
    low = _layer(mod)
    if low is None:
        return []
    out = []
    for target, line in sorted(targets.items()):
        high = _layer(target)
        if high is not None and _ORDER.index(high) < _ORDER.index(low):
            out.append(f"{mod} ({low}) imports {target} ({high}) at line {line}")
    return out


def test_no_import_from_a_higher_layer():
    upward = [msg for mod, targets in sorted(_imports().items()) for msg in _upward(mod, targets)]
    assert not upward, "imports from a higher layer (see LAYERS):\n" + "\n".join(upward)


def test_layer_check_sees_lazy_and_type_checking_imports():
    source = ("from typing import TYPE_CHECKING\nfrom ..storage.database import Database\n"
              "if TYPE_CHECKING:\n    from ..reports import render_report\n"
              "def f():\n    from ..services.database_manager import DatabaseManager\n")
    targets = _module_imports("debug_framework.models.example", False, source)
    assert targets == {"debug_framework.storage.database": 2, "debug_framework.reports": 4,
                       "debug_framework.services.database_manager": 6}
    assert _upward("debug_framework.models.example", targets) == [
        "debug_framework.models.example (models) imports debug_framework.reports (services) at line 4",
        "debug_framework.models.example (models) imports debug_framework.services.database_manager (services) at line 6",
    ]


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


def test_no_module_over_800_lines():
    """Size is a smell, not a target: a module over 800 lines is flagged (split where it holds two
    concerns), one under it is not asked to split further."""
    sizes = {str(p.relative_to(SRC)): len(p.read_text(encoding="utf-8").splitlines()) for p in SRC.rglob("*.py")}
    assert not {p: n for p, n in sizes.items() if n > 800}


def test_only_the_judge_decides_a_verdict():
    """No stage module writes a verdict: the judge module alone builds judgements; stages add evidence."""
    validation = SRC / "debug_framework" / "services" / "validation"
    writers = re.compile(r"\.(passed|reason|judgement|judged_by)\s*=[^=]|\bJudgement\(|\bRatioRule(\.calibrated)?\(|\.verdict\(")
    offenders = [f"{p.name}:{n}" for p in validation.glob("*.py") if p.name not in ("judge.py",)
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                 if writers.search(line) and not line.lstrip().startswith(("#", '"'))]
    assert not offenders, offenders
