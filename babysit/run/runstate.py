"""A run's machine state read back from the store: what a (restarted) daemon feeds `run_machine.step`.

The store's rows are the truth (every fact is written before it is acted on); this module only says
how an `Attempt` row and the run's facts map onto the frozen `RunState`, in one place.
"""

from __future__ import annotations

from babysit.core.run_machine import AttemptState, RunState
from babysit.core.spec.run_toml import RunSpec
from babysit.core.status import AttemptStatus
from babysit.db.store import Attempt, Store
from babysit.run.run_posts import held_keys
from babysit.run.run_verdict import verdict_key


def attempt_state(a: Attempt) -> AttemptState:
    """One attempt row as the machine knows it (its detail holds what its exit and the guards noted)."""
    d = a.detail
    return AttemptState(
        n=a.n, profile=a.profile, status=AttemptStatus(a.status), gpus=a.gpus, started_at=a.started_at,
        ended_at=a.ended_at, outcome=a.outcome, retry_override=d.get("retry_override"),
        stopped_by=d.get("stopped_by"), host_memory_pressure=bool(d.get("host_memory_pressure")),
        halvings=int(d.get("halvings", 0)), nonfinite=d.get("nonfinite"), summary=d.get("summary"), detail=d)


def restore(store: Store, spec: RunSpec, now: float) -> RunState:
    """The run's state as the store has it now."""
    status, facts = store.run_state(spec.name)
    key = verdict_key(spec.name)  # posted: queued, or held while the outbox refused it (run_posts)
    return RunState.restore(spec, status=status, attempts=tuple(attempt_state(a) for a in store.attempts(spec.name)),
                            stop=facts.get("stop"), verdict_posted=key in held_keys(store.held_posts(spec.name))
                            or store.has_message(key),
                            now=now, relaunched=facts.get("relaunched"))
