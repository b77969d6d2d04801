"""`babysit status [RUN] [--json]`: what every run is doing, from the store alone (fast, read-only)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    from babysit.cli import add_registry_option

    p = sub.add_parser("status", help="runs, attempt, step, s/step, ETA, last poll, last incident")
    p.add_argument("run", nargs="?", metavar="RUN")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_registry_option(p)
    p.set_defaults(func=run)


def collect(reg: Any, names: list[str]) -> list[dict[str, Any]]:
    from babysit.store import Store

    db = reg.state_dir / "state.db"
    store = Store(db) if db.exists() else None
    now = time.time()
    rows = []
    for name in names:
        row: dict[str, Any] = {"run": name, "status": "registered", "attempt": None, "profile": None, "step": None,
                               "seconds_per_step": None, "eta_seconds": None, "gpu_hours": 0.0,
                               "last_poll_at": None, "last_incident": None, "verdict": None,
                               "hardware_profile": None}
        if store is not None:
            status, facts = store.run_state(name)
            attempts = store.attempts(name)
            row["status"] = status if attempts or status != "pending" else "registered"
            if attempts:
                row["attempt"], row["profile"] = attempts[-1].n, attempts[-1].profile
                row["outcome"] = attempts[-1].outcome
            row["step"] = facts.get("step")
            row["hardware_profile"] = facts.get("hardware_profile")  # set by `babysit smoke`
            row["gpu_hours"] = round(store.gpu_seconds(name, now) / 3600, 4)
            polls = store.polls(name, 1)
            if polls:
                snap = polls[0].body
                row.update(last_poll_at=polls[0].at, seconds_per_step=snap.get("seconds_per_step"),
                           eta_seconds=snap.get("eta_seconds") if status in ("running", "stopping") else None)
            incidents = store.incidents(name, 1)
            if incidents:
                row["last_incident"] = {"kind": incidents[0].kind, "at": incidents[0].at}
            verdict = store.latest_verdict(name)
            if verdict:
                row["verdict"] = {k: verdict.body.get(k) for k in ("status", "label", "delta", "at_step")}
        rows.append(row)
    if store is not None:
        store.close()
    return rows


def run(args: argparse.Namespace) -> int:
    from babysit import registry
    from bot.messages import status_table

    reg = registry.load(registry.resolve_registry_path(args.registry))
    names = [reg.get(args.run).name] if args.run else list(reg.names)
    rows = collect(reg, names)
    if args.json:
        print(json.dumps(rows if not args.run else rows[0], indent=2))
        return 0
    if not rows:
        print(f"no runs registered in {reg.path}; `babysit register RUN.toml` adds one")
        return 0
    print(status_table(rows, time.time()))
    for r in rows:
        if r.get("hardware_profile"):
            hp = r["hardware_profile"]
            print(f"{r['run']}: attempt 1 profile '{hp.get('profile')}' selected by smoke run {hp.get('measured_at')} "
                  f"({hp.get('path')})")
    return 0
