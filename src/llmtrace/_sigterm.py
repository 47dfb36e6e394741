"""Flush at SIGTERM: a process stopped the way orchestrators stop it still exports what it holds.

``atexit`` handlers do not run when a process dies of a signal, and SIGTERM's default action is
to die at once. So is a uvicorn server's end: uvicorn (0.29 and later) catches SIGTERM, shuts
down gracefully, restores the handler it found and raises the signal again. Spans still queued
in memory would then be lost uncounted. When the process has no SIGTERM handler of its own,
llmtrace installs one that runs ``llmtrace.shutdown()`` (export what is queued; what the
endpoint will not take goes to the spill) for at most :data:`FLUSH_S`, then restores the default
action and raises the signal again: the process still dies of SIGTERM, with the same status.
A handler the host installs later replaces this one; hosts that exit normally run ``atexit``.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

#: How long the flush at SIGTERM may take (Kubernetes waits 30 s before SIGKILL by default).
FLUSH_S = 5.0

_installed = [False]


def install(shutdown: Callable[[float], object]) -> None:
    """Install the flushing SIGTERM handler if this is the main thread and SIGTERM is at its default."""
    if _installed[0] or threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            # On a helper thread: the interrupted main thread may hold a lock that shutdown needs.
            worker = threading.Thread(target=shutdown, args=(FLUSH_S,), name="llmtrace-sigterm", daemon=True)
            worker.start()
            worker.join(FLUSH_S + 1.0)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)
        _installed[0] = True
    except (ValueError, OSError):  # no signals here (an embedded interpreter): atexit still applies
        return
