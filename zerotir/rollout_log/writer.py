"""A background thread that runs write jobs in order, so the training step never waits for the disk.

The queue is bounded: when the disk falls more than ``max_pending`` jobs behind, ``submit`` blocks (back-pressure
instead of unbounded memory). A job that raises stops the writer; the error is raised on the training thread at the
next ``submit``, ``check`` or ``close``, wrapped in ``RolloutWriteError``; it is never dropped.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_STOP = object()


class RolloutWriteError(RuntimeError):
    """A background write failed; the original exception is its ``__cause__``."""


class BackgroundWriter:
    """Runs ``submit``-ted callables one after another on a daemon thread.

    Args:
        max_pending: jobs that may wait in the queue before ``submit`` blocks (>= 1).
        name: the thread's name (shows in stack dumps).
    """

    def __init__(self, max_pending: int = 4, name: str = "zerotir-rollout-writer") -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending={max_pending}: must be >= 1")
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is _STOP:
                    return
                if self._error is None:  # after a failure the remaining jobs are skipped, the error kept
                    job()
            except BaseException as error:  # noqa: BLE001 - handed to the training thread, never swallowed
                self._error = error
                log.error("rollout writer: %s: %s", type(error).__name__, error)
            finally:
                self._queue.task_done()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def check(self) -> None:
        """Raise ``RolloutWriteError`` if a job has failed."""
        if self._error is not None:
            raise RolloutWriteError(f"writing rollouts failed: {type(self._error).__name__}: {self._error}") \
                from self._error

    def submit(self, job: Callable[[], object]) -> None:
        """Queue ``job`` (blocks while ``max_pending`` jobs wait); raises first if an earlier job failed."""
        self.check()
        if not self.alive:
            raise RolloutWriteError("the rollout writer is closed")
        self._queue.put(job)

    def flush(self) -> None:
        """Wait until every queued job has run; raises if one failed."""
        self._queue.join()
        self.check()

    def close(self, raise_errors: bool = True) -> None:
        """Run what is queued, stop the thread, and (unless ``raise_errors`` is False) raise a job's failure."""
        if self.alive:
            self._queue.put(_STOP)
            self._thread.join()
        if raise_errors:
            self.check()
