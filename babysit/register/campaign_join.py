"""A run joins its campaign at `register`: the parent found, the delta computed and shown, the
single-delta rule applied (exit 2 naming the factors), the grid frozen in the store.

`prepare` decides before anything is written (so a refused run leaves the registry untouched);
`record` writes after the registry took the run. Both `babysit register` and a launch by an owner's
click go through here, so a proposal is held to the same rule as a hand-written run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from babysit.core.campaign import spec as cspec
from babysit.core.campaign import wording
from babysit.core.campaign.delta import Delta, compute, refusal
from babysit.core.errors import BadInput, RegistryError
from babysit.core.spec.run_toml import RunSpec, load_spec
from babysit.db.url import open_store
from babysit.runtime import registry as registry_mod


@dataclass(frozen=True)
class Joining:
    campaign: cspec.Campaign
    link: cspec.RunLink
    delta: Delta | None  # None: no parent declared (the campaign's first run)
    warnings: tuple[str, ...] = ()  # for stderr: said, never refused (e.g. the parent's prereg words copied)

    def lines(self) -> list[str]:
        head = f"campaign {self.campaign.name}: "
        if self.delta is None:
            return [head + "no parent declared: the campaign's baseline run"]
        tested = f", testing suspect {self.link.suspect}" if self.link.suspect else ""
        return [head + f"delta vs parent '{self.delta.parent}'{tested}:", *self.delta.lines()]


def link_of(spec: RunSpec) -> cspec.RunLink | None:
    return getattr(spec, "campaign", None)


def prepare(spec: RunSpec, registry_path: Path, shown: str) -> Joining | None:
    """None for a run outside any campaign; raises MultiDeltaRefused / SpecError (exit 2) when refused."""
    link = link_of(spec)
    if link is None:
        return None
    campaign = cspec.load_campaign(link.file)
    cspec.check_against(link, campaign, shown)
    if spec.prereg is not None:
        cspec.check_labels(link, spec.prereg.labels, shown)
    delta = None
    warnings: tuple[str, ...] = ()
    if link.parent is not None:
        if link.parent == spec.name:
            raise BadInput(f"{shown}: campaign.parent: a run cannot be its own parent ('{spec.name}')",
                           hint="name the run this one changes one factor of")
        parent = parent_spec(link.parent, campaign, registry_path, shown)
        delta = compute(spec, parent, link, campaign)
        if delta.refused:
            raise refusal(delta, shown)
        warnings = wording.echo_warnings(shown, link.parent, wording.echoed_keys(spec.prereg, parent.prereg))
    reg = registry_mod.load(registry_path)
    store = open_store(reg)
    try:
        joined = store.campaign_run(spec.name)
    finally:
        store.close()
    if joined is not None and (joined["grid_sha256"] != link.grid_sha256 or joined["campaign"] != campaign.name):
        raise RegistryError(
            f"{shown}: run '{spec.name}' joined campaign '{joined['campaign']}' with another interpretation grid "
            f"(sha256 {joined['grid_sha256'][:12]}…); this spec's [campaign] grid hashes to {link.grid_sha256[:12]}…",
            hint="the grid is frozen at register like the prereg: restore it, or register the run under a new name")
    return Joining(campaign, link, delta, warnings)


def record(joining: Joining, spec: RunSpec, reg: registry_mod.Registry, now: float | None = None) -> None:
    """After the registry took the run: the campaign, the run's delta and its frozen grid, in the store."""
    now = time.time() if now is None else now
    store = open_store(reg)
    try:
        c = joining.campaign
        store.save_campaign(c.name, str(c.file), c.sha256, now)
        delta = joining.delta
        body = {"parent": delta.parent, "suspect": delta.suspect, "multi_delta": delta.multi_delta,
                "summary": delta.summary(), "factors": [{"name": f.name, "old": f.old, "new": f.new, "role": f.role,
                                                         "suspect": f.suspect} for f in delta.factors]} \
            if delta else {"parent": None, "suspect": joining.link.suspect, "summary": "the campaign's baseline",
                           "factors": []}
        store.add_campaign_run(spec.name, c.name, str(spec.spec_file), joining.link.parent, joining.link.suspect, body,
                               joining.link.grid_canonical, joining.link.grid_sha256, now)
        store.add_campaign_event(c.name, spec.name, "run-joined",
                                 {"parent": joining.link.parent, "suspect": joining.link.suspect,
                                  "changed": body["summary"], "grid_sha256": joining.link.grid_sha256}, now,
                                 dedupe_key=f"{c.name}:joined:{spec.name}")
    finally:
        store.close()


def parent_spec(name: str, campaign: cspec.Campaign, registry_path: Path, shown: str) -> RunSpec:
    """The parent: a banked run with a spec in campaign.toml, else a registered run."""
    banked = campaign.banked_run(name)
    if banked is not None and banked.spec is not None:
        return load_spec(banked.spec)
    reg = registry_mod.load(registry_path)
    entry = reg.find(name)
    if entry is None:
        known = [b.name for b in campaign.banked if b.spec] + list(reg.names)
        raise BadInput(f"{shown}: campaign.parent: no run named '{name}' (registered, or banked with a spec in "
                       f"{campaign.file.name}); known: " + (", ".join(known) or "none"),
                       hint="register the parent first, or give its [[banked]] entry a spec = \"its run.toml\"")
    return load_spec(reg.spec_path(entry))
