"""Plugin workers (issue 33, items 5 and 11): loading a plugin and its build checks are bounded by
the user's ``--timeout``; a killed worker is reported with its signal's name; workers run in a
scratch directory, so a plugin's relative writes never land in the caller's folder."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pytest

from debug_framework.cli import plugin_compile
from debug_framework.errors import PluginCompilationError
from debug_framework.plugins.manifest import load_manifest
from debug_framework.plugins.sweep import check_in_worker, signal_name

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"

SOURCE = '''
import os, signal, time
open("written-by-plugin.txt", "w").write("a plugin's relative write")
MODE = os.environ.get("DF_TEST_PLUGIN_MODE", "")
if MODE == "hang":
    time.sleep(1000)
elif MODE == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)


def softmax(x, dim, dtype=None):
    import torch

    return torch.softmax(x, dim, dtype=dtype)
'''


def test_signal_names():
    assert signal_name(int(signal.SIGSEGV)) == "SIGSEGV" and signal_name(int(signal.SIGKILL)) == "SIGKILL"
    assert signal_name(250) == "signal 250"


@pytest.mark.slow  # two worker processes start torch (seconds each)
def test_a_hanging_or_crashing_plugin_is_bounded_and_named(tmp_path, monkeypatch, capsys):
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    shutil.copy(EXAMPLES / "triton" / "plugin.json", plugin)
    (plugin / "softmax.py").write_text(SOURCE)
    caller = tmp_path / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)
    monkeypatch.setenv("DF_TEST_PLUGIN_MODE", "hang")
    start = time.monotonic()
    rc = plugin_compile.main(["--plugin-path", str(plugin), "--validate", "--timeout", "2",
                              "--database", str(tmp_path / "r.db"), "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert rc == 2 and "[DF008]" in err and "no answer within 2 s" in err and "SIGKILL" in err, err
    assert time.monotonic() - start < 120  # not the fixed 300 s wait
    monkeypatch.setenv("DF_TEST_PLUGIN_MODE", "segv")
    artifact = next((tmp_path / "cache").rglob("*.py"))
    with pytest.raises(PluginCompilationError, match="SIGSEGV"):
        check_in_worker(load_manifest(plugin), artifact, "triton", timeout_s=30)
    assert not list(caller.iterdir())  # the plugin's relative write went to the worker's scratch folder
