"""`babysit campaign register FILE` and `babysit campaign show NAME [--json]` (docs/campaigns.md).

`register` records the campaign (its suspects, banked references and the hash of what it declared) in
the state, then registers the runs it lists, in order, each through `babysit register` (so each is held
to the single-delta rule and its grid frozen). `show` prints the suspect table, each run with its delta,
label and what it changed, and the decision log.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from babysit.campaign import history
from babysit.campaign.saga import render_saga
from babysit.commands import register
from babysit.commands.args import parse
from babysit.core.campaign.render import show_text
from babysit.core.campaign.spec import load_campaign
from babysit.db.url import open_store
from babysit.runtime import registry


def run_register(args: argparse.Namespace) -> int:
    campaign = load_campaign(Path(args.file), display=args.file)
    path = registry.resolve_registry_path(args.registry)
    reg = registry.load(path)
    store = open_store(reg)
    try:
        now = time.time()
        store.save_campaign(campaign.name, str(campaign.file), campaign.sha256, now)
        # what a box that cannot read the file (another box of a fleet) shows of it: bot/owner_calls.py
        store.add_campaign_event(campaign.name, None, "registered", {"sha256": campaign.sha256,
                                 "question": campaign.question,
                                 "suspects": {s.name: s.status for s in campaign.suspects},
                                 "banked": campaign.references}, now,
                                 dedupe_key=f"{campaign.name}:registered:{campaign.sha256}")
    finally:
        store.close()
    print(f"campaign {campaign.name} recorded in {reg.state_dir}: {len(campaign.suspects)} suspect(s), "
          f"{len(campaign.banked)} banked run(s), sha256 {campaign.sha256[:16]}…")
    for spec in campaign.runs:
        print(f"$ babysit register {spec}" + (" --accelerated" if args.accelerated else ""))
        code = register.run(parse(["register", str(spec), "--registry", str(path),
                                   *(["--accelerated"] if args.accelerated else [])]))
        if code:
            return code
    return 0


def run_show(args: argparse.Namespace) -> int:
    path = registry.resolve_registry_path(args.registry)
    view = history.collect(path, args.name, curves=args.chart is not None)
    data = view.to_json()
    if args.chart is not None:
        data["chart"] = str(render_saga(view, args.chart))
    print(json.dumps(data, indent=1) if args.json else show_text(data) +
          (f"\n\nsaga chart: {data['chart']}" if args.chart is not None else ""))
    return 0
