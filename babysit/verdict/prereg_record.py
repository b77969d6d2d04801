"""The frozen record of a run's pre-registration: the [prereg] text `register` froze, kept beside the
state, and the amendment chain verified record by record.

`babysit register` and a campaign's launches keep the copy; `babysit prereg show` and the web page
read it back (the registry itself keeps only the hash).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from babysit.core.spec.amendment import amendment_sha256
from babysit.db.store import Store
from babysit.db.url import open_existing
from babysit.runtime.atomic import write_private_json
from babysit.sources import records_path
from babysit.verdict import reading


def keep_frozen_copy(state_dir: Path, name: str, sha256: str, canonical: str, now: str) -> Path:
    """Keep the frozen [prereg] text itself beside the state, so `babysit prereg show` can print what was
    registered even after the run.toml has been edited (the registry keeps only its hash)."""
    path = state_dir / "prereg" / f"{name}.json"
    if path.exists() and json.loads(path.read_text()).get("sha256") == sha256:
        return path
    write_private_json(path, {"run": name, "sha256": sha256, "canonical": canonical, "registered_at": now})
    return path


def frozen_copy(state_dir: Path, name: str, sha256: str | None) -> dict[str, Any] | None:
    """The [prereg] table `register` froze under `sha256` (None: no copy, or a copy of another text)."""
    path = state_dir / "prereg" / f"{name}.json"
    if not path.exists():
        return None
    kept = json.loads(path.read_text())
    return json.loads(kept["canonical"]) if kept.get("sha256") == sha256 else None


def verify_chain(amendments: list[Any]) -> list[dict[str, Any]]:
    """Recompute each record's sha256 from its text and the previous record's hash; flag every break."""
    out = []
    prev: str | None = None
    for a in amendments:
        problems = []
        if a.prev_sha256 != prev:
            problems.append("prev_sha256 is not the previous record's sha256")
        if amendment_sha256(a.text, a.prev_sha256) != a.sha256:
            problems.append("sha256 does not match the text")
        out.append({"n": a.n, "title": a.title, "declared_at": a.declared_at,
                    "data_seen_through_step": a.data_seen_through_step, "sha256": a.sha256,
                    "prev_sha256": a.prev_sha256, "chain_ok": not problems, "problems": problems, "text": a.text})
        prev = a.sha256
    return out


def collect(registry_path: Path, name: str, store: Store | None = None) -> dict[str, Any]:
    """The run's [prereg] as registered and as its run.toml says now, and its amendment chain verified:
    what `babysit prereg show` prints and the web page's prereg panel shows. `store`: the reader's open
    one (the web page's: its box's mirror while PostgreSQL is down), else one is opened here."""
    reg, entry, spec = reading.load_registered(registry_path, name)
    prereg = spec.prereg
    amendments = []
    if store is not None:
        amendments = store.amendments(spec.name)
    elif (own := open_existing(reg)) is not None:
        try:
            amendments = own.amendments(spec.name)
        finally:
            own.close()
    chain = verify_chain(amendments)
    current = prereg.sha256 if prereg else None
    frozen = frozen_copy(reg.state_dir, spec.name, entry.prereg_sha256)
    return {
        "run": spec.name,
        "spec": str(spec.spec_file),
        "registered_at": entry.registered_at,
        "prereg_sha256_registered": entry.prereg_sha256,
        "prereg_sha256_current": current,
        "matches": current == entry.prereg_sha256,
        "prereg": json.loads(prereg.canonical) if prereg else None,
        "prereg_registered": frozen,
        "log": str(records_path(spec, reg.state_dir)),
        "fixture_log": str(prereg.fixture.log) if prereg and prereg.fixture else None,
        "amendments": chain,
        "chain_ok": all(a["chain_ok"] for a in chain),
    }
