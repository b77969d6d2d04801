"""`babysit run [OPTIONS] -- CMD ARGS…`: babysit one command in the foreground, with no run.toml to write.

It writes the run's run.toml (under the state directory, `adhoc/NAME.toml`: a refused run leaves none), registers
it through `babysit register`'s path, and babysits it: with a
`babysit up` already holding the registry's state, that daemon takes it and this process follows it;
without one, a daemon runs in this process for this run alone. Either way the run's stdout and stderr
come through, the live view shows its row, and the exit code says how it ended (core/spec/adhoc.py).

Ctrl-C (or SIGTERM) the first time: the run is stopped gracefully, as `babysit abort` stops it (its stop
signal, `stop_grace_seconds` to checkpoint, then SIGKILL), and `babysit run` exits 5 once it has ended.
The second time: without a `babysit up`, the run is killed now (SIGKILL); with one, `babysit run` leaves
(exit 6) and that daemon finishes the stop.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from babysit.channels.notify import Channel, ConsoleChannel
from babysit.commands import register
from babysit.core.errors import BadInput, DaemonAlreadyRunning
from babysit.core.reading.presets import auto_names as preset_names
from babysit.core.spec import adhoc
from babysit.core.spec.run_toml import RUN_NAME
from babysit.core.spec.source import regex_error
from babysit.core.status import RunStatus
from babysit.db.store import Store
from babysit.db.url import open_existing, open_store, store_url
from babysit.probes.gpu import open_gpu_probe
from babysit.register import registration
from babysit.runtime import logs, registry, wake
from babysit.service.daemon import Daemon
from babysit.slack.channel import SlackChannel
from babysit.view.follow import Follower
from babysit.view.watch import Watcher, open_view

SAY = "babysit run:"


def run(args: argparse.Namespace) -> int:
    command = list(args.cmd or ())
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise BadInput("babysit run: no command to run", hint="put it after --: `babysit run -- python train.py`")
    try:
        gpus = adhoc.parse_gpus(args.gpus)
        retry_on = adhoc.parse_retry_on(args.retry_on)
    except ValueError as exc:
        raise BadInput(f"babysit run: {'--gpus' if 'GPU' in str(exc) else '--retry-on'}: {exc}",
                       hint="`babysit run --help`") from None
    patterns = tuple(args.pattern or ())
    path = registry.resolve_registry_path(args.registry)
    reg = registry.load(path)
    now = datetime.now(timezone.utc)
    name = args.name or adhoc.run_name(command, now.strftime("%Y%m%d-%H%M%S"))
    if not RUN_NAME.fullmatch(name):
        raise BadInput(f"babysit run: --name: expected a run name matching [a-z0-9_.-]{{1,64}}, got {name!r}",
                       hint="lower-case letters, digits, _ . and -")
    if name in reg.names:
        raise BadInput(f"babysit run: --name: a run named {name} is registered in {path} already",
                       hint=f"pick another --name (or leave it out: one is made from the script and the time); "
                            f"`babysit status {name}` shows that one")
    for i, regex in enumerate(patterns, start=1):
        problem = regex_error(regex)
        if problem is not None:
            raise BadInput(f"babysit run: --pattern {i}: {problem}: {regex!r}",
                           hint="a regular expression with a named group (?P<step>\\d+) and one named group per "
                                "metric, e.g. 'step (?P<step>\\d+) loss (?P<loss>[-+.\\w]+)'")
    spec_path = adhoc.spec_path(reg.state_dir, name)  # under the state directory: ./runs/ gathers no litter
    if spec_path.exists():
        raise BadInput(f"babysit run: {spec_path} exists already; it is not overwritten",
                       hint="pick another --name")
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(adhoc.run_toml(adhoc.AdHoc(
        name=name, command=tuple(command), workdir=os.getcwd(), gpus=gpus, retry_on=retry_on,
        executor=args.executor, written_at=registry.utc_timestamp(now), patterns=patterns)), encoding="utf-8")
    try:
        done = registration.register(spec_path, path, shown=str(spec_path), accelerated=args.accelerated)
    except BaseException:
        spec_path.unlink(missing_ok=True)  # refused (a misspelt program, a bad flag): nothing is left behind
        raise
    print(f"{SAY} {name}: its run.toml is {spec_path}")
    register.say(done)
    print(f"{SAY} {done.outcome}: {name} in {path}; no [prereg]: babysat without a verdict")
    reg = registry.load(path)
    state_dir = reg.state_dir
    reading = "your --pattern regexes, then " if patterns else ""
    print(f"{SAY} its printed lines are read by {reading}the first preset that matches them ("
          + ", ".join(preset_names()) + "), else by the general reader (a step counter and `name value` metrics: "
          "docs/your-trainer.md); babysit says which within seconds")
    if wake.daemon_pid(state_dir) is None:
        try:
            return _babysit_here(path, reg, name, args)
        except DaemonAlreadyRunning:
            pass  # a `babysit up` started in between: it takes the run
    return _follow_daemon(path, reg, name)


def _babysit_here(path: Path, reg: registry.Registry, name: str, args: argparse.Namespace) -> int:
    """No daemon for the registry: one in this process, for this run alone, until it has ended."""
    state_dir = reg.state_dir
    print(f"{SAY} no `babysit up` holds {state_dir}: babysitting {name} in this process (the registry's other runs "
          "wait for `babysit up`)")
    print(f"{SAY} Ctrl-C: stop it gracefully (its stop signal, time to checkpoint); Ctrl-C again: kill it now")
    watcher = _view(path, state_dir, name, args)
    out = watcher.view.out if watcher is not None else sys.stdout
    follower = Follower(state_dir, name, out, out if watcher is not None else sys.stderr,
                        open_store=lambda: open_existing(reg))
    channel = _channel(reg, out)
    # a message the console channel prints is not printed again as a raw log line
    logs.configure(state_dir, stream=out if watcher is not None and watcher.view.live else None,
                   hide_posted=isinstance(channel, ConsoleChannel))
    daemon: Daemon | None = None

    def interrupted(count: int) -> None:
        assert daemon is not None
        by = f"babysit run ({daemon.last_interrupt})"  # Ctrl-C, or a SIGTERM sent to babysit run
        if count == 1:
            _request_stop(reg, name, by)
            print(f"{SAY} {daemon.last_interrupt}: stopping {name} gracefully; Ctrl-C again kills it now", file=out,
                  flush=True)
            return
        supervisor = daemon.supervisors.get(name)
        if supervisor is not None and supervisor.is_running():
            print(f"{SAY} {daemon.last_interrupt} again: killing {name} (SIGKILL)", file=out, flush=True)
            supervisor.request("abort", by)  # recorded as asked: the exit reads stopped
            supervisor.executor.kill(supervisor.attempt)

    try:
        daemon = Daemon(path, gpu_probe=open_gpu_probe(args.gpu_probe), channel=channel,
                        accelerated=args.accelerated, exit_when_idle=True, only=frozenset({name}),
                        on_interrupt=interrupted)
        follower.start()
        daemon.run()
    finally:
        follower.stop()
        if watcher is not None:
            watcher.stop()
    return _ended(reg, name, path)


def _follow_daemon(path: Path, reg: registry.Registry, name: str) -> int:
    """A `babysit up` babysits the run: follow it (its output, its messages) until it has ended."""
    state_dir = reg.state_dir
    pid = wake.daemon_pid(state_dir)
    print(f"{SAY} the `babysit up` holding {state_dir} (pid {pid}) babysits {name}; following it here")
    print(f"{SAY} Ctrl-C: stop it gracefully; Ctrl-C again: leave it to that daemon (exit {adhoc.EXIT_DETACHED})")
    follower = Follower(state_dir, name, sys.stdout, sys.stderr, messages=True,
                        open_store=lambda: open_existing(reg))
    follower.start()
    interrupts = 0
    store = open_store(reg)
    try:
        while True:
            try:
                if _is_over(store, name):
                    break
                time.sleep(0.2)
            except KeyboardInterrupt:
                interrupts += 1
                if interrupts == 1:
                    _request_stop(reg, name, "babysit run (Ctrl-C)")
                    print(f"{SAY} stopping {name} gracefully; Ctrl-C again leaves it to the daemon", flush=True)
                else:
                    print(f"{SAY} left {name} to the daemon (pid {pid}): `babysit status {name}`", flush=True)
                    return adhoc.EXIT_DETACHED
    finally:
        follower.stop()
        store.close()
    return _ended(reg, name, path)


def _view(path: Path, state_dir: Path, name: str, args: argparse.Namespace) -> Watcher | None:
    if args.no_view:
        return None
    view = open_view(sys.stdout)
    interval = 1.0 if view.live else (1.0 if args.accelerated else 300.0)
    watcher = Watcher(path, view, interval=interval, names=[name],
                      footer=f"babysit run {name} · Ctrl-C stops it gracefully · log: {state_dir / 'daemon.log'}")
    watcher.start()
    return watcher


def _channel(reg: registry.Registry, out: TextIO) -> Channel:
    """Slack when SLACK_BOT_TOKEN is set, else the console (as `babysit up`); Slack's re-renders read the
    configured store (on a fleet's box the daemon's own, given when it opens it), never a stray state.db."""
    if os.environ.get("SLACK_BOT_TOKEN"):
        return SlackChannel.from_env(reg.state_dir, fleet=store_url(reg) is not None)
    return ConsoleChannel(reg.state_dir, out)


def _request_stop(reg: registry.Registry, name: str, by: str) -> None:
    """The graceful stop, as `babysit abort` asks it: a request in the store (its own connection, so the
    daemon sees another writer; a fleet's PostgreSQL NOTIFYs the run's box), then the daemon woken."""
    store = open_store(reg)
    try:
        store.request(name, "abort", by, time.time())
    finally:
        store.close()
    wake.wake(reg.state_dir)


def _is_over(store: Store, name: str) -> bool:
    status, _ = store.run_state(name)
    return RunStatus.of(status).terminal


def _ended(reg: registry.Registry, name: str, path: Path) -> int:
    """Say how the run ended, whether any record was read, and return its exit code."""
    store = open_store(reg)
    try:
        status, facts = store.run_state(name)
        attempts = store.attempts(name)
    finally:
        store.close()
    last: Any = attempts[-1] if attempts else None
    if not RunStatus.of(status).terminal:
        print(f"{SAY} {name} is {status} (the daemon stopped before it ended); `babysit up` babysits it on",
              file=sys.stderr)
        return adhoc.EXIT_DETACHED
    outcome = facts.get("ended") or (last.outcome if last is not None else None) or status
    stop = facts.get("stop") or {}
    if outcome == "completed" and last is not None and stop.get("attempt") == last.n:
        outcome = "stopped"  # it exited 0 on the stop it was asked for (it checkpointed): stopped, not done
        status = f"stopped on request ({stop.get('reason')}), exiting 0"
    code = adhoc.exit_code(outcome)
    print(f"{SAY} {name} {status}: {outcome} after {len(attempts)} attempt(s) (exit {code}; docs/your-trainer.md)")
    if outcome != "completed" and facts.get("end_reason"):
        print(f"{SAY} not retried: {facts['end_reason']}")
    if facts.get("reading"):
        print(f"{SAY} {facts['reading']} was the first record read")
    else:
        said = "" if outcome in ("crashed", "oom", "gpu-fault") else " (a log-unreadable incident says why)"
        print(f"{SAY} no record was read from its output: babysit could not watch its losses{said}; "
              f"`babysit status {name}`", file=sys.stderr)
    spec_file = reg.state_dir / "adhoc" / f"{name}.toml"
    registry_flag = "" if path == Path(registry.DEFAULT_FILE) else f" --registry {os.path.abspath(path)}"
    print(f"{SAY} its run.toml: {spec_file} — to babysit it under `babysit up` with a verdict, copy it, give "
          f"[run].name a new name, add a [prereg], then `babysit register COPY{registry_flag}`")
    return code
