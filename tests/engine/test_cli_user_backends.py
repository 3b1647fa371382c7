"""``debug_validate`` with the user's own backend (entry points, --backend-module, --backend-file), unknown
names that suggest the closest, Ctrl-C, arguments refused before the heavy imports, the --verbose isolation table."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

#: A user backend module: a float32 NumPy Llama (isolation works: it has run_layer). ``{name}`` is its
#: registered name; ``{sleep}`` seconds of sleep in run() after printing RUNNING (the Ctrl-C test).
BACKEND_SOURCE = '''
import sys, time
import numpy as np
from debug_framework.architectures.llama import LlamaReference
from debug_framework.backends import register_backend, user_backend
from debug_framework.capture import CheckpointKey

class Runner:
    def __init__(self, model, dtype, device):
        self.net = LlamaReference(model.config, model.weights, np.float32)
    def run(self, inputs, keys):
        if {sleep}:
            print("RUNNING", flush=True)
            time.sleep({sleep})
        out = self.net.forward(inputs.input_ids, inputs.attention_mask, {{tuple(k) for k in keys}})
        return {{CheckpointKey(*k): v for k, v in out.items()}}
    def run_layer(self, i, hidden_in, inputs):
        return self.net.layer(i, np.asarray(hidden_in, np.float32), inputs.attention_mask)

factory = user_backend("{name}", Runner, dtypes=("float32",))
if {register}:
    register_backend("{name}", factory)
'''


def _backend_source(name: str, *, sleep: int = 0, register: bool = True) -> str:
    return BACKEND_SOURCE.format(name=name, sleep=sleep, register=register)


def _env(*paths: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "COLUMNS": "200",
            "PYTHONPATH": os.pathsep.join([str(SRC), *map(str, paths)])}


def _session_rows(db: Path) -> list[tuple[str, str | None]]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT status, error_message FROM sessions").fetchall()


@pytest.fixture
def unregister():
    from debug_framework.backends import unregister_backend

    names: list[str] = []
    yield names
    for n in names:
        unregister_backend(n)


def test_backend_file_and_module_register_and_validate(tiny_llama, tmp_path, monkeypatch, capsys, unregister):
    from debug_framework.cli.debug_validate import run

    (tmp_path / "file_backend.py").write_text(_backend_source("cli_file_llama"))
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod_backend.py").write_text(_backend_source("cli_module_llama"))
    monkeypatch.chdir(tmp_path)  # --backend-module finds userpkg in the current directory, as python -m does
    monkeypatch.setenv("COLUMNS", "200")
    unregister += ["cli_file_llama", "cli_module_llama"]
    code = run(["--model-path", str(tiny_llama), "--database", str(tmp_path / "a.db"), "--checkpoints", "post_mlp",
                "--backend-file", "file_backend.py", "--alternative-backend", "cli_file_llama", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["alternative_backend"] == "cli_file_llama" and doc["verdict"] == "passed"
    code = run(["--model-path", str(tiny_llama), "--database", str(tmp_path / "a.db"), "--checkpoints", "post_mlp",
                "--backend-module", "userpkg.mod_backend", "--alternative-backend", "cli_module_llama", "--isolate",
                "--verbose"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0 and "cli_module_llama (float32) vs python_reference" in out
    # --verbose prints the isolation table it promises: one row per layer, introduced vs carried in
    assert "isolation: each block alone on the reference" in out and "attention introduces" in out
    assert out.count("propagates") == 6


def test_unknown_backend_suggests_and_says_how_to_register(tiny_llama, tmp_path, capsys):
    from debug_framework.cli.debug_validate import run

    code = run(["--model-path", str(tiny_llama), "--database", str(tmp_path / "a.db"), "--alternative-backend", "pytroch"])
    err = capsys.readouterr().err
    assert code == 2 and "[DF002]" in err and "unknown backend (did you mean 'pytorch'?)" in err
    assert "registered backends: python_reference, pytorch" in err
    assert "--backend-module" in err and "--backend-file" in err and "debug_framework.backends" in err


def test_backend_code_that_fails_to_import_is_df005_naming_it(tiny_llama, tmp_path, capsys):
    from debug_framework.cli.debug_validate import run

    broken = tmp_path / "broken_backend.py"
    broken.write_text("import math\nraise RuntimeError('my backend is broken')\n")
    base = ["--model-path", str(tiny_llama), "--database", str(tmp_path / "a.db")]
    cases = [(["--backend-file", str(broken)], [str(broken), "RuntimeError: my backend is broken"]),
             (["--backend-file", str(tmp_path / "missing.py")], ["missing.py", "no such file"]),
             (["--backend-module", "no_such_pkg.backends"], ["'no_such_pkg.backends'", "ModuleNotFoundError"]),
             (["--backend-module", "x/y.py"], ["is a file path", "--backend-file"])]
    for extra, expected in cases:
        assert run([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert "[DF005]" in err and "Traceback" not in err, err
        assert all(e in err for e in expected), (expected, err)
    assert not (tmp_path / "a.db").exists() or _session_rows(tmp_path / "a.db") == []


def test_bad_arguments_are_refused_before_torch_is_imported(tiny_llama, tmp_path):
    """--dtype float8, an unusable database, a missing model: refused with their DF code, exit 2, and
    torch never imported (the point: a one-line refusal in a fraction of a second, not after ~10 s of imports)."""
    script = textwrap.dedent(f"""
        import sys
        from debug_framework.cli.debug_validate import run
        model = {str(tiny_llama)!r}
        codes = [run(["--model-path", model, "--dtype", "float8", "--database", {str(tmp_path / "a.db")!r}]),
                 run(["--model-path", model, "--reference-dtype", "bfloat61", "--database", {str(tmp_path / "a.db")!r}]),
                 run(["--model-path", model, "--database", {str(tmp_path)!r}]),
                 run(["--model-path", model, "--database", "/proc/no/such/dir/x.db"]),
                 run(["--model-path", {str(tmp_path / "nope")!r}, "--database", {str(tmp_path / "a.db")!r}]),
                 run(["--model-path", model, "--database", {str(tmp_path / "a.db")!r},
                      "--backend-file", {str(tmp_path / "missing.py")!r}])]
        print(codes, "torch" in sys.modules)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=120)
    assert p.stdout.split("\n")[0] == "[2, 2, 2, 2, 2, 2] False", (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 6, p.stderr
    assert "[DF005]" in lines[0] and "--dtype 'float8'" in lines[0] and "float64, float32, float16, bfloat16" in lines[0]
    assert "did you mean 'bfloat16'?" in lines[1]
    assert "[DF003]" in lines[2] and "is a directory" in lines[2]
    assert "[DF003]" in lines[3]
    assert "[DF004]" in lines[4] and "model path does not exist" in lines[4]
    assert "[DF005]" in lines[5] and "missing.py" in lines[5]
    assert not (tmp_path / "a.db").exists()


@pytest.mark.slow  # a fresh process (imports) plus a spawned batch worker (imports again): ~10 s
def test_entry_point_backends_are_found_by_the_registry_and_batch_workers(tiny_llama, tmp_path):
    """An installed package (a dist-info with entry_points.txt on sys.path) declares a backend; a fresh
    process lists and runs it, and so does a spawned batch worker, which imports nothing of the parent's."""
    site = tmp_path / "site"
    (site / "df_ep_backend-0.1.dist-info").mkdir(parents=True)
    (site / "df_ep_backend-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: df-ep-backend\n"
                                                                    "Version: 0.1\n")
    (site / "df_ep_backend-0.1.dist-info" / "entry_points.txt").write_text(
        "[debug_framework.backends]\nep_llama = df_ep_backend:factory\nep_broken = df_ep_missing:factory\n")
    (site / "df_ep_backend.py").write_text(_backend_source("ep_llama", register=False))
    script = textwrap.dedent(f"""
        import json
        from debug_framework.backends import get_backend, registered_backends
        from debug_framework.errors import BackendInitializationError
        from debug_framework.models.batch_validation_job import BatchValidationJob
        names = registered_backends()
        ok = get_backend("ep_llama").availability()
        try:
            get_backend("ep_broken")
        except BackendInitializationError as exc:
            broken = str(exc)
        job = BatchValidationJob("ep-job", [{str(tiny_llama)!r}],
                                 {{"database_path": {str(tmp_path / "b.db")!r}, "alternative_backend": "ep_llama",
                                   "parallel_execution": True, "max_concurrent_jobs": 1, "isolate": False,
                                   "enabled_checkpoints": ["post_mlp"]}})
        items = job.execute()
        print(json.dumps({{"names": names, "ep_llama": ok, "ep_broken": broken,
                          "items": [(r["status"], r["verdict"]) for r in items]}}))
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(site), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    assert doc["names"][-2:] == ["ep_llama", "ep_broken"] and "pytorch" in doc["names"]
    assert doc["ep_llama"] == [True, ""]
    assert "[DF002]" in doc["ep_broken"] and "cannot import df_ep_missing:factory" in doc["ep_broken"]
    assert doc["items"] == [["done", "passed"]]


@pytest.mark.slow  # a fresh debug_validate process (~4 s of imports)
def test_ctrl_c_exits_130_in_one_line_and_marks_the_session(tiny_llama, tmp_path):
    (tmp_path / "slow_backend.py").write_text(_backend_source("slow_llama", sleep=120))
    db = tmp_path / "s.db"
    p = subprocess.Popen([sys.executable, "-m", "debug_framework.cli.debug_validate", "--model-path", str(tiny_llama),
                          "--database", str(db), "--backend-file", str(tmp_path / "slow_backend.py"),
                          "--alternative-backend", "slow_llama"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a shell starts it
    try:
        assert p.stdout.readline().strip() == "RUNNING"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, (out, err)
    (line,) = err.strip().splitlines()
    assert line.startswith("debug_validate: interrupted by the user (Ctrl-C); session ") and "Traceback" not in err
    assert _session_rows(db) == [("error", "interrupted by the user (Ctrl-C)")]
