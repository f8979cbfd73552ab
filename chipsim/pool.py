"""The one process pool of chipsim (independent policies of a run, the tasks of a sweep, hwcompare's plans).

Workers are forked (they inherit the loaded modules and traces, and never re-import the caller's __main__)
and ignore SIGINT: a Ctrl-C at the terminal reaches the whole process group, and only the parent should
act on it. When the parent is interrupted (or anything else goes wrong) while tasks are outstanding, the
workers are killed, their tasks failed and nothing is waited for, so one Ctrl-C stops the run within a moment and a second one
cannot deadlock a pool that is shutting down.
"""

from __future__ import annotations

import concurrent.futures.process
import contextlib
import multiprocessing as mp
import signal
from concurrent.futures import ProcessPoolExecutor


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def worker_pool(jobs: int):
    """A ProcessPoolExecutor of `jobs` forked workers; on leaving normally it waits for them, on an
    exception (KeyboardInterrupt included) it kills them and cancels what has not started."""
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("fork"), initializer=_ignore_sigint)
    try:
        yield pool
    except BaseException:
        stop(pool)
        raise
    pool.shutdown(wait=True)


def stop(pool: ProcessPoolExecutor) -> None:
    """Kill the pool's workers and return at once."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # no public handle on the workers
    manager = getattr(pool, "_executor_manager_thread", None)  # shutdown() forgets it
    for process in processes:
        with contextlib.suppress(Exception):
            process.kill()
    # the pool's manager thread sees the dead workers and fails every outstanding task itself (cancelling
    # them here as well races it: CPython then raises InvalidStateError in that thread)
    pool.shutdown(wait=False)
    # It then closes its wake-up pipe and ends by itself (the interpreter's exit still joins it). Take it off the
    # list of pipes the exit hook writes to: CPython 3.11's hook checks and writes without the lock that the
    # closing takes, so on a loaded machine the manager closed the pipe between the two and the exit printed
    # "Exception ignored in ... threading ... _shutdown ... OSError: handle is closed" after "chipsim: interrupted"
    # (a wait for the thread cannot close the race: the load decides how long it takes).
    wakeups = getattr(concurrent.futures.process, "_threads_wakeups", {})
    if manager is not None:
        wakeups.pop(manager, None)
