"""Running an ended run again (`babysit relaunch RUN`, `/babysit relaunch RUN`): docs/spec.md, Relaunching.

A relaunch keeps the run: its name, its history (attempts, polls, incidents, GPU-hours), its frozen
prereg. It re-reads run.toml through `registration.register` (so a fixed command is used, held to the same
checks as `register`), then asks the daemon, through the control table, to start a new sequence of
attempts: attempt numbers go on from the last one, while profiles and `retry.max_attempts` count from
the relaunch. What it refuses, before anything is written:

- a run still going (abort it first) or never launched (`babysit up` launches it);
- a run with a FINAL verdict: its question is answered; asking it again under the same frozen prereg
  would let a second answer replace the first (a new experiment needs a new name);
- a changed [prereg] (the same rule as `register`: a new experiment, a new name);
- a run whose attempts already used its `guards.gpu_hours_cap`: the cap covers every attempt of the
  run, those before a relaunch included; raise it in run.toml (it is not part of the prereg) to go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from babysit.core.errors import BadInput, RegistryError
from babysit.core.spec.run_toml import load_spec
from babysit.core.status import TERMINAL_STATUSES
from babysit.db.url import open_existing, open_store
from babysit.register import registration
from babysit.runtime import registry

ENDED = TERMINAL_STATUSES  # over, or a launch refused: what a relaunch may start again
ACTION, ACTION_RESUME = "relaunch", "relaunch-resume"  # control-table actions: fresh, or with retry.resume_args
# asked by another box's gateway (`/babysit relaunch` in a fleet): the run's own box checks and re-registers its
# run.toml first (`prepare`: the file is there), then relaunches; the value: with retry.resume_args
ASKED = {"relaunch-asked": False, "relaunch-resume-asked": True}
CAP_WARN_FRACTION = 0.8  # the cap's warning line, as the live guard's (docs/guards.md)


@dataclass(frozen=True)
class Prepared:
    registration: registration.Registration
    after: int  # the run's last attempt: the relaunch starts attempt after+1
    gpu_hours_used: float  # by every attempt so far
    warnings: tuple[str, ...]


def prepare(registry_path: Path, run: str, *, accelerated: bool, shown: str | None = None) -> Prepared:
    """Check that RUN may run again and re-register its run.toml; raises (exit 2) when it may not."""
    reg = registry.load(registry_path)
    entry = reg.get(run)  # an unknown run: exit 2, the registered ones listed
    spec_file = reg.spec_path(entry)
    store = open_existing(reg)  # a fleet's PostgreSQL, or this box's state.db once a daemon made it
    if store is None:
        raise BadInput(f"{run} has not been launched yet: there is nothing to relaunch",
                       hint="`babysit up` launches every registered run")
    try:
        status, _ = store.run_state(run)
        attempts = store.attempts(run)
        final = store.final_verdict(run)
        used = store.gpu_seconds(run, time.time()) / 3600
    finally:
        store.close()
    if not attempts:
        raise BadInput(f"{run} has not been launched yet (status {status}): there is nothing to relaunch",
                       hint="`babysit up` launches every registered run")
    last = attempts[-1]
    if status not in ENDED:
        raise BadInput(f"{run} is {status} (attempt {last.n}): only a run that ended can be relaunched",
                       hint=f"`babysit abort {run}` stops it (the trainer checkpoints); relaunch it once it stopped")
    if final is not None:
        label = final.body.get("label")
        raise BadInput(f"{run} has a FINAL verdict ({label} at step {final.body.get('at_step')}): its pre-registered "
                       "question is answered, and running it again under the same frozen prereg would read it twice",
                       hint="a new experiment needs a new name: copy the run.toml, give [run].name a new name, "
                            "and `babysit register` it")
    spec = load_spec(spec_file, display=shown or str(spec_file))
    sha = spec.prereg.sha256 if spec.prereg else None
    if sha != entry.prereg_sha256:
        raise RegistryError(
            f"{shown or spec_file}: prereg: changed since {run} was registered (frozen sha256 "
            f"{(entry.prereg_sha256 or 'none')[:16]}…, now {(sha or 'none')[:16]}…): a relaunch runs the experiment "
            "that was frozen, and a changed [prereg] is a different experiment",
            hint=f"restore the frozen [prereg] (`babysit prereg show {run}` prints it) to relaunch, or give "
                 "[run].name a new name and `babysit register` it as a new run")
    cap = spec.guards.gpu_hours_cap
    if used >= cap:
        raise BadInput(f"{shown or spec_file}: guards.gpu_hours_cap: {run}'s attempts have used {used:.2f} of its "
                       f"{cap:g} GPU-hours; the cap covers every attempt of the run, those before a relaunch "
                       "included, so a relaunch would be stopped at once",
                       hint="raise guards.gpu_hours_cap in the run.toml (it is not part of the prereg) and relaunch")
    done = registration.register(spec_file, registry_path, shown=shown or str(spec_file), accelerated=accelerated,
                                 wake_daemon=False)  # the request below wakes it, once
    warnings = list(done.warnings)
    if used >= CAP_WARN_FRACTION * cap:
        warnings.append(f"{shown or spec_file}: guards.gpu_hours_cap: {used:.2f} of {cap:g} GPU-hours are used "
                        "by the earlier attempts "
                        "(the cap covers them too): the relaunch is stopped when the run reaches the cap")
    return Prepared(done, last.n, used, tuple(warnings))


def request(reg: registry.Registry, run: str, by: str, *, resume: bool) -> int:
    """Queue the relaunch for the daemon (and wake it); returns the request's id. In a fleet the request
    is a row of its PostgreSQL addressed to the run's box, as every control request is."""
    store = open_store(reg)
    try:
        return store.request(run, ACTION_RESUME if resume else ACTION, by, time.time())
    finally:
        store.close()
