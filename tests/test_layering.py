"""The architecture, checked: the pure core imports nothing with effects, and babysit never imports bot.

babysit/core/ holds the decisions (spec, verdict, amendment rules, guards, classify, retry, snapshot,
smoke selection, rendering): it may import the standard library's pure modules and itself, nothing
else — no store, probe, executor, Slack or third-party module. A campaign's pure modules (its spec,
single-delta rule, grid and words) live with the campaign in babysit/campaign/ and are held to the
same rule; the core may use them. bot/ (the slash-command app) depends on
babysit; babysit depends on bot only where the CLI starts the bot (`babysit bot`, `babysit up --bot`).
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
           ("babysit/core/tomlfile.py", "tomli"): "the TOML parser below Python 3.11 (tomllib above)"}
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


def test_the_checks_above_see_a_violation(tmp_path: Path):
    """The import walker finds function-local and TYPE_CHECKING imports (a checker that sees nothing
    would pass everything)."""
    sample = tmp_path / "m.py"
    sample.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from babysit.store import Store\n"
                      "def f():\n    import bot.app\n")
    assert {m for _, m in imports(sample)} == {"typing", "babysit.store", "bot.app"}
