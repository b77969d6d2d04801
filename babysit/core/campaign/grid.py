"""The interpretation grid read mechanically, and the suspect table. Pure.

`plan` turns a FINAL verdict's label into what its frozen grid entry declared: the sentence to post,
the suspects to move, where to bank the checkpoints, the run to propose, the owner call to ask.
`suspect_table` folds the campaign's history over the declared statuses: the table is always the
declaration plus every recorded move, so it can be re-derived by anyone from the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from babysit.core.campaign.spec import Campaign, GridEntry, Proposal

LAUNCH, EXTEND, HOLD = "launch", "extend", "hold"
DECISIONS = (LAUNCH, EXTEND, HOLD)


@dataclass(frozen=True)
class Plan:
    """What a FINAL verdict's label makes the campaign do (nothing where the grid says nothing)."""

    run: str
    label: str
    sentence: str
    moves: tuple[tuple[str, str], ...] = ()  # (suspect, new status)
    bank_to: str | None = None
    propose: Proposal | None = None
    extend_to: int | None = None
    question: str | None = None  # the owner call's question; None: no owner call

    @property
    def options(self) -> tuple[str, ...]:
        """The owner call's buttons: launch the proposal, extend the run, or hold."""
        return (*((LAUNCH,) if self.propose else ()), *((EXTEND,) if self.extend_to else ()), HOLD)


@dataclass(frozen=True)
class SuspectRow:
    name: str
    status: str
    declared: str  # the status campaign.toml declares
    by_run: str | None = None  # the run whose FINAL verdict set the status (None: as declared)
    by_label: str | None = None
    note: str = ""
    held: tuple[str, ...] = ()  # moves that do not count (yet): pending on a parent, or suspended


@dataclass(frozen=True)
class Held:
    """A move the grid declared that does not stand: pending on the run's parent, or suspended."""

    suspect: str
    status: str
    run: str
    label: str
    outcome: str  # "pending" | "suspended"
    why: str

    def __str__(self) -> str:
        return f"{self.outcome.upper()}: → {self.status} by {self.run} ({self.label}) — {self.why}"


def plan(run: str, label: str, grid: Mapping[str, GridEntry], interpretation: str | None) -> Plan:
    """The grid entry for `label` (none: the sentence alone, nothing moves)."""
    entry = grid.get(label)
    said = (entry.say if entry else None) or interpretation or f"{label} (the grid declares nothing for it)"
    if entry is None:
        return Plan(run, label, said)
    question = entry.owner_call
    if question is None and (entry.propose or entry.extend_to):
        question = _default_question(entry)
    return Plan(run, label, said, moves=tuple(entry.suspects.items()),
                bank_to=entry.bank.replace("{name}", run) if entry.bank else None,
                propose=entry.propose, extend_to=entry.extend_to, question=question)


def suspect_table(campaign: Campaign, moves: Iterable[Mapping[str, Any]],
                  held: Iterable[Held] = ()) -> tuple[SuspectRow, ...]:
    """Declared statuses, then each recorded move in order ({"suspect", "status", "run", "label"}) but
    those of a run whose outcome is held (pending or suspended: docs/campaigns.md), which are listed on
    their suspect's row instead of moving it."""
    held = tuple(held)
    not_counted = {h.run for h in held}
    rows = {s.name: SuspectRow(s.name, s.status, s.status, note=s.note) for s in campaign.suspects}
    for m in moves:
        old = rows.get(str(m.get("suspect")))
        if old is None or m.get("run") in not_counted:
            continue  # a suspect removed from campaign.toml since (its history stays), or a held outcome
        rows[old.name] = SuspectRow(old.name, str(m.get("status")), old.declared, m.get("run"), m.get("label"),
                                    old.note)
    for h in held:
        old = rows.get(h.suspect)
        if old is not None:
            rows[old.name] = replace(old, held=(*old.held, str(h)))
    return tuple(rows.values())


def proposal_name(campaign: str, proposal: Proposal) -> str:
    if proposal.name:
        return proposal.name
    slug = "".join(c if c.isalnum() or c in "_.-" else "_" for c in proposal.suspect.lower()).strip("_") or "next"
    return f"{campaign}_{slug}"[:64]


def extension_name(run: str, steps: int) -> str:
    return f"{run[:52]}_to{steps}"


def _default_question(entry: GridEntry) -> str:
    parts = []
    if entry.propose:
        parts.append(f"launch the next single-delta run (suspect {entry.propose.suspect})")
    if entry.extend_to:
        parts.append(f"extend to step {entry.extend_to}")
    return " vs ".join(parts) + ", or hold?"
