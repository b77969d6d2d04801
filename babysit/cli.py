"""The `babysit` command line: `main(argv) -> int`; only `entry()` exits.

Each subcommand lives in `babysit/commands/<name>.py` with `add_parser(subparsers)` and `run(args)`.
Command modules import nothing heavy at import time, so `babysit --help` and `babysit status`
answer at once (no torch, matplotlib or slack_bolt until a command needs them).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from babysit.errors import BabysitError

COMMANDS = ("register", "up", "status", "verdict", "amend", "prereg", "abort", "smoke", "bot", "probe", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="babysit",
        description="Babysit GPU training runs: guards, retries, pre-registered verdicts, Slack chat-ops.",
        epilog="Start with `babysit demo`. Docs: README.md and docs/.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"babysit.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"babysit.commands.{name}":
                continue  # a command not in this build
            raise
        module.add_parser(sub)
    return parser


def add_registry_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--registry", metavar="PATH",
                        help="the registry file (default: $BABYSIT_REGISTRY or ./babysit.toml)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except BabysitError as exc:
        print(f"ERROR: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"HINT: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `babysit … | head`: the reader left; not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)
