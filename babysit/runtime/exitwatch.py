"""One thread sees every attempt's exit: an epoll set of file descriptors that turn readable at the exit.

The local executor hands out a pidfd of the attempt's shim (`os.pidfd_open`), which the kernel makes
readable the instant the process exits, whoever its parent is (a restarted daemon watches shims it did
not start). A thread blocked in `flock` per attempt, as before, was 1,000 threads at 1,000 runs; here
it is one, asleep in `epoll_wait` until something ends (bench/README.md, Scale).

The callback runs on the watcher thread and must only hand the work on (the supervisor schedules its
exit handling on the daemon's workers): a slow callback would delay every other run's exit.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable

import structlog

log = structlog.get_logger("babysit.runtime.exitwatch")


def supported() -> bool:
    """Whether exits can be watched by descriptor here (Linux 5.3+ pidfds, epoll)."""
    return hasattr(os, "pidfd_open") and hasattr(select, "epoll")


class ExitWatcher:
    """`watch(key, fd, on_exit)`: call `on_exit()` once when `fd` turns readable; the fd is then closed.

    Thread-safe. The thread starts with the first watch and lives until `close()`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_fd: dict[int, tuple[str, Callable[[], None]]] = {}
        self._by_key: dict[str, int] = {}
        self._epoll: select.epoll | None = None
        self._stop_fd: int | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, key: str, fd: int, on_exit: Callable[[], None]) -> None:
        """Watch `fd` (taken over: closed after it fires or on unwatch); a second watch of `key` replaces the first."""
        with self._lock:
            if self._closed:
                os.close(fd)
                return
            self._start()
            assert self._epoll is not None
            self._drop(key)
            self._by_fd[fd] = (key, on_exit)
            self._by_key[key] = fd
            self._epoll.register(fd, select.EPOLLIN)

    def unwatch(self, key: str) -> None:
        with self._lock:
            self._drop(key)

    def watching(self) -> int:
        with self._lock:
            return len(self._by_key)

    def is_watching(self, key: str) -> bool:
        with self._lock:
            return key in self._by_key

    def close(self) -> None:
        """Stop the thread and close every descriptor; pending callbacks never run."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for key in list(self._by_key):
                self._drop(key)
            if self._stop_fd is not None:
                os.eventfd_write(self._stop_fd, 1)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    # -- internals --------------------------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is not None:
            return
        self._epoll = select.epoll()
        self._stop_fd = os.eventfd(0, os.EFD_CLOEXEC)
        self._epoll.register(self._stop_fd, select.EPOLLIN)
        self._thread = threading.Thread(target=self._loop, name="exit-watcher", daemon=True)
        self._thread.start()

    def _drop(self, key: str) -> None:
        fd = self._by_key.pop(key, None)
        if fd is None:
            return
        self._by_fd.pop(fd, None)
        assert self._epoll is not None
        with contextlib.suppress(OSError):
            self._epoll.unregister(fd)
        with contextlib.suppress(OSError):
            os.close(fd)

    def _loop(self) -> None:
        epoll, stop_fd = self._epoll, self._stop_fd
        assert epoll is not None and stop_fd is not None
        try:
            while True:
                try:
                    events = epoll.poll()
                except InterruptedError:
                    continue
                fired: list[Callable[[], None]] = []
                with self._lock:
                    if self._closed:
                        return
                    for fd, _mask in events:
                        entry = self._by_fd.get(fd)
                        if entry is not None:
                            fired.append(entry[1])
                            self._drop(entry[0])
                for on_exit in fired:
                    try:
                        on_exit()
                    except Exception:  # one run's handler never stops the others' exits from being seen
                        log.exception("exit handler failed")
        finally:
            with contextlib.suppress(OSError):
                epoll.close()
            with contextlib.suppress(OSError):
                os.close(stop_fd)
