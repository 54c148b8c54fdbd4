"""A Celery worker does not outlive the process that started it (bin/run's supervisor), however that one
ends, and its pool does not outlive the worker.

The supervisor asks the kernel to send each child SIGTERM when the supervisor dies (parent_death_request);
for a Celery worker that begins a warm shutdown, which waits for its pool's tasks in flight. Seen twice in
whole test runs: a worker whose supervisor had been killed a second after the worker started was still
waiting for its pool 30 s on, its pool processes alive. So a worker whose parent is gone ends itself once
`WR_WORKER_ORPHAN_GRACE_SECONDS` have passed (time for a tick in flight to finish), and each pool process
is sent SIGKILL by the kernel when its worker's main process is gone. A tick cut short loses nothing: each
of its Redis changes is one Lua script, done whole or not at all, and the leader lease runs out by itself.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def parent_death_request(sig: int, *, parent: int) -> Callable[[], bool] | None:
    """A function that asks the kernel to send `sig` to the process calling it when its parent dies, and
    ends that process at once if `parent` (the parent's id, read before) is gone already: nobody would tell
    it then. None where the kernel offers no such thing (Linux only). C's library is loaded here, so the
    function is fit for Popen's preexec_fn (it runs between fork and exec, where loading it is not)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def request() -> bool:
        if libc.prctl(PR_SET_PDEATHSIG, sig) != 0:
            return False
        if os.getppid() != parent:  # it died before the call above: nobody would tell us
            os._exit(1)
        return True

    return request


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """The kernel sends `sig` to this process when its parent dies (Linux; False elsewhere). A parent that
    died before the call is found by its parent id and ends this process at once."""
    request = parent_death_request(sig, parent=os.getppid())
    return request is not None and request()


def exit_when_orphaned(grace: float, *, every: float = 0.5) -> threading.Thread | None:
    """A daemon thread that ends this process `grace` seconds after its parent is gone (its parent id
    changes), unless it has ended by itself by then. None when `grace` is 0 or less (never)."""
    if grace <= 0:
        return None
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        time.sleep(grace)
        log.warning("the process that started this one is gone and this one has not ended in %g s: ending", grace)
        os._exit(1)

    thread = threading.Thread(target=watch, name="exit-when-orphaned", daemon=True)
    thread.start()
    return thread
