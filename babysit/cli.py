"""The `babysit` command line: `main(argv) -> int`; only `entry()` exits.

Every command's arguments are declared in `babysit/commands/args.py`, which imports nothing but
argparse, so `babysit --help` answers at once; `main` then imports the one command that runs,
`babysit/commands/<name>.py`, and calls its `run(args)` (or the function its parser names).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from babysit.commands.args import REGISTRY_HELP, add_commands
from babysit.core.errors import EXIT_BAD_INPUT, BabysitError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="babysit",
        description="Babysit GPU training runs: guards, retries, pre-registered verdicts, Slack chat-ops.",
        epilog="Start with `babysit demo`. Docs: README.md and docs/.",
    )
    parser.add_argument("--version", action=_Version, help="print babysit's version and exit")
    # Global options go before or after the command (`babysit --registry X status` as git and kubectl
    # users type it). A command's own copy defaults to SUPPRESS, so it never overwrites the global value.
    parser.add_argument("--registry", metavar="PATH", default=None, help=REGISTRY_HELP)
    add_commands(parser.add_subparsers(dest="command", metavar="COMMAND"))
    return parser


class _Version(argparse.Action):
    """`--version`, looked up only when asked (the metadata scan costs milliseconds on every call)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"babysit {package_version()}")
        parser.exit()


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("babysit")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e . in the repository)"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    if args.registry is not None and not getattr(args, "reads_registry", False):
        print(f"ERROR: --registry: `babysit {args.command}` does not read a registry", file=sys.stderr)
        print(f"HINT: drop --registry; `babysit {args.command} --help` lists its options", file=sys.stderr)
        return EXIT_BAD_INPUT
    module, function = handler
    try:
        run = getattr(importlib.import_module(f"babysit.commands.{module}"), function)
        return int(run(args) or 0)
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
