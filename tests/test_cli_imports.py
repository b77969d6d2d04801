"""`babysit --help` imports no command: the parsers (babysit/commands/args.py) are apart from the commands,
and each parser names the function that runs it, which must exist."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

from babysit.cli import build_parser
from babysit.executors.shim import shim_argv

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "matplotlib", "slack_bolt", "slack_sdk", "apscheduler", "rich", "transformers", "lightning",
         "prometheus_client", "aiohttp", "structlog")


def test_building_the_parser_imports_no_command_and_nothing_heavy():
    code = ("import sys, babysit.cli; babysit.cli.build_parser(); "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {set(HEAVY)!r})); "
            "print(sorted(m for m in sys.modules if m.startswith('babysit.commands.') and m != 'babysit.commands.args'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "[]"]


def test_every_parser_names_a_command_that_exists():
    def handlers(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, tuple[str, str]]]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if sub._defaults.get("handler"):
                        found.append((f"{path} {name}", sub._defaults["handler"]))
                    found += handlers(sub, f"{path} {name}")
        return found

    found = handlers(build_parser(), "babysit")
    assert len(found) >= 13
    for path, (module, function) in found:
        assert callable(getattr(importlib.import_module(f"babysit.commands.{module}"), function, None)), path


def test_status_on_sqlite_imports_no_database_library(tmp_path: Path) -> None:
    """SQLAlchemy, Alembic and psycopg load only for a PostgreSQL url or a migration (docs/fleet.md)."""
    code = ("import sys; from babysit.cli import main; main(['status']); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'alembic', 'psycopg'}))")
    env = {k: v for k, v in os.environ.items() if k != "BABYSIT_STORE_URL"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]"


def test_the_demo_command_imports_no_database_library() -> None:
    """README command 1 installs `.[trainer]` only: `babysit demo` must load without SQLAlchemy, Alembic
    or psycopg (the fleet demo imports them when it runs, saying what to install when they are missing)."""
    code = ("import sys; import babysit.commands.demo; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'alembic', 'psycopg'}))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]"


def test_the_shim_imports_nothing_heavy_not_its_package_and_not_the_store(tmp_path: Path) -> None:
    """A shim is one process a run: 1,000 runs start 1,000 of them, so what it imports is paid 1,000 times
    (structlog and rich through the GPU probe cost ~1.5 s of CPU a start on a loaded box: bench/scale.py).
    It is started as the local executor starts it, and `-X importtime` lists every module it loaded: not the
    `babysit.executors` package (which names the store and the GPU probe), none of those, nothing heavy."""
    argv = shim_argv(tmp_path, [sys.executable, "-c", "pass"])
    out = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "exit.json").read_text())["exit_code"] == 0
    loaded = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert {"babysit.core.spec.run_toml", "babysit.probes.host", "babysit.runtime.atomic"} <= loaded  # the list is whole
    assert sorted(m for m in loaded if m == "babysit.executors" or m.split(".")[0] in HEAVY
                  or m.startswith(("babysit.db", "babysit.probes.gpu", "sqlite3"))) == []
