"""A child process that dies with its parent (:func:`die_with_parent`): the batch executor's
workers and the reference's decode process (``services/validation/decode_ahead.py``) must not
outlive the process that reads what they produce, holding a model's memory with nobody left to
stop them."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

__all__ = ["die_with_parent", "ORPHANED_EXIT"]

_POLL_S = 0.25
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: the exit status of a child whose parent died first
ORPHANED_EXIT = 70


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(ORPHANED_EXIT)


def die_with_parent(parent_pid: int) -> None:
    """Make this (child) process die when ``parent_pid`` does: the parent-death signal on Linux,
    else a daemon thread polling the parent pid. Exits at once when the parent is already gone."""
    bound = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            bound = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            bound = False
    if os.getppid() != parent_pid:  # it died before the signal was armed
        os._exit(ORPHANED_EXIT)
    if not bound:
        threading.Thread(target=_watch_parent, args=(parent_pid,), name="pie-debug-parent-watch", daemon=True).start()
