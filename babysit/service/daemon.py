"""`babysit up`: one daemon per state directory, on APScheduler, babysitting every registered run.

Event-driven: the daemon sleeps until something happens. One interval job, `guards`, runs the live
checks on the guard interval (and the backstops: new registrations, a request whose wake was lost, an
exit not seen). Everything else comes when it is due: a control request (`babysit abort`, `/babysit
abort`, poll now) wakes the main thread at once through SIGUSR1 (`babysit.runtime.wake`); an exit wakes the one
exit-watcher thread (`babysit.runtime.exitwatch`); a queued message wakes the delivery thread
(`babysit.channels.delivery`); SIGKILLs after a stop's grace period and GPU re-reads are date jobs keyed by run
(`timers.SchedulerTimers`), and every run's polls share one date job, at the earliest, whose round
polls all the runs falling due together in one transaction (`babysit.run.polling`). Two timers exist only
while they have work: the GPU sampler (utilization every `[daemon].gpu_sample_seconds`, 2 s;
`babysit.service.sampler`; with NVML on the probe's NVML worker, one wake-up a sample) while a run with
GPUs is active, and the `read` job (the log, 5 s) while a run whose records babysit stamps with their read
time is ([source] stdout or csv).
SIGINT/SIGTERM stop the daemon, never the runs: a restarted daemon re-adopts them.

This module is the composition root: it builds the store, executors, probes, channels and timers, and
says when each part acts. The parts live beside it: roster.py (which runs are babysat, relaunches),
control.py (requests carried out once), jobs.py (the scheduler), fleet_report.py (a fleet box's GPU
report), sampler.py. What a run does is in babysit/run/, and every rule in babysit/core/.
"""

from __future__ import annotations

import fcntl
import os
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import structlog

from babysit.campaign import hook as campaign_hook
from babysit.channels.delivery import DeliveryWorker
from babysit.channels.notify import Channel
from babysit.core.errors import BabysitError, DaemonAlreadyRunning, RegistryError
from babysit.db.url import HOST_ENV, open_store
from babysit.executors import Executor
from babysit.probes.gpu import GpuProbe, open_gpu_probe
from babysit.probes.host import HostProbe, ProcHostProbe
from babysit.run.context import DaemonContext
from babysit.runtime import registry as registry_mod
from babysit.runtime import wake
from babysit.runtime.clock import SYSTEM, Clock
from babysit.runtime.exitwatch import ExitWatcher
from babysit.runtime.timers import SchedulerTimers, ThreadTimers, Timers
from babysit.service.control import ControlRequests
from babysit.service.fleet_report import FleetReport
from babysit.service.jobs import Jobs
from babysit.service.roster import Roster
from babysit.service.sampler import sampler_for

if TYPE_CHECKING:  # types only: psycopg only for a fleet
    from babysit.db.fleet import FleetMember

log = structlog.get_logger("babysit.service.daemon")


class Daemon:
    """The daemon. Its collaborators are injected: tests drive it in process with a fake clock, a fake
    executor, a host probe and timers of their own (tests/test_daemon_inprocess.py)."""

    def __init__(self, registry_path: Path, *, gpu_probe: GpuProbe, channel: Channel, accelerated: bool = False,
                 exit_when_idle: bool = False, tick_seconds: float | None = None, clock: Clock = SYSTEM,
                 host_probe: HostProbe | None = None, executors: Mapping[str, Executor] | None = None,
                 timers: Timers | None = None, only: frozenset[str] | None = None,
                 on_interrupt: Callable[[int], None] | None = None,
                 on_gateway: Callable[[bool], None] | None = None,
                 report_probe: Callable[[], GpuProbe] | None = None) -> None:
        self.registry_path = Path(registry_path).resolve()
        registry = registry_mod.load(self.registry_path)
        self.state_dir = registry.state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.accelerated = accelerated
        self.exit_when_idle = exit_when_idle
        # `babysit run`: a Ctrl-C means what it says there (a stop of the run), called on the main thread
        # with its count
        self.on_interrupt = on_interrupt
        self.on_gateway = on_gateway  # `up --bot` in a fleet: the bot's connection follows the gateway lease
        self._interrupts = 0
        self.last_interrupt = "Ctrl-C"  # what the last interrupt was: Ctrl-C (SIGINT) or SIGTERM
        self._interrupts_handled = 0
        self.scale = 1.0 if accelerated else 60.0  # seconds per declared minute
        # The read interval of runs stamped at read time (docs/your-trainer.md); every other log is read
        # by the guard round, polls, exits and requests: each wake-up costs the daemon CPU (bench/README.md).
        self.tick_seconds = tick_seconds or (0.25 if accelerated else 5.0)
        self.guard_seconds = registry.daemon.guard_interval_seconds * self.scale / 60
        self.channel = channel
        self.store = open_store(registry, daemon=True)
        if self.store.backend == "sqlite" and (registry.host.name or os.environ.get(HOST_ENV)):
            self.store.close()
            raise RegistryError(
                f"{self.registry_path}: a host name is set ([host] name or ${HOST_ENV}) but no [store] url: "
                "a fleet of boxes needs a PostgreSQL (SQLite is one box's file)",
                hint="set [store] url (docs/fleet.md), or remove the host name to babysit this box alone")
        bind = getattr(channel, "read_from", None)  # a fleet's Slack channel reads through this store
        if bind is not None and self.store.backend == "postgresql":
            bind(self.store)
        self.fleet: FleetMember | None = None  # a box of a fleet (PostgreSQL): its lease and LISTEN
        self.exits = ExitWatcher()
        self._own_timers = timers is None  # the scheduler's, once run() starts it
        self.ctx = DaemonContext(store=self.store, state_dir=self.state_dir, gpu_probe=gpu_probe,
                                 executors=dict(executors or {}), scale=self.scale,
                                 default_channel=registry.daemon.channel, clock=clock,
                                 host_probe=host_probe or ProcHostProbe(), timers=timers or ThreadTimers(),
                                 exits=self.exits)
        self.ctx.reads.watched = self._printing_runs
        self.roster = Roster(self.registry_path, registry, self.ctx, accelerated=accelerated, only=only)
        self.supervisors = self.roster.supervisors  # run -> its supervisor
        self.requests = ControlRequests(self.roster, self.ctx)
        self.delivery = DeliveryWorker(self.store, channel)
        # runs only while a run with GPUs is active
        self.sampler = sampler_for(gpu_probe, registry.daemon.gpu_sample_seconds)
        # a fleet's box publishes its GPU reading with its lease (a probe of its own: fleet_report says why)
        self.report = FleetReport(report_probe or (lambda: open_gpu_probe(None, health_events=False)),
                                  self.supervisors, self.ctx.now)
        subscribe = getattr(gpu_probe, "subscribe", None)  # NVML: an event wakes the guards of its GPU's runs
        if subscribe is not None:
            subscribe(self._on_gpu_signal)
        self.stop_event = threading.Event()
        self._wakeup = threading.Event()  # set by SIGUSR1 (a control request), SIGINT and SIGTERM
        self._jobs_lock = threading.Lock()
        self._control_lock = threading.Lock()  # requests and registrations: the main thread or the guard round
        self._lock_file: IO[str] | None = None
        self.jobs: Jobs | None = None  # APScheduler, imported lazily at start
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

    def run(self) -> int:
        """Start, then sleep in the main thread until a signal: a wake handles control requests here."""
        self.start()
        try:
            while not self.stop_event.is_set():
                # no timeout unless the daemon exits when idle: every wake-up costs CPU owed to the runs
                if self._wakeup.wait(0.5 if self.exit_when_idle else None):
                    self._wakeup.clear()
                    self._interrupted()
                    if not self.stop_event.is_set():
                        self._on_wake()
                if self.exit_when_idle and self.idle():
                    break
        finally:
            self.shutdown()
        return 0

    def start(self) -> None:
        """Take the state directory, start the scheduler, the delivery thread and every run (in process
        for benches: `run()` is start + the main thread's wait)."""
        self._install_signals()  # before the lock: whoever finds the lock held may signal at once
        self.acquire()
        self.jobs = Jobs()
        if self._own_timers:
            self.ctx.timers = SchedulerTimers(self.jobs.scheduler)
        self.jobs.every("guards", self.guards, self.guard_seconds)
        self.store.on_enqueue = self.delivery.wake
        if self.store.backend == "postgresql":
            from babysit.db.fleet import FleetMember

            # PostgreSQL down: the runs are babysat on a local mirror and the writes journaled, replayed
            # when it is back (docs/fleet.md); then the delivery and the requests are looked at again
            self.store.start_journal(on_reconnect=self._reconnected)

            registry = self.roster.registry
            self.fleet = FleetMember(self.store.url, self.store.host, on_wake=self._wakeup.set,
                                     on_alert=self.delivery.wake, lease_s=registry.host.lease_seconds,
                                     on_gateway=self.on_gateway, report=lambda: self.report.latest,
                                     deadline_s=registry.store.deadline_seconds)
            # started while PostgreSQL is down: the lease (and the gateway) is taken once it is back
            self.fleet.start(connect=not self.store.down)
            self.report.start(self.fleet.renew_s)
        log.info("daemon up", registry=str(self.registry_path), state=str(self.state_dir), pid=os.getpid(),
                 accelerated=self.accelerated)
        self._control()  # every registered run started; requests queued while no daemon was up
        campaign_hook.catch_up(self.ctx)  # campaign steps a killed daemon left due (docs/campaigns.md)
        self._sync_jobs()
        self.delivery.start()
        self.ctx.reads.start()
        self.jobs.start()

    def _reconnected(self) -> None:
        """The journal replayed: whatever was notified meanwhile is lost, so every request is looked at
        once (data_version moves on), and what was queued goes out."""
        self._seen_data_version = None
        self._wakeup.set()
        self.delivery.wake()

    def _interrupted(self) -> None:
        """Ctrl-C under `on_interrupt`: its handler runs here, on the main thread, never in the signal
        handler (which may have interrupted this thread holding a lock)."""
        while self.on_interrupt is not None and self._interrupts_handled < self._interrupts:
            self._interrupts_handled += 1
            try:
                self.on_interrupt(self._interrupts_handled)
            except Exception:
                log.exception("handling Ctrl-C failed")

    def _on_wake(self) -> None:
        """SIGUSR1: a control request (or a registration) is waiting: act on it now, on this thread."""
        try:
            if self._control():
                self.delivery.wake()  # another process (or box) wrote: what it queued for us goes out now
            self._sync_jobs()
        except Exception:
            log.exception("handling a wake failed")

    def _control(self) -> bool:
        """New registrations, then control requests, one caller at a time (the main thread on a wake, the
        guard round as the backstop): a request is never handled twice, a run never supervised twice.
        True when another process wrote to the store since the last look."""
        with self._control_lock:
            self.reconcile_registry()  # one stat while the registry is unchanged
            return self.handle_requests()

    def _sync_jobs(self) -> None:
        """Interval jobs only while they have work: an idle daemon wakes for its guard round alone."""
        if self.jobs is None:
            return
        active = [s for s in list(self.supervisors.values())  # a running attempt's run is active: no query
                  if s.is_running() or s.is_active()]
        with self._jobs_lock:  # the main thread (a wake) and the guard round may both sync
            if any(s.spec.gpus for s in active):  # one cheap utilization read (~1 µs) a second per watched GPU
                self.sampler.start()
            else:
                self.sampler.stop()
            self.jobs.keep("read", any(s.spec.source.copies for s in active), self.read_logs, self.tick_seconds)
        self.ctx.reads.nudge()  # a run started or ended: the reader thread looks whether it watches any

    def _printing_runs(self) -> list[Any]:
        """The logs of the running runs whose printed output babysit reads (the reader thread watches it grow)."""
        return [s.runlog for s in list(self.supervisors.values()) if s.spec.source.copies and s.is_running()]

    def shutdown(self) -> None:
        self.ctx.reads.close()  # first: an exit's drain in a job stops at its next chunk, for the next daemon
        if self.jobs is not None:
            self.jobs.shutdown()  # the jobs already started or queued finish here
        self.delivery.close()
        self.sampler.stop()
        self.exits.close()
        if isinstance(self.ctx.timers, ThreadTimers):
            self.ctx.timers.close()
        self.deliver()
        self.ctx.gpu_probe.close()
        log.info("daemon down: runs keep running; `babysit up` re-adopts them")
        self.report.close()
        if self.fleet is not None:
            self.fleet.close()
        self.store.close()
        if self._lock_file is not None:
            self._lock_file.close()

    def deliver(self) -> int:
        """One delivery pass on the caller's thread (the daemon's last, at shutdown)."""
        return self.delivery.deliver()

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def stop(*_: object) -> None:
            self.stop_event.set()
            self._wakeup.set()

        def interrupt(signum: int, _frame: object) -> None:
            self.last_interrupt = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            self._interrupts += 1
            self._wakeup.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stop)
        if self.on_interrupt is not None:  # `babysit run`: Ctrl-C and SIGTERM stop the run, not the daemon
            signal.signal(signal.SIGINT, interrupt)
            signal.signal(signal.SIGTERM, interrupt)
        signal.signal(wake.WAKE_SIGNAL, lambda *_: self._wakeup.set())  # a control request: run() acts on it

    def idle(self) -> bool:
        """Nothing running, pending or retrying, and every queued message delivered."""
        if any(s.is_active() for s in self.supervisors.values()):
            return False
        return self.store.pending_count() == 0

    # -- registrations and requests ----------------------------------------------------------------------
    def reconcile_registry(self) -> None:
        """Start a supervisor for every registered run not yet supervised (new registrations included)."""
        self.roster.reconcile()

    def _on_gpu_signal(self, index: int, signals: tuple[Any, ...]) -> None:
        """On the probe's event thread: the runs on GPU `index` check their guards now, on the timers (an
        Xid reaches its run within a second, not at the next guard round)."""
        for supervisor in list(self.supervisors.values()):
            if supervisor.is_running() and index in supervisor.spec.gpus:
                supervisor.later(f"gpu-signal:{supervisor.run}", 0.0, supervisor.guard,
                                  "checking its guards after a GPU event")

    # -- the rounds -------------------------------------------------------------------------------------
    def guards(self) -> None:
        """The guard round: every running run checked on one observation each; then the backstops for what
        events bring (a registration, a request or a message another process wrote, an exit not seen)."""
        if self._control():
            self.delivery.wake()  # another process wrote: a message it queued goes out now
        if self.store.backend == "postgresql":
            try:  # the local mirror sees an amendment declared elsewhere before any outage needs it
                self.store.refresh_mirror()
            except BabysitError as exc:
                log.warning("refreshing the local mirror failed", error=exc.message)
        try:
            with self.store.deferred_readings():  # every run's log offsets in one commit at the end
                for supervisor in list(self.supervisors.values()):
                    try:
                        running = supervisor.is_running()
                        if running and not self.exits.is_watching(supervisor.run):
                            supervisor.exits.check_exit_later()  # no descriptor watched (Slurm), or its handling failed
                        if running:
                            supervisor.guard()
                        supervisor.retry_posts()  # posts the outbox refused: queued now, in order, once
                        supervisor.retry_verdict()  # a FINAL verdict the store refused to save: saved now
                    except Exception as exc:
                        supervisor.failed("checking its guards", exc)
        except BabysitError as exc:  # the offsets' commit: the next round writes them again, whole
            log.error("saving the runs' log offsets failed", error=exc.message)
        self._sync_jobs()

    def read_logs(self) -> None:
        """The read interval of runs whose records babysit stamps with the time it reads them ([source]
        stdout, csv): a step's time is known to within it (docs/your-trainer.md)."""
        try:
            with self.store.deferred_readings():
                for supervisor in list(self.supervisors.values()):
                    if not supervisor.spec.source.copies:
                        continue
                    try:
                        if supervisor.is_running():
                            supervisor.runlog.read_log(wait=False)  # a budget's worth: a backlog to the reader thread
                    except Exception as exc:
                        supervisor.failed("reading its log", exc)
        except BabysitError as exc:
            log.error("saving the runs' log offsets failed", error=exc.message)

    def handle_requests(self) -> bool:
        """Control requests from `babysit abort`, `/babysit abort` and `/babysit poll`, executed when the
        requester's wake arrives (and by the guard round, should a wake be lost). True when another process
        wrote to the store since the last look (SQLite's data_version): without that, no query is made."""
        version = self.store.data_version()
        if version == self._seen_data_version:
            return False
        requests = self.store.pending_requests()  # raising, the next look reads them again
        self._seen_data_version = version
        if not self.requests.answer(requests):  # the next round looks again, though nobody queues anything
            self._seen_data_version = None
        return True
