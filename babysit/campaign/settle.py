"""Whether a campaign run's grid may be carried out yet: a single-delta run is read against its parent,
so nothing it concludes stands before the parent's verdict does. Pure.

`settle` says where the run's baseline stands: *settled* (the parent read FINAL with a usable label, is
banked in campaign.toml, or there is no parent), *pending* (the parent has no FINAL verdict yet: what it
waits for, in words) or *suspended* (the parent read FINAL AMBIGUOUS-BY-INSTRUMENT, or an amendment
recorded after its FINAL read makes it so: its instrument disagrees with itself, so no conviction,
exoneration, bank or proposal may rest on it). `next_step` turns that and what the campaign's history
already records for the run into the one thing to do now, so a daemon redoing it (a restart, a second
trigger) does nothing twice: a pending outcome is carried out once when the parent lands usable, and a
carried-out one is suspended once when the parent turns out instrument-ambiguous. A suspension stands:
amendments only add rules, so an instrument-ambiguous read never becomes usable again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from babysit.core.campaign.grid import Held
from babysit.core.campaign.spec import AMBIGUOUS_BY_INSTRUMENT
from babysit.core.status import ENDED_STATUSES, RunStatus

SETTLED, PENDING, SUSPENDED = "settled", "pending", "suspended"
CARRIED = "carried"  # recorded: the grid's actions were carried out
NO_PARENT, BANKED, RUN = "no-parent", "banked", "run"  # what a run's parent is
CARRY, PEND, SUSPEND = "carry", "pend", "suspend"  # the steps


@dataclass(frozen=True)
class Baseline:
    """What a campaign run's parent is and what it has read, as the store says now."""

    run: str
    parent: str | None
    kind: str  # NO_PARENT | BANKED (a [[banked]] run of campaign.toml) | RUN (a registered run)
    status: str | None = None  # the parent's latest read: FINAL | PROVISIONAL | NO-READ | None (none yet)
    label: str | None = None
    at_step: int | None = None
    read_step: int | None = None
    state: str | None = None  # the parent's run state (pending, running, finished, failed, …)
    relabel: str | None = None  # its FINAL read again with the amendments recorded after it (None: none)
    late: tuple[int, ...] = ()  # the numbers of those amendments


@dataclass(frozen=True)
class Settlement:
    state: str  # SETTLED | PENDING | SUSPENDED
    parent: str | None
    why: str  # settled: what it stands on; pending: what it waits for; suspended: why nothing stands

    def to_json(self) -> dict[str, str | None]:
        return {"state": self.state, "parent": self.parent, "why": self.why}


@dataclass(frozen=True)
class Step:
    action: str  # CARRY | PEND | SUSPEND
    settlement: Settlement
    withdraw: bool = False  # SUSPEND of an outcome already carried out: its moves are withdrawn


def settle(b: Baseline) -> Settlement:
    """Where the run's baseline stands (see the module docstring)."""
    p = b.parent
    if b.kind == NO_PARENT or p is None:
        return Settlement(SETTLED, None, "no parent: the campaign's baseline run")
    if b.kind == BANKED:
        return Settlement(SETTLED, p, f"parent {p} is banked in campaign.toml (a settled reference)")
    if b.status == "FINAL":
        if b.label == AMBIGUOUS_BY_INSTRUMENT:
            return Settlement(SUSPENDED, p, f"parent {p} read FINAL {AMBIGUOUS_BY_INSTRUMENT}: its rules disagree, "
                                            "so nothing read against it stands (check the instrument first)")
        if b.relabel == AMBIGUOUS_BY_INSTRUMENT:
            which = ", ".join(f"amendment {n}" for n in b.late) or "an amendment"
            return Settlement(SUSPENDED, p, f"parent {p} is {AMBIGUOUS_BY_INSTRUMENT} under {which}, recorded "
                                            f"after its FINAL read ({b.label}): nothing read against it stands")
        return Settlement(SETTLED, p, f"parent {p} read FINAL {b.label}")
    wanted = f"{p}'s FINAL verdict" + (f" at step {b.read_step}" if b.read_step is not None else "")
    if b.status == "PROVISIONAL":
        now = f"now PROVISIONAL @{b.at_step}" + (f" {b.label}" if b.label else "")
    elif b.status == "NO-READ":
        now = "now NO-READ"
    else:
        now = "no read yet"
    if b.state in ENDED_STATUSES:  # over for good: it reads nothing more
        return Settlement(PENDING, p, f"{wanted}, which may never come: {p} ended ({b.state}) without one "
                                      f"({now}); nothing moves until it reads FINAL")
    state = "not launched yet" if b.state == RunStatus.PENDING else b.state
    return Settlement(PENDING, p, f"{wanted} ({now}" + (f", {p} {state}" if state else "") + ")")


def next_step(recorded: str | None, settlement: Settlement) -> Step | None:
    """The one step to take now, given what the history records for the run (None, PENDING, CARRIED,
    SUSPENDED); None: nothing to do."""
    if recorded == SUSPENDED:
        return None  # stands: an instrument-ambiguous read never becomes usable again
    if settlement.state == SETTLED:
        return None if recorded == CARRIED else Step(CARRY, settlement)
    if settlement.state == SUSPENDED:
        return Step(SUSPEND, settlement, withdraw=recorded == CARRIED)
    return Step(PEND, settlement) if recorded is None else None  # a FINAL parent never becomes un-FINAL


def recorded_outcome(kinds: set[str] | frozenset[str]) -> str | None:
    """What the campaign's history records for a run, from the kinds of its events."""
    for kind in (SUSPENDED, CARRIED, PENDING):
        if kind in kinds:
            return kind
    return None


def outcomes(events: Iterable[tuple[str, str, Mapping[str, Any]]]) -> dict[str, tuple[str, Mapping[str, Any]]]:
    """run -> (its recorded outcome, that event's body), from the history's (run, kind, body) in order."""
    bodies: dict[str, dict[str, Mapping[str, Any]]] = {}
    for run, kind, body in events:
        if kind in (PENDING, CARRIED, SUSPENDED) and run:
            bodies.setdefault(run, {})[kind] = body
    out = {}
    for run, by_kind in bodies.items():
        kind = recorded_outcome(frozenset(by_kind))
        if kind is not None:
            out[run] = (kind, by_kind[kind])
    return out


def held_moves(events: Iterable[tuple[str, str, Mapping[str, Any]]]) -> tuple[Held, ...]:
    """The moves that do not count: each declared move of a run whose outcome is pending or suspended."""
    held = []
    for run, (kind, body) in outcomes(events).items():
        if kind == CARRIED:
            continue
        for suspect, status in body.get("moves") or ():
            held.append(Held(str(suspect), str(status), run, str(body.get("label")), kind, str(body.get("why"))))
    return tuple(held)
