"""`babysit slack check`: auth, scopes, each configured channel and a test post (docs/slack.md, Checking it)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from babysit.core.errors import EXIT_BAD_INPUT, BabysitError
from babysit.core.spec.run_toml import load_spec
from babysit.runtime import registry
from babysit.slack.channel import CHANNEL_ENV
from babysit.slack.check import Finding, run_check
from babysit.slack.client import TOKEN_ENV, web_client


def run_check_command(args: argparse.Namespace) -> int:
    channels = list(args.channel or ()) or configured_channels(registry.resolve_registry_path(args.registry))
    token = os.environ.get(TOKEN_ENV)
    findings = run_check(web_client(token) if token else None, token, channels, join=args.join,
                         post=not args.no_post)
    for f in findings:
        print(line(f))
    failed = [f for f in findings if not f.ok]
    if failed and failed[0].step == "token":
        return EXIT_BAD_INPUT
    print("slack check: " + (f"{len(failed)} problem(s): fix them, then run it again" if failed else
                             "ok: babysit can post here (docs/slack.md)"))
    return 1 if failed else 0


def line(f: Finding) -> str:
    mark = "ok  " if f.ok and not f.warning else "warn" if f.ok else "FAIL"
    return f"{mark} {f.step + ':':9}{f.text}" + (f"\n     {'':9}→ {f.fix}" if f.fix and (f.warning or not f.ok) else "")


def configured_channels(path: Path) -> list[str]:
    """Every channel babysit would post to: BABYSIT_SLACK_CHANNEL or [daemon].channel (the default), and each
    registered run's [notify].channel; in that order, each once."""
    out: list[str] = []
    reg = registry.load(path)
    default = os.environ.get(CHANNEL_ENV) or reg.daemon.channel
    if default:
        out.append(default)
    for entry in reg.runs:
        try:
            channel = load_spec(reg.spec_path(entry)).notify.channel
        except BabysitError:
            continue  # a broken run.toml is `register`'s and the daemon's to report
        if channel and channel not in out:
            out.append(channel)
    return out
