"""The runs a daemon babysits: one supervisor for each registered run this box may take, and a relaunch
of one that ended.

Its own module because taking up a run is a set of refusals, each said once: a spec that does not load
or that this mode cannot babysit, a run another box of the fleet owns, a run whose stored state cannot
be read. None of them stops the other runs. The daemon (babysit.service.daemon) decides when to look.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from babysit import sources
from babysit.core.errors import BabysitError, SpecError
from babysit.core.spec.run_toml import RunSpec, check_cadence, load_spec
from babysit.core.status import RunStatus
from babysit.executors import Executor
from babysit.executors.local import LocalExecutor
from babysit.executors.slurm import SlurmExecutor
from babysit.register import relaunch
from babysit.run.context import DaemonContext
from babysit.run.supervisor import RunSupervisor
from babysit.runtime import registry as registry_mod

log = structlog.get_logger("babysit.service.roster")


class Roster:
    """The supervisors by run name, kept in step with the registry file at `registry_path`. `only`:
    `babysit run` babysits these runs alone (the registry's others wait for `babysit up`)."""

    def __init__(self, registry_path: Path, registry: registry_mod.Registry, ctx: DaemonContext, *,
                 accelerated: bool, only: frozenset[str] | None) -> None:
        self.registry_path = registry_path
        self.registry = registry
        self.ctx = ctx
        self.store = ctx.store
        self.accelerated = accelerated
        self.only = only
        self.supervisors: dict[str, RunSupervisor] = {}
        self._refused: dict[str, str] = {}  # run -> why it is not babysat, said once
        self._registry_seen: tuple[int, int, int] | None = None

    def executor(self, name: str) -> Executor:
        if name not in self.ctx.executors:
            self.ctx.executors[name] = open_executor(name, self.ctx.state_dir)
        return self.ctx.executors[name]

    def reconcile(self) -> None:
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
                spec = self.babysittable(path)
            except Exception as exc:  # a BabysitError names the field; anything else must not stop the others
                message = exc.message if isinstance(exc, BabysitError) else \
                    f"internal error reading {path}: {type(exc).__name__}: {exc}"[:500]
                if self._refused.get(entry.name) != message:
                    self._refused[entry.name] = message
                    log.error("run spec refused; not babysitting it", run=entry.name, error=message, posted=True,
                              hint=getattr(exc, "hint", None), exc_info=None if isinstance(exc, BabysitError) else exc)
                    self.store.enqueue(entry.name, "text", {"run": entry.name, "text":
                                       f"⚠️ {entry.name}: spec refused, not babysat: {message}"}, self.ctx.now(),
                                       dedupe_key=f"{entry.name}:spec-refused:{message}")
                continue
            try:
                owner = self.store.claim_run(entry.name, self.ctx.now(), spec.host)
            except BabysitError as exc:  # PostgreSQL down: a run new to the fleet waits for it
                if self._refused.get(entry.name) != exc.message:
                    self._refused[entry.name] = exc.message
                    log.warning("run not taken up yet", run=entry.name, error=exc.message, hint=exc.hint)
                self._registry_seen = None  # look again at the next round, registry changed or not
                continue
            if owner is not None and owner != self.store.host and owner == spec.host:
                message = f"run {entry.name} is registered for box {owner} ([run] host in {path})"
                if self._refused.get(entry.name) != message:  # its box's daemon babysits it
                    self._refused[entry.name] = message
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
                if self._refused.get(entry.name) != message:
                    self._refused[entry.name] = message
                    log.error("run owned by another box; not babysitting it", run=entry.name, owner=owner,
                              error=message)
                continue
            self.executor(spec.executor)
            try:
                supervisor = RunSupervisor(self.ctx, spec, entry.prereg_sha256)
            except Exception as exc:  # its stored state is unreadable: the other runs still start
                message = f"could not be set up: {type(exc).__name__}: {exc}"[:500]
                if self._refused.get(entry.name) != message:  # once, not every tick
                    self._refused[entry.name] = message
                    log.error("run could not be set up; not babysitting it", run=entry.name, exc_info=exc)
                continue
            self.supervisors[entry.name] = supervisor
            try:
                supervisor.start()
            except BabysitError as exc:
                log.error("run could not start", run=entry.name, error=exc.message)
            except Exception as exc:  # one run's data never stops the daemon's start-up or the other runs
                supervisor.internal_error("starting", exc)

    def babysittable(self, path: Path) -> RunSpec:
        """The run.toml at `path` as this daemon can babysit it: valid, its cadence possible in this mode,
        its source's reader installed (one check for a run picked up and a run relaunched)."""
        spec = load_spec(path)
        check_cadence(spec, self.accelerated)
        sources.adapter(spec.source.kind).require()
        if spec.host is not None and self.store.host is None:
            raise SpecError(str(path), "run.host", "no host on a box outside a fleet (it has no [store] url)",
                            spec.host, hint="remove [run] host, or set [store] url on every box (docs/fleet.md)")
        return spec

    def relaunch(self, run: str, by: str, *, resume: bool) -> str:
        """`babysit relaunch RUN` (checked there, and again here: the run may have changed since): the run's
        spec read again from run.toml, a new supervisor, a new sequence of attempts. Returns the answer."""
        entry = self.registry.find(run)
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
            spec = self.babysittable(path)
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
        self._refused.pop(run, None)
        log.warning("relaunch", run=run, by=by, after=after, resume=resume, posted=True)  # the launch post says it
        supervisor.start()
        launched = supervisor.attempt
        if launched is None or launched.n <= after:
            why = self.store.run_state(run)[1].get("refused") or "the daemon log says why"
            return f"not launched: {supervisor.status} ({why})"
        return f"launched attempt {launched.n}" + (" (resuming)" if resume else "")


def open_executor(name: str, state_dir: Path) -> Executor:
    """The executor a spec's `[run].executor` names."""
    if name == "local":
        return LocalExecutor()
    if name == "slurm":
        return SlurmExecutor(state_dir)
    raise ValueError(f"unknown executor {name!r}")
