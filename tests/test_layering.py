"""The architecture, checked: the pure core imports nothing with effects, and babysit never imports bot.

babysit/core/ holds the decisions (spec, verdict, amendment rules, guards, classify, retry, snapshot,
smoke selection, rendering): it may import the standard library's pure modules and itself, nothing
else — no store, probe, executor, Slack or third-party module. A campaign's pure modules (its spec,
single-delta rule, grid and words) live with the campaign in babysit/campaign/ and are held to the
same rule; the core may use them. bot/ (the slash-command app) depends on
babysit; babysit depends on bot only where the CLI starts the bot (`babysit bot`, `babysit up --bot`).
babysit's and bot's own modules are imported at the top of a module, never inside a function: only
heavy third-party modules (torch, matplotlib, slack_sdk, …) are imported lazily.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Standard-library modules with effects (processes, sockets, files as storage, threads, the clock) that
# a pure decision has no business importing.
EFFECTFUL_STDLIB = {"subprocess", "socket", "sqlite3", "threading", "signal", "shutil", "tempfile", "time",
                    "urllib", "http", "multiprocessing", "asyncio", "select", "selectors", "logging"}
# Named exceptions, each for a use without effects.
ALLOWED = {("babysit/core/classify.py", "signal"): "signal.Signals: the name of the signal that ended a run",
           ("babysit/core/tomlfile.py", "tomli"): "the TOML parser below Python 3.11 (tomllib above)",
           ("babysit/core/source_spec.py", "re2"): "RE2 compiles a [[source.patterns]] regex as `re` would: "
                                                   "a pure function, linear-time so user patterns cannot blow up"}
# Where babysit may start the bot: the CLI commands that host it (the composition root).
BOT_HOSTS = {"babysit/commands/bot.py", "babysit/commands/up.py"}


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module `path` imports, at any depth (function-local and TYPE_CHECKING imports count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


PURE_CAMPAIGN = ("babysit.campaign.spec", "babysit.campaign.delta", "babysit.campaign.grid",
                 "babysit.campaign.render")


def pure_modules() -> list[Path]:
    return sorted((ROOT / "babysit" / "core").glob("*.py")) + [
        ROOT / (name.replace(".", "/") + ".py") for name in PURE_CAMPAIGN]


def test_the_core_imports_only_itself_and_pure_stdlib():
    bad = []
    for path in pure_modules():
        for line, module in imports(path):
            top = module.split(".")[0]
            if module == "babysit.core" or module.startswith("babysit.core.") or module in PURE_CAMPAIGN:
                continue
            if top in sys.stdlib_module_names and top not in EFFECTFUL_STDLIB and top != "babysit":
                continue
            if (str(path.relative_to(ROOT)), module) in ALLOWED:
                continue
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "the pure core imports an effect or a third-party module:\n" + "\n".join(bad)


def test_babysit_never_imports_bot_except_where_the_cli_starts_it():
    bad = []
    for path in sorted((ROOT / "babysit").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in BOT_HOSTS:
            continue
        bad += [f"{rel}:{line} imports {module}" for line, module in imports(path)
                if module == "bot" or module.startswith("bot.")]
    assert not bad, "babysit must not depend on the Slack bot:\n" + "\n".join(bad)


# Function-local imports of babysit's or bot's own modules, each with the reason it is not at the top.
LOCAL_IMPORTS_ALLOWED = {
    ("babysit/commands/status.py", "babysit.watch"):
        "only `status --watch` needs it, and it imports structlog and rich (~0.2 s): `babysit status` stays fast",
    ("babysit/db/url.py", "babysit.db.postgres"):
        "psycopg (~0.35 s) only where a PostgreSQL url is configured: a SQLite box never loads it",
    ("babysit/commands/db.py", "babysit.db.postgres"): "psycopg only for a PostgreSQL url (`db version` on SQLite)",
    ("babysit/commands/db.py", "babysit.db.copy"): "psycopg only for `db copy`",
    ("babysit/daemon.py", "babysit.db.fleet"): "psycopg only for a daemon of a fleet (a PostgreSQL url)",
}


def local_imports(path: Path) -> list[tuple[int, str]]:
    """The babysit and bot modules `path` imports anywhere but its top level (inside a function, or
    under `if TYPE_CHECKING:`, where a cycle usually hides); relative imports count as babysit's."""
    tree = ast.parse(path.read_text(), str(path))
    top = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            top.add(id(node))
        elif isinstance(node, (ast.Try, ast.If)) and not (isinstance(node, ast.If) and "TYPE_CHECKING" in
                                                         ast.unparse(node.test)):
            top |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    found = []
    for node in ast.walk(tree):
        if id(node) in top:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in ("babysit", "bot")]
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in ("babysit", "bot")):
            found.append((node.lineno, "." * node.level + (node.module or "")))
    return found


def test_babysit_and_bot_import_their_own_modules_at_the_top():
    """`babysit --help` stays fast because the parsers live apart from the commands
    (babysit/commands/args.py), not because imports hide inside functions; a local import of a light
    module only hides an import cycle or a slow module, which belongs fixed where it is."""
    bad = []
    for path in sorted([*(ROOT / "babysit").rglob("*.py"), *(ROOT / "bot").rglob("*.py")]):
        rel = str(path.relative_to(ROOT))
        bad += [f"{rel}:{line} imports {module} inside a function" for line, module in local_imports(path)
                if (rel, module) not in LOCAL_IMPORTS_ALLOWED]
    assert not bad, ("import babysit's and bot's modules at the top of the module (a cycle: move what both "
                     "need to where it belongs; a heavy import: make it lazy there):\n" + "\n".join(bad))


def test_the_checks_above_see_a_violation(tmp_path: Path):
    """The import walker finds function-local and TYPE_CHECKING imports (a checker that sees nothing
    would pass everything)."""
    sample = tmp_path / "m.py"
    sample.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from babysit.store import Store\n"
                      "def f():\n    import bot.app\n")
    assert {m for _, m in imports(sample)} == {"typing", "babysit.store", "bot.app"}
    assert local_imports(sample) == [(3, "babysit.store"), (5, "bot.app")]


def test_only_the_cli_imports_the_commands():
    """babysit/commands/ is the CLI's: library code (the daemon, campaigns, the web page) and the bot use
    the modules the commands use, never a command (where a command and the library share a function,
    it lives in the library)."""
    bad = []
    for path in sorted([*(ROOT / "babysit").rglob("*.py"), *(ROOT / "bot").rglob("*.py")]):
        rel = str(path.relative_to(ROOT))
        if rel.startswith("babysit/commands/") or rel == "babysit/cli.py":
            continue
        bad += [f"{rel}:{line} imports {module}" for line, module in imports(path)
                if module == "babysit.commands" or module.startswith("babysit.commands.")]
    assert not bad, "library code depends on a CLI command:\n" + "\n".join(bad)
