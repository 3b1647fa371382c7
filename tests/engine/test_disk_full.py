"""A full disk (ENOSPC), a file-size limit (EFBIG) and a read-only file system (EROFS) are DF007 on
every write path, and what was stored before stays readable.

The full disk is real: a 2 MiB tmpfs mounted for the test (needs root, as in CI's container; the
test skips with the reason elsewhere). The file-size limit is real too (``RLIMIT_FSIZE`` in a child
process) and needs no privilege.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from debug_framework.cli.debug_validate import main as debug_validate
from debug_framework.cli.session_report import main as session_report
from debug_framework.errors import ResourceExhaustedError
from debug_framework.services.validation_engine import ValidationEngine
from debug_framework.storage.tensor_store import TensorStore

SRC = Path(__file__).resolve().parents[2] / "src"
CONFIG = {"input_shape": [1, 8], "isolate": False}


@pytest.fixture
def small_fs(tmp_path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted at a fresh directory (unmounted afterwards)."""
    mnt = tmp_path / "small_fs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (the RLIMIT_FSIZE test covers the unprivileged case)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(directory: Path) -> Path:
    """Write zeros until the file system is full; returns the filler file."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as fh:
        for chunk in (1 << 16, 512, 1):
            try:
                while True:
                    fh.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == 28, exc
    return filler


def test_a_full_disk_is_df007_everywhere_and_keeps_what_was_stored(tiny_llama, small_fs, capsys):
    engine = ValidationEngine(small_fs / "db" / "debug.db")
    kept = engine.create_session(tiny_llama, CONFIG, "python_reference", "pytorch")
    filler = _fill(small_fs)

    with pytest.raises(ResourceExhaustedError, match="no space left") as info:   # was a raw SafetensorError
        engine.create_session(tiny_llama, CONFIG, "python_reference", "pytorch")
    assert info.value.code == "DF007"
    with pytest.raises(ResourceExhaustedError, match="no space left"):
        TensorStore.beside_database(engine.database_path).put(np.arange(4096, dtype=np.float32))
    with pytest.raises(ResourceExhaustedError, match="disk full"):
        engine.db.sessions.create(str(tiny_llama), "python_reference", "pytorch")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        debug_validate(["--model-path", str(tiny_llama), "--database", str(engine.database_path),
                        "--alternative-backend", "pytorch", "--no-isolate"])
    assert exited.value.code == 2 and "DF007" in capsys.readouterr().err
    out = small_fs / "report.html"
    assert session_report(["--session-id", kept, "--database", str(engine.database_path),
                           "--output-format", "html", "--output-file", str(out)]) == 2
    assert "DF007" in capsys.readouterr().err and not out.exists()

    # nothing half-written was left, and what was stored is intact and readable
    assert sorted(p.name for p in engine.inputs_dir.iterdir()) == [f"{kept}.safetensors"]
    assert [s["session_id"] for s in engine.list_sessions()] == [kept]
    assert session_report(["--session-id", kept, "--database", str(engine.database_path)]) == 0
    assert kept in capsys.readouterr().out

    filler.unlink()  # room again: everything works
    assert engine.create_session(tiny_llama, CONFIG, "python_reference", "pytorch")

    read_only = small_fs / "ro"  # a read-only file system (EROFS) is DF007 too
    read_only.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(read_only)], check=True)
    try:
        (read_only / "store").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(read_only)], check=True)
        with pytest.raises(ResourceExhaustedError, match="read-only"):
            TensorStore(read_only / "store").put(np.arange(8.0))
    finally:
        subprocess.run(["umount", "-l", str(read_only)], capture_output=True)


@pytest.mark.slow  # a child process importing the package (~2-4 s)
def test_a_file_size_limit_is_df007(tmp_path):
    """RLIMIT_FSIZE (no privilege needed): the write fails with EFBIG, which is DF007 too."""
    code = textwrap.dedent(f"""
        import resource, signal, sys
        import numpy as np
        from debug_framework.errors import ResourceExhaustedError
        from debug_framework.storage.tensor_store import TensorStore
        store = TensorStore({str(tmp_path / "store")!r})
        small = store.put(np.arange(16, dtype=np.float32))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
        try:
            store.put(np.arange(1 << 16, dtype=np.float32))
        except ResourceExhaustedError as exc:
            print(exc.code, exc.message)
        print("kept", store.get(small.content_hash).tolist() == list(range(16)))
    """)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "DF007 cannot record a tensor" in done.stdout and "kept True" in done.stdout
    leftovers = [p.name for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert len(leftovers) == 1, leftovers  # the small tensor only; no temporary file is left behind
