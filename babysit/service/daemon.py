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

Long on purpose: this is the composition root (it builds the store, executors, probes, channels, timers
and each run's supervisor and wires them together) and the scheduler's job list; what a run does is in
babysit/run/, and every rule in babysit/core/.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import os
import signal
import threading
from collections.abc import Callable, Mapping
from datetime import timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import structlog

from babysit import sources
from babysit.campaign import clicks
from babysit.campaign import hook as campaign_hook
from babysit.channels.delivery import DeliveryWorker
from babysit.channels.notify import Channel
from babysit.core.errors import BabysitError, DaemonAlreadyRunning, RegistryError, SpecError
from babysit.core.gpu import report as gpureport
from babysit.core.spec.run_toml import RunSpec, check_cadence, load_spec
from babysit.core.status import RunStatus
from babysit.db.store import OWED_ANSWERS_FACT, STARTED_REQUESTS_FACT, Row
from babysit.db.url import HOST_ENV, open_store
from babysit.executors import Executor
from babysit.executors.local import LocalExecutor
from babysit.executors.slurm import SlurmExecutor
from babysit.probes.gpu import GpuProbe, open_gpu_probe
from babysit.probes.host import HostProbe, ProcHostProbe, process_tree
from babysit.register import relaunch
from babysit.run.context import DaemonContext
from babysit.run.supervisor import RunSupervisor
from babysit.runtime import registry as registry_mod
from babysit.runtime import wake
from babysit.runtime.clock import SYSTEM, Clock
from babysit.runtime.exitwatch import ExitWatcher
from babysit.runtime.faults import crash_point
from babysit.runtime.timers import SchedulerTimers, ThreadTimers, Timers
from babysit.service.sampler import sampler_for

JOB_WORKERS = 10  # threads the scheduler's jobs run on (APScheduler's default): the guard round, the timers
if TYPE_CHECKING:  # types only: APScheduler loads when the daemon starts, psycopg only for a fleet
    from apscheduler.schedulers.background import BackgroundScheduler

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
        self.registry = registry_mod.load(self.registry_path)
        self.state_dir = self.registry.state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.accelerated = accelerated
        self.exit_when_idle = exit_when_idle
        # `babysit run`: babysit these runs alone (the registry's others wait for `babysit up`), and let a
        # Ctrl-C mean what it says there (a stop of the run), called on the main thread with its count
        self.only = only
        self.on_interrupt = on_interrupt
        self.on_gateway = on_gateway  # `up --bot` in a fleet: the bot's connection follows the gateway lease
        self._interrupts = 0
        self.last_interrupt = "Ctrl-C"  # what the last interrupt was: Ctrl-C (SIGINT) or SIGTERM
        self._interrupts_handled = 0
        self.scale = 1.0 if accelerated else 60.0  # seconds per declared minute
        # The read interval of runs stamped at read time (docs/your-trainer.md); every other log is read
        # by the guard round, polls, exits and requests: each wake-up costs the daemon CPU (bench/README.md).
        self.tick_seconds = tick_seconds or (0.25 if accelerated else 5.0)
        self.guard_seconds = self.registry.daemon.guard_interval_seconds * self.scale / 60
        self.channel = channel
        self.store = open_store(self.registry, daemon=True)
        if self.store.backend == "sqlite" and (self.registry.host.name or os.environ.get(HOST_ENV)):
            self.store.close()
            raise RegistryError(
                f"{self.registry_path}: a host name is set ([host] name or ${HOST_ENV}) but no [store] url: "
                "a fleet of boxes needs a PostgreSQL (SQLite is one box's file)",
                hint="set [store] url (docs/fleet.md), or remove the host name to babysit this box alone")
        bind = getattr(channel, "read_from", None)  # a fleet's Slack channel reads through this store
        if bind is not None and self.store.backend == "postgresql":
            bind(self.store)
        self.fleet: FleetMember | None = None  # a box of a fleet (PostgreSQL): its lease and LISTEN
        # a fleet's box publishes its GPU reading with its lease for the gateway's `/babysit gpus`, through a
        # probe of its own: a read of the daemon's would take the health signals its guards wait for
        self._report_probe_factory = report_probe or (lambda: open_gpu_probe(None, health_events=False))
        self._report_probe: GpuProbe | None = None
        self._report: dict[str, Any] = {}  # the latest reading, taken on a thread of its own (never the lease's)
        self._report_stop = threading.Event()
        self.exits = ExitWatcher()
        self._own_timers = timers is None  # the scheduler's, once run() starts it
        self.ctx = DaemonContext(store=self.store, state_dir=self.state_dir, gpu_probe=gpu_probe,
                                 executors=dict(executors or {}), scale=self.scale,
                                 default_channel=self.registry.daemon.channel, clock=clock,
                                 host_probe=host_probe or ProcHostProbe(), timers=timers or ThreadTimers(),
                                 exits=self.exits)
        self.ctx.reads.watched = self._printing_runs
        self.delivery = DeliveryWorker(self.store, channel)
        # runs only while a run with GPUs is active
        self.sampler = sampler_for(gpu_probe, self.registry.daemon.gpu_sample_seconds)
        self.supervisors: dict[str, RunSupervisor] = {}
        subscribe = getattr(gpu_probe, "subscribe", None)  # NVML: an event wakes the guards of its GPU's runs
        if subscribe is not None:
            subscribe(self._on_gpu_signal)
        self.stop_event = threading.Event()
        self._wakeup = threading.Event()  # set by SIGUSR1 (a control request), SIGINT and SIGTERM
        self._jobs_lock = threading.Lock()
        self._control_lock = threading.Lock()  # requests and registrations: the main thread or the guard round
        self._lock_file: IO[str] | None = None
        self.scheduler: BackgroundScheduler | None = None  # APScheduler, imported lazily at start
        self._broken_specs: dict[str, str] = {}
        self._registry_seen: tuple[int, int, int] | None = None
        self._seen_data_version: int | None = None
        self._owed: dict[int, str] = {}  # request id -> its answer, carried out but not yet written
        self._owed_saved: dict[str, dict[str, str]] = {}  # run -> its owed answers as its facts hold them
        self._started_saved: dict[str, dict[str, str]] = {}  # run -> its requests begun (_mark_started)

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

    def executor(self, name: str) -> Executor:
        if name not in self.ctx.executors:
            self.ctx.executors[name] = open_executor(name, self.state_dir)
        return self.ctx.executors[name]

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
        from apscheduler.schedulers.background import BackgroundScheduler

        self._install_signals()  # before the lock: whoever finds the lock held may signal at once
        self.acquire()
        # the workers' pool is the daemon's own, so shutdown() can wait for running jobs without holding
        # the scheduler's lock (see shutdown)
        self._job_pool = concurrent.futures.ThreadPoolExecutor(JOB_WORKERS, thread_name_prefix="babysit-job")
        self.scheduler = BackgroundScheduler(
            timezone=timezone.utc,
            executors={"default": _pool_executor(self._job_pool)},
            # a job that missed its time (the machine slept) runs once, late, rather than being dropped
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 3600},
        )
        if self._own_timers:
            self.ctx.timers = SchedulerTimers(self.scheduler)
        self.scheduler.add_job(self.guards, "interval", seconds=self.guard_seconds, id="guards")
        self.store.on_enqueue = self.delivery.wake
        if self.store.backend == "postgresql":
            from babysit.db.fleet import FleetMember

            # PostgreSQL down: the runs are babysat on a local mirror and the writes journaled, replayed
            # when it is back (docs/fleet.md); then the delivery and the requests are looked at again
            self.store.start_journal(on_reconnect=self._reconnected)

            self.fleet = FleetMember(self.store.url, self.store.host, on_wake=self._wakeup.set,
                                     on_alert=self.delivery.wake, lease_s=self.registry.host.lease_seconds,
                                     on_gateway=self.on_gateway, report=lambda: self._report,
                                     deadline_s=self.registry.store.deadline_seconds)
            # started while PostgreSQL is down: the lease (and the gateway) is taken once it is back
            self.fleet.start(connect=not self.store.down)
            threading.Thread(target=self._report_loop, args=(self.fleet.renew_s,), name="fleet-report",
                             daemon=True).start()
        log.info("daemon up", registry=str(self.registry_path), state=str(self.state_dir), pid=os.getpid(),
                 accelerated=self.accelerated)
        self._control()  # every registered run started; requests queued while no daemon was up
        campaign_hook.catch_up(self.ctx)  # campaign steps a killed daemon left due (docs/campaigns.md)
        self._sync_jobs()
        self.delivery.start()
        self.ctx.reads.start()
        self.scheduler.start()

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
        if self.scheduler is None:
            return
        active = [s for s in list(self.supervisors.values())  # a running attempt's run is active: no query
                  if s.is_running() or s.is_active()]
        with self._jobs_lock:  # the main thread (a wake) and the guard round may both sync
            if any(s.spec.gpus for s in active):  # one cheap utilization read (~1 µs) a second per watched GPU
                self.sampler.start()
            else:
                self.sampler.stop()
            self._keep_job("read", any(s.spec.source.copies for s in active), self.read_logs, self.tick_seconds)
        self.ctx.reads.nudge()  # a run started or ended: the reader thread looks whether it watches any

    def _printing_runs(self) -> list[Any]:
        """The logs of the running runs whose printed output babysit reads (the reader thread watches it grow)."""
        return [s.runlog for s in list(self.supervisors.values()) if s.spec.source.copies and s.is_running()]

    def _keep_job(self, job_id: str, wanted: bool, fn: Callable[[], None], seconds: float) -> None:
        have = self.scheduler.get_job(job_id) is not None
        if wanted and not have:
            self.scheduler.add_job(fn, "interval", seconds=seconds, id=job_id)
        elif have and not wanted:
            with contextlib.suppress(Exception):
                self.scheduler.remove_job(job_id)

    def shutdown(self) -> None:
        self.ctx.reads.close()  # first: an exit's drain in a job stops at its next chunk, for the next daemon
        if self.scheduler is not None:
            # Not shutdown(wait=True): APScheduler waits for running jobs while holding its job-store
            # lock, and a job that schedules or cancels anything then (a guard round's job sync, an exit's
            # timers) waits for that lock: the daemon hung at exit. Stopped first, the scheduler takes
            # such calls without blocking; then the jobs already started or queued finish here.
            with contextlib.suppress(Exception):
                self.scheduler.shutdown(wait=False)
            self._job_pool.shutdown(wait=True)
        self.delivery.close()
        self.sampler.stop()
        self.exits.close()
        if isinstance(self.ctx.timers, ThreadTimers):
            self.ctx.timers.close()
        self.deliver()
        self.ctx.gpu_probe.close()
        log.info("daemon down: runs keep running; `babysit up` re-adopts them")
        self._report_stop.set()
        if self.fleet is not None:
            self.fleet.close()
        self.store.close()
        if self._lock_file is not None:
            self._lock_file.close()

    def _report_loop(self, every_s: float) -> None:
        """The box's GPU report for the fleet, read once a lease renewal on this thread: the renewal only
        takes the latest (an NVML call that hangs — up to a minute at its first init — never delays the
        lease, which would get the box declared lost)."""
        try:
            while not self._report_stop.is_set():
                try:
                    self._report = self._fleet_report()
                except Exception as exc:  # a probe's bug: said in the report, tried again next time
                    log.exception("the GPU report for the fleet failed")
                    self._report = {"report_error": f"{type(exc).__name__}: {exc}"[:300]}
                if self._report_stop.wait(every_s):
                    return
        finally:
            if self._report_probe is not None:
                self._report_probe.close()

    def _fleet_report(self) -> dict[str, Any]:
        """What this box publishes with its lease renewals: its GPUs read now, each compute process
        labelled with the run whose live attempt's process tree it is in."""
        if self._report_probe is None:
            self._report_probe = self._report_probe_factory()
        probe = self._report_probe
        probe.sample()
        view = probe.read([], window=gpureport.WINDOW)
        owners: dict[int, str] = {}
        if any(g.processes for g in view.gpus):
            for run, supervisor in list(self.supervisors.items()):
                attempt = supervisor.attempt
                if attempt is not None and attempt.pid and supervisor.is_running():
                    owners.update(dict.fromkeys(process_tree(attempt.pid), run))
        return {"gpus": gpureport.to_json(view, owners, self.ctx.now())}

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
            if entry.name in self.supervisors or (self.only is not None and entry.name not in self.only):
                continue
            path = self.registry.spec_path(entry)
            try:
                spec = self._babysittable(path)
            except Exception as exc:  # a BabysitError names the field; anything else must not stop the others
                message = exc.message if isinstance(exc, BabysitError) else \
                    f"internal error reading {path}: {type(exc).__name__}: {exc}"[:500]
                if self._broken_specs.get(entry.name) != message:
                    self._broken_specs[entry.name] = message
                    log.error("run spec refused; not babysitting it", run=entry.name, error=message, posted=True,
                              hint=getattr(exc, "hint", None), exc_info=None if isinstance(exc, BabysitError) else exc)
                    self.store.enqueue(entry.name, "text", {"run": entry.name, "text":
                                       f"⚠️ {entry.name}: spec refused, not babysat: {message}"}, self.ctx.now(),
                                       dedupe_key=f"{entry.name}:spec-refused:{message}")
                continue
            try:
                owner = self.store.claim_run(entry.name, self.ctx.now(), spec.host)
            except BabysitError as exc:  # PostgreSQL down: a run new to the fleet waits for it
                if self._broken_specs.get(entry.name) != exc.message:
                    self._broken_specs[entry.name] = exc.message
                    log.warning("run not taken up yet", run=entry.name, error=exc.message, hint=exc.hint)
                self._registry_seen = None  # look again at the next round, registry changed or not
                continue
            if owner is not None and owner != self.store.host and owner == spec.host:
                message = f"run {entry.name} is registered for box {owner} ([run] host in {path})"
                if self._broken_specs.get(entry.name) != message:  # its box's daemon babysits it
                    self._broken_specs[entry.name] = message
                    log.info("run registered for another box; its daemon babysits it", run=entry.name, owner=owner)
                continue
            if owner is not None and (owner != self.store.host or spec.host not in (None, owner)):
                # a fleet's run names are the fleet's, and runs never move
                message = (f"run {entry.name} belongs to box {owner} in the fleet's database; this box "
                           f"({self.store.host}) does not babysit it (runs never move: rename it here)")
                if spec.host not in (None, owner):
                    message = (f"{path}: run.host names box {spec.host}, but run {entry.name} belongs to box "
                               f"{owner} in the fleet's database; not babysat (runs never move: rename it, or "
                               f"remove [run] host)")
                if self._broken_specs.get(entry.name) != message:
                    self._broken_specs[entry.name] = message
                    log.error("run owned by another box; not babysitting it", run=entry.name, owner=owner,
                              error=message)
                continue
            self.executor(spec.executor)
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

    def _on_gpu_signal(self, index: int, signals: tuple[Any, ...]) -> None:
        """On the probe's event thread: the runs on GPU `index` check their guards now, on the timers (an
        Xid reaches its run within a second, not at the next guard round)."""
        for supervisor in list(self.supervisors.values()):
            if supervisor.is_running() and index in supervisor.spec.gpus:
                supervisor.later(f"gpu-signal:{supervisor.run}", 0.0, supervisor.guard,
                                  "checking its guards after a GPU event")

    # -- jobs -------------------------------------------------------------------------------------------
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
            with self.store.deferred_facts():  # every run's log offsets in one commit at the end
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
            with self.store.deferred_facts():
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
        unanswered = False
        for req in requests:
            try:
                if req.id not in self._owed and not self._owed_before(req):
                    self._mark_started(req)
                    self._owed[req.id] = self._carry_out(req)[:500]  # carried out once; its answer written again
                    crash_point("after-request")
                self.store.finish_request(req.id, self._owed[req.id], self.ctx.now())
                del self._owed[req.id]
                self._save_owed(req.run, req.id, None)
            except Exception:  # the answer not written (the store refused it): claimed, still owed
                log.exception("control request not answered; answered at the next guard round",
                              request=req.id, run=req.run, action=req.kind)
                unanswered = True
                if req.id in self._owed:
                    self._save_owed(req.run, req.id, self._owed[req.id])
        if unanswered:  # the next round looks again, though nobody queues anything meanwhile
            self._seen_data_version = None
        return True

    def _owed_before(self, req: Row) -> bool:
        """Was `req` taken by a daemon that stopped before its answer was written? Then it is not carried
        out again: the answer that daemon saved in the run's facts is the one owed, or, for a request it had
        begun (`_mark_started`) and died in, an answer saying so."""
        if req.run not in self.supervisors:  # answered without acting ("no run named …"): nothing saved
            return False
        saved, started = self._saved_facts(req.run)
        key = str(req.id)
        if key not in saved and key not in started:
            return False
        self._owed[req.id] = saved[key] if key in saved else _interrupted(req)
        return True

    def _saved_facts(self, run: str) -> tuple[dict[str, str], dict[str, str]]:
        """The run's owed answers and begun requests, read from its facts once (this daemon's writes keep
        them since), so that no write of either goes out before what a predecessor left there is known: a
        write from an empty copy would erase a begun mark and carry its request out twice. A failed read
        raises: the request waits for the next look."""
        if run not in self._owed_saved or run not in self._started_saved:
            facts = self.store.run_state(run)[1]
            self._owed_saved[run] = dict(facts.get(OWED_ANSWERS_FACT) or {})
            self._started_saved[run] = dict(facts.get(STARTED_REQUESTS_FACT) or {})
        return self._owed_saved[run], self._started_saved[run]

    def _mark_started(self, req: Row) -> None:
        """A request whose second carrying-out would be a second effect (a poll posted twice, a relaunch of
        an attempt that ended meanwhile, an owner's call) is marked begun in its run's facts first, so a
        daemon that dies before its answer is written is followed by one that answers it as interrupted
        rather than doing it again. An abort is not marked: the run's recorded stop makes a second abort a
        no-op (`already stopping`), and an abort waits on no store write. A store that refuses the mark
        does not stop the request (it is carried out, as before the mark existed)."""
        if req.kind == "abort" or req.run not in self.supervisors:
            return
        started = self._saved_facts(req.run)[1]  # read by _owed_before just now
        started[str(req.id)] = req.kind
        try:
            self.store.merge_run_facts(req.run, self.ctx.now(), at_once=True,
                                       **{STARTED_REQUESTS_FACT: dict(started)})
        except Exception as exc:
            log.warning("control request's start not saved; carried out unmarked", request=req.id, run=req.run,
                        error=f"{type(exc).__name__}: {exc}")

    def _save_owed(self, run: str, request_id: int, answer: str | None) -> None:
        """The owed answer into its run's facts (None: written, so neither owed nor begun any longer), so a
        daemon restarted before it is written writes it rather than carrying the request out again. Only a
        run babysat here (an answer without an action is simply given again); a store that takes nothing
        keeps it in memory."""
        if run not in self.supervisors:
            return
        try:
            saved, started = self._saved_facts(run)
        except Exception as exc:
            log.warning("owed control answer not saved; kept in memory", request=request_id, run=run,
                        error=f"{type(exc).__name__}: {exc}")
            return
        key = str(request_id)
        if saved.get(key) == answer and (answer is not None or key not in started):
            return
        if answer is None:
            saved.pop(key, None)
            started.pop(key, None)
        else:
            saved[key] = answer
        try:
            self.store.merge_run_facts(run, self.ctx.now(), at_once=True,
                                       **{OWED_ANSWERS_FACT: dict(saved), STARTED_REQUESTS_FACT: dict(started)})
        except Exception as exc:
            log.warning("owed control answer not saved; kept in memory", request=request_id, run=run,
                        error=f"{type(exc).__name__}: {exc}")

    def _carry_out(self, req: Row) -> str:
        """One control request carried out; its answer (written by handle_requests). An error of the
        action itself is the answer, so the asker is never left waiting."""
        supervisor = self.supervisors.get(req.run)
        now = self.ctx.now()
        by = req.body.get("requested_by", "?")
        if req.kind in relaunch.ASKED:  # another box's gateway asked: the checks are this box's (its files)
            try:
                relaunch.prepare(self.registry_path, req.run, accelerated=True)  # the cadence: _babysittable
                return self._relaunch(req.run, by, resume=relaunch.ASKED[req.kind])
            except BabysitError as exc:
                return f"not relaunched: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")
            except Exception as exc:
                log.exception("relaunch failed", run=req.run)
                return f"failed: {type(exc).__name__}: {exc}"[:300]
        if req.kind in (relaunch.ACTION, relaunch.ACTION_RESUME):
            try:
                return self._relaunch(req.run, by, resume=req.kind == relaunch.ACTION_RESUME)
            except Exception as exc:
                log.exception("relaunch failed", run=req.run)
                return f"failed: {type(exc).__name__}: {exc}"[:300]
        if clicks.parse_action(req.kind) is not None:  # another box's gateway passing on an owner's click
            try:
                return clicks.carry_out(self.registry_path, self.store, req.kind, by, now)
            except Exception as exc:
                log.exception("owner call click failed", request=req.id)
                return clicks.Answer(False, f"the owner call failed on this box: {type(exc).__name__}: "
                                            f"{exc}"[:300]).to_result()
        if supervisor is None:
            return f"no run named {req.run} is babysat"
        try:
            if req.kind in ("abort", "poll-now"):
                return supervisor.request(req.kind, by, req.id)
            return f"unknown action {req.kind}"
        except Exception as exc:  # the others go on
            supervisor.failed(f"handling a {req.kind} request", exc)
            return f"failed: {type(exc).__name__}: {exc}"[:300]

    def _babysittable(self, path: Path) -> RunSpec:
        """The run.toml at `path` as this daemon can babysit it: valid, its cadence possible in this mode,
        its source's reader installed (one check for a run picked up and a run relaunched)."""
        spec = load_spec(path)
        check_cadence(spec, self.accelerated)
        sources.adapter(spec.source.kind).require()
        if spec.host is not None and self.store.host is None:
            raise SpecError(str(path), "run.host", "no host on a box outside a fleet (it has no [store] url)",
                            spec.host, hint="remove [run] host, or set [store] url on every box (docs/fleet.md)")
        return spec

    def _relaunch(self, run: str, by: str, *, resume: bool) -> str:
        """`babysit relaunch RUN` (checked there, and again here: the run may have changed since): the run's
        spec read again from run.toml, a new supervisor, a new sequence of attempts. Returns the answer."""
        entry = self.registry.find(run) if self.registry is not None else None
        if entry is None:
            return f"not relaunched: no run named {run} is registered"
        old = self.supervisors.get(run)
        status, facts = self.store.run_state(run)
        attempts = self.store.attempts(run)
        if status not in relaunch.ENDED or not attempts or (old is not None and old.is_running()):
            return f"not relaunched: it is {status}, not ended"
        if self.store.final_verdict(run) is not None:
            return "not relaunched: its verdict is FINAL (a new experiment needs a new name)"
        path = self.registry.spec_path(entry)
        try:
            spec = self._babysittable(path)
            self.executor(spec.executor)
        except BabysitError as exc:
            return f"not relaunched: {exc.message}"
        after = attempts[-1].n
        count = int((facts.get("relaunched") or {}).get("count", 0)) + 1
        self.store.set_run_state(run, RunStatus.RELAUNCHING.value, self.ctx.now(), ended=None, end_reason=None,
                                 refused=None,
                                 relaunched={"after": after, "count": count, "by": by, "resume": resume,
                                             "at": self.ctx.now()})
        supervisor = RunSupervisor(self.ctx, spec, entry.prereg_sha256)
        self.supervisors[run] = supervisor
        self._broken_specs.pop(run, None)
        log.warning("relaunch", run=run, by=by, after=after, resume=resume, posted=True)  # the launch post says it
        supervisor.start()
        launched = supervisor.attempt
        if launched is None or launched.n <= after:
            why = self.store.run_state(run)[1].get("refused") or "the daemon log says why"
            return f"not launched: {supervisor.status} ({why})"
        return f"launched attempt {launched.n}" + (" (resuming)" if resume else "")


def _pool_executor(pool: concurrent.futures.ThreadPoolExecutor) -> Any:
    """APScheduler's pool executor over a pool the daemon holds (its own ThreadPoolExecutor makes one it
    keeps private)."""
    from apscheduler.executors.pool import BasePoolExecutor

    class DaemonPoolExecutor(BasePoolExecutor):
        def __init__(self) -> None:
            super().__init__(pool)

    return DaemonPoolExecutor()


def open_executor(name: str, state_dir: Path) -> Executor:
    """The executor a spec's `[run].executor` names."""
    if name == "local":
        return LocalExecutor()
    if name == "slurm":
        return SlurmExecutor(state_dir)
    raise ValueError(f"unknown executor {name!r}")


def _interrupted(req: Row) -> str:
    """The answer to a request a daemon began and died in (it is not carried out twice); an owner's click
    gets it as its gateway reads answers (clicks.Answer), said to the clicker alone."""
    call = clicks.parse_action(req.kind)
    if call is not None:
        return clicks.Answer(False, f"Owner call #{call[0]} (*{call[1]}*): babysit stopped while carrying out "
                                    f"this decision and does not carry it out twice; `babysit status {req.run}` "
                                    "shows whether it took effect. Click again if it did not (a decision "
                                    "already made says so).").to_result()
    return (f"interrupted: babysit stopped while carrying out this {req.kind} and does not carry it out twice; "
            f"`babysit status {req.run}` shows whether it took effect — ask again if it did not")
