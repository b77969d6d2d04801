"""The `babysit` command line: `main(argv) -> int`; only `entry()` exits.

Every command's arguments are declared in `babysit/commands/args.py` (the parser is built there), which
imports nothing but argparse, so `babysit --help` answers at once; `main` then imports the one command
that runs, `babysit/commands/<name>.py`, and calls its `run(args)` (or the function its parser names).
Commands never call back up here: one that runs another calls its function (commands/demo.py).
"""

from __future__ import annotations

import importlib
import sys

from babysit.commands.args import build_parser
from babysit.core.errors import EXIT_BAD_INPUT, BabysitError


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
