"""`babysit up`: one daemon per state directory, on APScheduler, babysitting every registered run.

Jobs (all UTC, coalesced, one instance each): `tick` reads logs, handles control requests and new
registrations; `guards` runs the live checks on the guard interval; `sample` feeds the GPU probe's
utilization average; `deliver` drains the outbox; one `poll:<run>` date job per run posts polls on
the declared cadence. Exits are seen the instant they happen by a watcher thread per attempt.
SIGINT/SIGTERM stop the daemon, never the runs: a restarted daemon re-adopts them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import structlog

from babysit import registry as registry_mod
from babysit import sources, wake
from babysit.errors import BabysitError, DaemonAlreadyRunning
from babysit.executors import open_executor
from babysit.notify import Channel, deliver_due
from babysit.probes.gpu import GpuProbe
from babysit.spec import check_cadence, load_spec
from babysit.store import Store
from babysit.supervisor import DaemonContext, RunSupervisor

log = structlog.get_logger("babysit.daemon")


class Daemon:
    def __init__(self, registry_path: Path, *, gpu_probe: GpuProbe, channel: Channel, accelerated: bool = False,
                 exit_when_idle: bool = False, tick_seconds: float | None = None) -> None:
        self.registry_path = Path(registry_path).resolve()
        self.registry = registry_mod.load(self.registry_path)
        self.state_dir = self.registry.state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.accelerated = accelerated
        self.exit_when_idle = exit_when_idle
        self.scale = 1.0 if accelerated else 60.0  # seconds per declared minute
        # Real time: a tick every 5 s is enough (exits come from watcher threads at once, a control
        # request wakes the tick at once through babysit.wake, guards and polls read the log
        # themselves); each job run costs the daemon CPU (bench/README.md).
        self.tick_seconds = tick_seconds or (0.25 if accelerated else 5.0)
        self.guard_seconds = self.registry.daemon.guard_interval_seconds * self.scale / 60
        self.channel = channel
        self.store = Store.in_dir(self.state_dir)
        self.ctx = DaemonContext(store=self.store, state_dir=self.state_dir, gpu_probe=gpu_probe,
                                 executors={}, scale=self.scale, default_channel=self.registry.daemon.channel,
                                 schedule_poll=self._schedule_poll)
        self.supervisors: dict[str, RunSupervisor] = {}
        self.stop_event = threading.Event()
        self._lock_file: Any = None
        self.scheduler: Any = None
        self._broken_specs: dict[str, str] = {}
        self._registry_seen: tuple[int, int, int] | None = None
        self._seen_data_version: int | None = None

    # -- lifecycle --------------------------------------------------------------------------------------
    def acquire(self) -> None:
        """One daemon per state directory: a second `babysit up` refuses instead of double-babysitting."""
        path = self.state_dir / "daemon.lock"
        self._lock_file = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600), "a+")  # owner-only
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.seek(0)
            holder = self._lock_file.read().strip() or "another process"
            raise DaemonAlreadyRunning(
                f"a babysit daemon already runs for {self.state_dir} (pid {holder})",
                hint="stop it first (Ctrl-C or `kill <pid>`), or use another --registry") from None
        self._lock_file.truncate(0)
        self._lock_file.write(str(os.getpid()))
        self._lock_file.flush()

    def executor(self, name: str) -> Any:
        if name not in self.ctx.executors:
            self.ctx.executors[name] = open_executor(name, self.state_dir)
        return self.ctx.executors[name]

    def run(self) -> int:
        from apscheduler.schedulers.background import BackgroundScheduler

        self.acquire()
        self._install_signals()
        self.scheduler = BackgroundScheduler(
            timezone=timezone.utc,
            # a job that missed its time (the machine slept) runs once, late, rather than being dropped
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 3600},
        )
        self.scheduler.add_job(self.tick, "interval", seconds=self.tick_seconds, id="tick")
        self.scheduler.add_job(self.guards, "interval", seconds=max(self.guard_seconds, self.tick_seconds),
                               id="guards")
        # Delivery runs the moment a message is queued (the store wakes it) and on an interval for
        # retries after a Slack failure.
        self.scheduler.add_job(self.deliver, "interval", seconds=0.5 if self.accelerated else 60.0, id="deliver")
        self.store.on_enqueue = self._wake_delivery
        log.info("daemon up", registry=str(self.registry_path), state=str(self.state_dir), pid=os.getpid(),
                 accelerated=self.accelerated)
        self.reconcile_registry()
        self.scheduler.start()
        try:
            # The main thread only waits for a signal (and, with --exit-when-idle, for the end):
            # every wake-up costs the daemon CPU it owes its runs.
            while not self.stop_event.wait(0.5 if self.exit_when_idle else 5.0):
                if self.exit_when_idle and self.idle():
                    break
        finally:
            self.shutdown()
        return 0

    def _wake_delivery(self) -> None:
        with contextlib.suppress(Exception):  # not started yet, or shutting down: the interval covers it
            self.scheduler.modify_job("deliver", next_run_time=datetime.now(timezone.utc))

    def _ensure_sampling(self) -> None:
        """One cheap utilization read (~1 µs) a second per watched GPU, only once a run has GPUs: a poll's
        util is the average of its whole window, not the last fraction of a second."""
        if self.scheduler is not None and self.scheduler.get_job("sample") is None:
            self.scheduler.add_job(self.ctx.gpu_probe.sample, "interval", seconds=1.0, id="sample")

    def shutdown(self) -> None:
        if self.scheduler is not None:
            with contextlib.suppress(Exception):
                self.scheduler.shutdown(wait=True)
        with contextlib.suppress(Exception):
            self.deliver()
        self.ctx.gpu_probe.close()
        log.info("daemon down: runs keep running; `babysit up` re-adopts them")
        self.store.close()
        if self._lock_file is not None:
            self._lock_file.close()

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.stop_event.set())
        # a control request was queued (babysit.wake): run the tick now, off the signal handler's frame
        signal.signal(wake.WAKE_SIGNAL, lambda *_: threading.Thread(target=self._wake_tick, daemon=True).start())

    def _wake_tick(self) -> None:
        with contextlib.suppress(Exception):  # not started yet, or shutting down: the tick interval covers it
            self.scheduler.modify_job("tick", next_run_time=datetime.now(timezone.utc))

    def idle(self) -> bool:
        """Nothing running, pending or retrying, and every queued message delivered."""
        if any(s.is_active() for s in self.supervisors.values()):
            return False
        return self.store.pending_count() == 0

    # -- registry ---------------------------------------------------------------------------------------
    def reconcile_registry(self) -> None:
        """Start a supervisor for every registered run not yet supervised (new registrations included)."""
        try:
            stat = self.registry_path.stat()
            seen = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        except FileNotFoundError:
            seen = None
        if seen is not None and seen == self._registry_seen:
            return  # unchanged since the last look: no parse every tick
        try:
            self.registry = registry_mod.load(self.registry_path)
            self._registry_seen = seen
        except BabysitError as exc:
            log.error("registry unreadable; keeping the last good one", error=exc.message)
            return
        for entry in self.registry.runs:
            if entry.name in self.supervisors:
                continue
            path = self.registry.spec_path(entry)
            try:
                spec = load_spec(path)
                check_cadence(spec, self.accelerated)
                if spec.source.kind == "tensorboard":
                    sources.require()
            except Exception as exc:  # a BabysitError names the field; anything else must not stop the others
                message = exc.message if isinstance(exc, BabysitError) else \
                    f"internal error reading {path}: {type(exc).__name__}: {exc}"[:500]
                if self._broken_specs.get(entry.name) != message:
                    self._broken_specs[entry.name] = message
                    log.error("run spec refused; not babysitting it", run=entry.name, error=message,
                              hint=getattr(exc, "hint", None), exc_info=None if isinstance(exc, BabysitError) else exc)
                    self.store.enqueue(entry.name, "text", {"run": entry.name, "text":
                                       f"⚠️ {entry.name}: spec refused, not babysat: {message}"}, time.time(),
                                       dedupe_key=f"{entry.name}:spec-refused:{message}")
                continue
            self.executor(spec.executor)
            if spec.gpus:
                self._ensure_sampling()
            try:
                supervisor = RunSupervisor(self.ctx, spec, entry.prereg_sha256)
            except Exception as exc:  # its stored state is unreadable: the other runs still start
                message = f"could not be set up: {type(exc).__name__}: {exc}"[:500]
                if self._broken_specs.get(entry.name) != message:  # once, not every tick
                    self._broken_specs[entry.name] = message
                    log.error("run could not be set up; not babysitting it", run=entry.name, exc_info=exc)
                continue
            self.supervisors[entry.name] = supervisor
            try:
                supervisor.start()
            except BabysitError as exc:
                log.error("run could not start", run=entry.name, error=exc.message)
            except Exception as exc:  # one run's data never stops the daemon's start-up or the other runs
                supervisor.internal_error("starting", exc)

    # -- jobs -------------------------------------------------------------------------------------------
    def tick(self) -> None:
        self.reconcile_registry()
        self.handle_requests()
        for supervisor in list(self.supervisors.values()):
            try:
                with supervisor.lock:
                    if supervisor.attempt is not None and supervisor.attempt.status == "running":
                        supervisor.read_log()
                        supervisor.check_exit()
            except Exception as exc:
                _run_failed(supervisor, "reading its log", exc)

    def guards(self) -> None:
        for supervisor in list(self.supervisors.values()):
            try:
                supervisor.guard(stall_seconds=supervisor.spec.guards.stall_minutes * self.scale)
            except Exception as exc:
                _run_failed(supervisor, "checking its guards", exc)

    def deliver(self) -> None:
        try:
            deliver_due(self.store, self.channel, time.time)
        except Exception:
            log.exception("delivery failed")
        # A message waiting for its retry (Slack said 429 or 503) is delivered at its time, not at
        # the next interval: the job reschedules itself to the earliest pending next_try_at.
        due = self.store.next_due_at()
        if due is not None and self.scheduler is not None:
            with contextlib.suppress(Exception):
                self.scheduler.modify_job("deliver", next_run_time=datetime.fromtimestamp(
                    max(due, time.time() + 0.25), timezone.utc))

    def _schedule_poll(self, run: str, when: float) -> None:
        if self.scheduler is None:
            return
        self.scheduler.add_job(self._poll_job, "date", run_date=datetime.fromtimestamp(when, timezone.utc),
                               args=[run], id=f"poll:{run}", replace_existing=True)

    def _poll_job(self, run: str) -> None:
        supervisor = self.supervisors.get(run)
        if supervisor is not None:
            try:
                supervisor.poll()
            except Exception as exc:
                _run_failed(supervisor, "polling it", exc)

    def handle_requests(self) -> None:
        """Control requests from `babysit abort`, `/babysit abort` and `/babysit poll`, executed within a tick.

        Requests come from other processes (the CLI, the bot); SQLite's data_version says whether any
        other connection wrote since the last look, so an idle tick costs no query."""
        version = self.store.data_version()
        if version == self._seen_data_version:
            return
        self._seen_data_version = version
        for req in self.store.pending_requests():
            supervisor = self.supervisors.get(req.run)
            now = time.time()
            if supervisor is None:
                self.store.finish_request(req.id, f"no run named {req.run} is babysat", now)
                continue
            try:
                self._handle_request(req, supervisor, now)
            except Exception as exc:  # answered, so the asker is not left waiting; the others go on
                _run_failed(supervisor, f"handling a {req.kind} request", exc)
                self.store.finish_request(req.id, f"failed: {type(exc).__name__}: {exc}"[:300], now)

    def _handle_request(self, req: Any, supervisor: RunSupervisor, now: float) -> None:
        """One control request; answers it (finish_request) with what was done."""
        if req.kind == "abort":
            by = req.body.get("requested_by", "?")
            if supervisor.request_stop("abort"):
                supervisor._incident("abort", f"abort requested by {by}", {"requested_by": by},
                                     key=f"{req.run}:abort:{req.id}")
                result = "stopping"
            else:
                result = "not running"
            self.store.finish_request(req.id, result, now)
        elif req.kind == "poll-now":
            supervisor.poll("on-demand")
            self.store.finish_request(req.id, "polled", now)
        else:
            self.store.finish_request(req.id, f"unknown action {req.kind}", now)


def _run_failed(supervisor: RunSupervisor, where: str, exc: Exception) -> None:
    """A job's error on one run: a BabysitError (the store failing, a refused read) is logged and the job
    tries again on its next run; anything else is an internal-error incident on that run. The daemon
    and the other runs go on either way."""
    if isinstance(exc, BabysitError):
        log.error(f"{where} failed", run=supervisor.run, error=exc.message, exc_info=exc)
    else:
        supervisor.internal_error(where, exc)
