"""The daemon's scheduler: APScheduler, on a thread pool the daemon holds, with interval jobs kept only
while they have work.

Its own module for one ordering that matters at exit: APScheduler's `shutdown(wait=True)` waits for the
running jobs while holding its job-store lock, and a job that schedules or cancels anything then (a
guard round's job sync, an exit's timers) waits for that lock: the daemon hung at exit. So the
scheduler is stopped without waiting, and the pool, which is the daemon's own, is waited for after.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable
from datetime import timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: APScheduler loads when the daemon starts
    from apscheduler.schedulers.background import BackgroundScheduler

JOB_WORKERS = 10  # threads the scheduler's jobs run on (APScheduler's default): the guard round, the timers


class Jobs:
    """The scheduler (`scheduler`, for the timers' date jobs) and the interval jobs kept on it."""

    def __init__(self) -> None:
        from apscheduler.schedulers.background import BackgroundScheduler

        self._pool = concurrent.futures.ThreadPoolExecutor(JOB_WORKERS, thread_name_prefix="babysit-job")
        self.scheduler: BackgroundScheduler = BackgroundScheduler(
            timezone=timezone.utc,
            executors={"default": _pool_executor(self._pool)},
            # a job that missed its time (the machine slept) runs once, late, rather than being dropped
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 3600},
        )

    def every(self, job_id: str, fn: Callable[[], None], seconds: float) -> None:
        self.scheduler.add_job(fn, "interval", seconds=seconds, id=job_id)

    def keep(self, job_id: str, wanted: bool, fn: Callable[[], None], seconds: float) -> None:
        """The interval job `job_id` there while `wanted`, and gone when not (a look, then a change: the
        daemon keeps its jobs from one thread at a time)."""
        have = self.scheduler.get_job(job_id) is not None
        if wanted and not have:
            self.every(job_id, fn, seconds)
        elif have and not wanted:
            with contextlib.suppress(Exception):
                self.scheduler.remove_job(job_id)

    def start(self) -> None:
        self.scheduler.start()

    def shutdown(self) -> None:
        """Stop the scheduler, then wait for the jobs already started or queued (the module says why)."""
        with contextlib.suppress(Exception):
            self.scheduler.shutdown(wait=False)
        self._pool.shutdown(wait=True)


def _pool_executor(pool: concurrent.futures.ThreadPoolExecutor) -> Any:
    """APScheduler's pool executor over a pool the daemon holds (its own ThreadPoolExecutor makes one it
    keeps private)."""
    from apscheduler.executors.pool import BasePoolExecutor

    class DaemonPoolExecutor(BasePoolExecutor):
        def __init__(self) -> None:
            super().__init__(pool)

    return DaemonPoolExecutor()
