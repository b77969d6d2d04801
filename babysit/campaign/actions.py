"""The steps a campaign's grid is carried out with, and what an owner's decision does.

`babysit/campaign/outcomes.py` decides when (a run's grid waits for its parent's FINAL verdict) and
calls these: bank the checkpoints (copied, sha256 manifest, verified by reading the copies back),
write the proposed runs (never launched), draw the saga chart. Every step is keyed in the store, so a
restarted daemon redoing it records nothing twice.

`decide` is what a button click does after the bot checked the signature and the allow-list: the
first decision wins (the store's atomic update), `launch`/`extend` register the proposal (the same
single-delta rule as `babysit register`) so the daemon launches it, `hold` launches nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import structlog

from babysit.campaign import propose
from babysit.campaign.history import view_of
from babysit.campaign.saga import render_saga
from babysit.core.campaign import grid as grid_mod
from babysit.core.campaign.spec import Campaign
from babysit.core.errors import BabysitError, BadInput
from babysit.core.spec.tomlfile import load
from babysit.db.store import OwnerCall, Store
from babysit.register import registration
from babysit.runtime.atomic import write_atomic

log = structlog.get_logger("babysit.campaign")

MANIFEST = "manifest.json"
CHUNK = 1 << 20


class BankError(BabysitError):
    """The checkpoints could not be banked (none, unreadable, a copy that does not verify)."""


def bank(source: Path, dest: Path, *, run: str, label: str, now: float) -> dict[str, Any]:
    """Copy every file under `source` to `dest` with a manifest of sha256s, then read the copies back
    and check them: only a verified bank is moved into place (a folder beside `dest` until then)."""
    source, dest = Path(source), Path(dest)
    found = verify(dest)
    if found is not None and found.get("verified") and found.get("run") == run:
        return found  # banked before (a daemon redoing the step)
    if dest.exists():
        raise BankError(f"cannot bank {run} to {dest}: it exists and holds no verified manifest of this run",
                        hint="choose another [campaign.grid.LABEL].bank folder, or move the old one away")
    files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else []
    if not files:
        raise BankError(f"no checkpoints to bank in {source}", hint="did the trainer save any (--save-every)?")
    partial = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    entries = []
    for f in files:
        rel = f.relative_to(source).as_posix()
        out = partial / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        digest, size = _copy_hashing(f, out)
        entries.append({"path": rel, "bytes": size, "sha256": digest})
    manifest = {"run": run, "label": label, "source": str(source), "banked_at": now, "files": entries}
    problems = _check(partial, entries)
    if problems:
        shutil.rmtree(partial, ignore_errors=True)
        raise BankError(f"banking {run}: the copies do not verify: {'; '.join(problems)}")
    manifest["verified"] = True
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=1))
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, dest)
    return manifest


def verify(dest: Path) -> dict[str, Any] | None:
    """The bank's manifest with `verified` re-checked against the files now (None: no manifest)."""
    path = Path(dest) / MANIFEST
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    problems = _check(Path(dest), manifest.get("files") or [])
    return {**manifest, "verified": not problems, "problems": problems}


def decide(registry_path: Path, store: Store, call: OwnerCall, decision: str, by: str, now: float) -> str:
    """Carry out an owner's decision (already recorded by the caller); returns what was done, in words."""
    campaign = call.campaign
    if decision == grid_mod.HOLD:
        result = "held: nothing launched"
    else:
        path = (call.body.get("proposals") or {}).get(decision)
        if not path:
            raise BadInput(f"owner call #{call.id} offers no '{decision}'")
        name = launch_file(registry_path, Path(path))
        result = f"registered {name} ({Path(path).name}): the daemon launches it"
    store.set_owner_call_result(call.id, result)
    store.add_campaign_event(campaign, call.run, "decision",
                             {"call": call.id, "decision": decision, "by": by, "result": result}, now,
                             dedupe_key=f"{campaign}:decision:{call.id}")
    return result


def launch_file(registry_path: Path, path: Path) -> str:
    """Register a proposed run.toml through `registration.register`, as `babysit register` does (fixture,
    program, single-delta rule, prereg frozen, the daemon woken).

    The poll cadence is not held to the 30-minute rule here (`accelerated=True`): a proposal's [poll] is its
    parent's, which passed register, and the daemon checks the cadence against its own mode when it picks
    the run up (a non-accelerated daemon refuses a demo's 20-minute cadence, loudly)."""
    done = registration.register(path, registry_path, accelerated=True)
    for text in done.warnings:
        log.warning("proposal registered with a warning", run=done.spec.name, spec=str(path), warning=text)
    return done.spec.name


# -- the steps of a grid carried out (outcomes.carry) -------------------------------------------------
def bank_step(store: Store, campaign: Campaign, spec: Any, plan: grid_mod.Plan, key: str,
               now: float) -> dict[str, Any]:
    dest = (campaign.file.parent / str(plan.bank_to)).resolve()
    try:
        manifest = bank(Path(spec.checkpoints), dest, run=spec.name, label=plan.label, now=now)
        body = {"ok": True, "dest": str(dest), "files": len(manifest["files"]),
                "bytes": sum(f["bytes"] for f in manifest["files"]), "manifest": str(dest / MANIFEST)}
    except (BankError, OSError) as exc:
        body = {"ok": False, "dest": str(dest), "error": getattr(exc, "message", None) or str(exc)}
        log.error("checkpoints not banked", run=spec.name, error=body["error"])
    store.add_campaign_event(campaign.name, spec.name, "banked" if body["ok"] else "bank-failed", body, now,
                             dedupe_key=f"{key}:bank")
    return body


def proposal_step(store: Store, campaign: Campaign, spec: Any, plan: grid_mod.Plan, key: str,
                   now: float) -> dict[str, str]:
    """Write the proposed run.tomls (launch: the next single-delta run; extend: this run to N steps)."""
    out: dict[str, str] = {}
    table = load(spec.spec_file)
    if plan.propose is not None:
        name = grid_mod.proposal_name(campaign.name, plan.propose)
        out[grid_mod.LAUNCH] = str(_write(campaign, spec, table, name, plan.propose.suspect, plan,
                                          dict(plan.propose.set), plan.propose.drop, None))
    if plan.extend_to is not None:
        name = grid_mod.extension_name(spec.name, plan.extend_to)
        suspect = getattr(spec.campaign, "suspect", None)
        out[grid_mod.EXTEND] = str(_write(campaign, spec, table, name, suspect, plan,
                                          {"--steps": str(plan.extend_to)}, (), plan.extend_to))
    for kind, path in out.items():
        store.add_campaign_event(campaign.name, spec.name, "proposed", {"kind": kind, "path": path}, now,
                                 dedupe_key=f"{key}:proposed:{kind}")
    return out


def _write(campaign: Campaign, spec: Any, table: dict[str, Any], name: str, suspect: str | None,
           plan: grid_mod.Plan, set_flags: dict[str, str], drop: tuple[str, ...], read_step: int | None) -> Path:
    import tomli_w

    at = campaign.proposals / f"{name}.toml"
    derived = propose.derive(table, name=name, parent=spec.name, suspect=suspect, campaign_file=campaign.file,
                             at=at, set_flags=set_flags, drop=drop, read_step=read_step)
    propose.rebase_paths(derived, Path(spec.spec_file).parent, at.parent)
    why = "extend" if read_step else f"next single-delta run, suspect {suspect}"
    text = propose.HEADER.format(run=spec.name, label=plan.label, why=why) + "\n" + tomli_w.dumps(derived)
    at.parent.mkdir(parents=True, exist_ok=True)
    if not at.exists():  # written once: an owner may have edited it since
        write_atomic(at, text, mode=0o644)
    return at


def saga_step(store: Store, state_dir: Path, campaign: Campaign) -> tuple[Path | None, str | None]:
    """The saga chart, best effort: a chart that cannot be drawn never costs the campaign's actions."""
    try:
        view = view_of(campaign, store, curves=True)
        return render_saga(view, Path(state_dir) / "campaigns" / f"{campaign.name}.png"), None
    except Exception as exc:  # best effort by design
        log.error("saga chart not drawn", campaign=campaign.name, exc_info=exc)
        return None, f"{type(exc).__name__}: {exc}"[:200]


def _copy_hashing(src: Path, dst: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(CHUNK):
            h.update(chunk)
            fout.write(chunk)
            size += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return h.hexdigest(), size


def _check(root: Path, entries: list[dict[str, Any]]) -> list[str]:
    problems = []
    for e in entries:
        path = root / e["path"]
        if not path.is_file():
            problems.append(f"{e['path']}: missing")
            continue
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        if h.hexdigest() != e["sha256"]:
            problems.append(f"{e['path']}: sha256 {h.hexdigest()[:12]}… ≠ manifest {e['sha256'][:12]}…")
    return problems

