"""`babysit register RUN.toml`: validate, run the fixture, freeze the prereg hash, record the run."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    from babysit.cli import add_registry_option

    p = sub.add_parser("register", help="validate a run.toml and record it in the registry",
                       description="Validate RUN.toml, check its verdict instrument on the fixture, freeze the "
                                   "[prereg] hash and record the run in babysit.toml. Launches nothing.")
    p.add_argument("spec", metavar="RUN.toml")
    p.add_argument("--accelerated", action="store_true",
                   help="allow poll cadences under 30 minutes (demos and tests; run the daemon accelerated too)")
    add_registry_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from babysit import registry
    from babysit.spec import check_cadence, load_spec

    spec = load_spec(Path(args.spec), display=args.spec)
    check_cadence(spec, args.accelerated)
    if spec.prereg is not None and spec.prereg.fixture is not None:
        from babysit.reading import check_fixture

        result = check_fixture(spec.prereg)
        print(f"fixture ok: {spec.prereg.fixture.log.name} reads Δ {result.got_delta:+.{spec.prereg.precision}f} "
              f"→ {result.got_label} (expected {result.expected_delta:+.{spec.prereg.precision}f} → "
              f"{result.expected_label})")
    path = registry.resolve_registry_path(args.registry)
    now = registry.utc_timestamp(datetime.now(timezone.utc))
    sha = spec.prereg.sha256 if spec.prereg else None

    def change(reg: registry.Registry) -> tuple[registry.Registry, str]:
        entry = registry.RunEntry(name=spec.name, spec=reg.spec_ref(spec.spec_file), registered_at=now,
                                  prereg_sha256=sha)
        return registry.with_run(reg, entry)

    outcome = registry.update(path, change)
    if spec.prereg is not None:
        keep_frozen_copy(registry.load(path).state_dir, spec.name, spec.prereg.sha256, spec.prereg.canonical, now)
    frozen = f"; prereg sha256 {sha[:16]}… frozen" if sha else "; no [prereg]: babysat without a verdict"
    print(f"{outcome}: {spec.name} in {path}{frozen}")
    return 0


def keep_frozen_copy(state_dir: Path, name: str, sha256: str, canonical: str, now: str) -> Path:
    """Keep the frozen [prereg] text itself beside the state, so `babysit prereg show` can print what was
    registered even after the run.toml has been edited (the registry keeps only its hash)."""
    import json
    import os

    folder = state_dir / "prereg"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{name}.json"
    if path.exists() and json.loads(path.read_text()).get("sha256") == sha256:
        return path
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"run": name, "sha256": sha256, "canonical": canonical, "registered_at": now}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
