"""`babysit register RUN.toml`: validate, run the fixture, freeze the prereg hash, record the run.

Every check and every write is `registration.register`'s (the campaign's launches and a relaunch go
through it too); this command says what it found. Re-registering says exactly what changed since the
last register (a changed [prereg] is refused by the registry).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from babysit.register import registration
from babysit.runtime import registry

APPLIES = ("  these apply when a daemon next reads run.toml, at its next start (`babysit up`): a running daemon "
           "keeps the spec it read; restart it to apply them now (the runs keep running across a restart); "
           "an ended run takes them with `babysit relaunch`")


def run(args: argparse.Namespace) -> int:
    path = registry.resolve_registry_path(args.registry)
    done = registration.register(Path(args.spec), path, shown=args.spec, accelerated=args.accelerated)
    say(done)
    if done.sha256:
        frozen = f"; prereg sha256 {done.sha256[:16]}… " + ("still frozen" if done.changed else "frozen")
    else:
        frozen = "; no [prereg]: babysat without a verdict"
    if not done.changed:
        print(f"{done.outcome}: {done.spec.name} in {path}{frozen}")
        return 0
    moved = f", spec now {done.spec.spec_file}" if done.outcome == "updated" else ""
    print(f"changed: {done.spec.name} in {path}: {len(done.changed)} field(s) since the last register{moved}{frozen}")
    for c in done.changed:
        print(f"  {c}")
    print(APPLIES)
    return 0


def say(done: registration.Registration) -> None:
    """The checks' notes on stdout, their warnings on stderr (`WARNING: FILE: …`)."""
    for line in done.notes:
        print(line)
    for text in done.warnings:
        print(f"WARNING: {text}", file=sys.stderr)
