"""campaign.toml and a run's `[campaign]` table → frozen dataclasses (docs/campaigns.md). Pure but for
reading the TOML files named.

A campaign is the saga as one object: the question, the suspects and their statuses, the banked runs
(with the deltas every later run is compared against, so a run's `[prereg.references]` come from here
by name instead of being retyped) and its runs. A run joins by declaring `[campaign]` in its run.toml:
the campaign file, its `parent`, the `suspect` it tests, the deltas it declares platform-only, and its
interpretation grid (label → actions), which `register` freezes beside the prereg.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from babysit.core.errors import SpecError
from babysit.core.spec.tomlfile import Table, load

NAME = re.compile(r"[a-z0-9_.-]{1,64}")
SUSPECT_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
SLACK_USER_ID = re.compile(r"[UW][A-Z0-9]{2,}")
STATUSES = ("live", "convicted", "exonerated", "untested")
AMBIGUOUS_BY_INSTRUMENT = "AMBIGUOUS-BY-INSTRUMENT"


@dataclass(frozen=True)
class Suspect:
    name: str
    status: str  # live | convicted | exonerated | untested: as declared; the history updates it
    factors: tuple[str, ...] = ()  # the run factors it covers (e.g. "gpus", "--image-augment"); () : its name
    note: str = ""

    @property
    def covers(self) -> tuple[str, ...]:
        return self.factors or (self.name,)


@dataclass(frozen=True)
class Banked:
    """A run of the campaign from before babysit (or kept from it): its delta is a reference by name."""

    name: str
    delta: float
    spec: Path | None = None  # its run.toml, when known: a run may name it as its parent
    note: str = ""


@dataclass(frozen=True)
class Campaign:
    name: str
    question: str
    file: Path
    suspects: tuple[Suspect, ...]
    banked: tuple[Banked, ...] = ()
    runs: tuple[Path, ...] = ()  # run.tomls `babysit campaign register` registers with it
    owners: tuple[str, ...] = ()  # Slack member IDs who answer owner calls (else [daemon].abort_allow_list)
    channel: str | None = None
    proposals: Path = Path("proposals")  # where proposed run.tomls are written (absolute)
    sha256: str = ""

    @property
    def references(self) -> dict[str, float]:
        return {b.name: b.delta for b in self.banked}

    def suspect(self, name: str) -> Suspect | None:
        return next((s for s in self.suspects if s.name == name), None)

    def banked_run(self, name: str) -> Banked | None:
        return next((b for b in self.banked if b.name == name), None)


@dataclass(frozen=True)
class Proposal:
    """The next single-delta run, derived from this one: one factor set or dropped, the suspect named."""

    suspect: str
    set: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # flag -> value ("" : bare flag)
    drop: tuple[str, ...] = ()
    name: str | None = None  # default: "<campaign>_<suspect>"


@dataclass(frozen=True)
class GridEntry:
    """What one verdict label does, carried out when the FINAL verdict lands."""

    label: str
    suspects: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # name -> new status
    say: str | None = None  # the grid's sentence (default: the prereg's interpretation of the label)
    bank: str | None = None  # copy the checkpoints here ({name}: the run), with a sha256 manifest
    propose: Proposal | None = None
    extend_to: int | None = None  # offer to repeat the run to this many steps (read there)
    owner_call: str | None = None  # the question an owner answers with a button


@dataclass(frozen=True)
class RunLink:
    """A run's `[campaign]` table."""

    file: Path  # the campaign.toml
    parent: str | None = None  # a run of the campaign (registered, or banked with a spec)
    suspect: str | None = None
    platform: tuple[str, ...] = ()  # factors declared platform-only: shown, never counted as deltas
    multi_delta: bool = False  # a deliberate multi-delta run: shown, not refused
    grid: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # label -> GridEntry
    grid_canonical: str = "{}"  # the grid as written, canonical JSON: frozen at register

    @property
    def grid_sha256(self) -> str:
        return hashlib.sha256(self.grid_canonical.encode("utf-8")).hexdigest()


def load_campaign(path: Path | str, display: str | None = None) -> Campaign:
    path = Path(path).resolve()
    shown = display or str(path)
    return parse_campaign(load(path, shown), path, shown)


def parse_campaign(data: dict[str, Any], path: Path, shown: str) -> Campaign:
    top = Table(data, shown)
    head = top.table("campaign", required=True)
    assert head is not None
    name = head.str("name", check=NAME.fullmatch, expected="a campaign name matching [a-z0-9_.-]{1,64}")
    question = head.str("question", check=lambda v: bool(v.strip()), expected="the question the campaign answers")
    owners = head.str_list("owners", (), expected='a list of Slack member IDs (e.g. "U024BE7LH")')
    for i, uid in enumerate(owners):
        if not SLACK_USER_ID.fullmatch(uid):
            raise SpecError(shown, f"campaign.owners[{i}]", 'a Slack member ID like "U024BE7LH"', uid,
                            hint="find it in Slack: profile → ⋮ → Copy member ID")
    channel = head.str("channel", None, check=bool, expected="a Slack channel name or ID")
    proposals = path.parent / head.str("proposals", "proposals", check=bool, expected="a folder for proposals")
    runs = tuple((path.parent / r).resolve() for r in head.str_list("runs", (), expected="a list of run.toml paths"))
    head.finish()

    suspects: list[Suspect] = []
    for t in top.tables("suspects"):
        s = Suspect(name=t.str("name", check=SUSPECT_NAME.fullmatch, expected="a suspect name ([A-Za-z0-9_.+-])"),
                    status=t.choice("status", STATUSES, "untested"),
                    factors=t.str_list("factors", (), expected='a list of run factors, e.g. ["gpus", "--zero1"]'),
                    note=t.str("note", ""))
        t.finish()
        if any(x.name == s.name for x in suspects):
            raise t.error("name", "a name no other suspect has", s.name)
        suspects.append(s)
    if not suspects:
        raise top.missing("suspects", "at least one [[suspects]] table", "<none>")

    banked: list[Banked] = []
    for t in top.tables("banked"):
        b = Banked(name=t.str("name", check=str.isidentifier, expected="a reference name (letters, digits, _)"),
                   delta=t.number("delta"),
                   spec=(path.parent / s).resolve() if (s := t.str("spec", None, check=bool,
                                                                    expected="a path to its run.toml")) else None,
                   note=t.str("note", ""))
        t.finish()
        if any(x.name == b.name for x in banked):
            raise t.error("name", "a name no other banked run has", b.name)
        banked.append(b)
    top.finish()
    return Campaign(name=name, question=question.strip(), file=path, suspects=tuple(suspects), banked=tuple(banked),
                    runs=runs, owners=owners, channel=channel, proposals=proposals.resolve(),
                    sha256=hashlib.sha256(canonical(data).encode("utf-8")).hexdigest())


def parse_link(t: Table, base: Path) -> RunLink:
    """A run.toml's `[campaign]` table; labels are checked against the prereg by `check_labels`."""
    file = (base / t.str("file", check=bool, expected="the path of the campaign.toml this run belongs to")).resolve()
    parent = t.str("parent", None, check=NAME.fullmatch, expected="the name of a run of the campaign")
    suspect = t.str("suspect", None, check=SUSPECT_NAME.fullmatch, expected="the name of a suspect of the campaign")
    platform = t.str_list("platform", (), expected='a list of factors declared platform-only, e.g. ["gpus"]')
    multi = t.bool("multi_delta", False)
    grid_table = t.table("grid")
    grid = parse_grid(grid_table) if grid_table is not None else {}
    t.finish()
    return RunLink(file=file, parent=parent, suspect=suspect, platform=platform, multi_delta=multi,
                   grid=MappingProxyType(grid), grid_canonical=canonical(grid_table.data if grid_table else {}))


def parse_grid(t: Table) -> dict[str, GridEntry]:
    """`[campaign.grid.LABEL]` tables (also how the grid frozen in the store is read back)."""
    grid: dict[str, GridEntry] = {}
    for label in list(t.data):
        entry = t.table(label)
        assert entry is not None
        grid[label] = _grid_entry(label, entry)
    t.finish()
    return grid


def check_labels(link: RunLink, labels: tuple[str, ...], shown: str) -> None:
    """Every grid label must be one the verdict can give."""
    known = (*labels, AMBIGUOUS_BY_INSTRUMENT)
    for label in link.grid:
        if label not in known:
            raise SpecError(shown, f"campaign.grid.{label}", "a label of [prereg] (" + ", ".join(known) + ")",
                            "<unknown label>")


def check_against(link: RunLink, campaign: Campaign, shown: str) -> None:
    """The run's suspect and every suspect its grid moves must be the campaign's."""
    names = [s.name for s in campaign.suspects]
    expected = "a suspect of campaign '" + campaign.name + "' (" + ", ".join(names) + ")"
    if link.suspect is not None and campaign.suspect(link.suspect) is None:
        raise SpecError(shown, "campaign.suspect", expected, link.suspect)
    for entry in link.grid.values():
        for name in entry.suspects:
            if campaign.suspect(name) is None:
                raise SpecError(shown, f"campaign.grid.{entry.label}.suspects.{name}", expected, name)
        if entry.propose is not None and campaign.suspect(entry.propose.suspect) is None:
            raise SpecError(shown, f"campaign.grid.{entry.label}.propose.suspect", expected, entry.propose.suspect)


def merged_references(own: Mapping[str, float], campaign: Campaign, shown: str) -> dict[str, float]:
    """The campaign's banked deltas by name, then the run's own references; a retyped name must agree."""
    for name, value in own.items():
        banked = campaign.banked_run(name)
        if banked is not None and banked.delta != value:
            raise SpecError(shown, f"prereg.references.{name}", f"{banked.delta!r}, the delta banked in "
                            f"campaign '{campaign.name}' ({campaign.file.name})", value,
                            hint="drop the line: references come from the campaign by name")
    return {**campaign.references, **own}


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)


def _grid_entry(label: str, t: Table) -> GridEntry:
    moves = t.str_map("suspects", {})
    for name, status in moves.items():
        if status not in STATUSES:
            raise SpecError(t.file, f"{t.key('suspects')}.{name}", "one of " + " | ".join(STATUSES), status)
    propose = None
    pt = t.table("propose")
    if pt is not None:
        values = pt.raw("set", {})
        if not isinstance(values, dict) or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                                                   for v in values.values()):
            raise pt.error("set", 'a table of flag = value (e.g. { "--image-augment" = "0" })', values)
        propose = Proposal(suspect=pt.str("suspect", check=SUSPECT_NAME.fullmatch, expected="the suspect it tests"),
                           set=MappingProxyType({k: str(v) for k, v in values.items()}),
                           drop=pt.str_list("drop", (), expected="a list of flags to remove"),
                           name=pt.str("name", None, check=NAME.fullmatch, expected="a run name"))
        for flag in (*propose.set, *propose.drop):
            if not flag.startswith("-"):
                raise pt.error("set" if flag in propose.set else "drop", "command-line flags such as \"--lr\"", flag)
        if not propose.set and not propose.drop:
            raise pt.error("set", "one factor to change (set or drop)", "<nothing>")
        pt.finish()
    entry = GridEntry(label=label, suspects=MappingProxyType(moves),
                      say=t.str("say", None, check=bool, expected="the sentence posted for this label"),
                      bank=t.str("bank", None, check=bool, expected="a folder to bank the checkpoints in"),
                      propose=propose, extend_to=t.int("extend_to", None, minimum=1),
                      owner_call=t.str("owner_call", None, check=bool, expected="the question for the owner"))
    t.finish()
    return entry
