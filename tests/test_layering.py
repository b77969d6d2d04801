"""The architecture, checked (docs/architecture.md): the pure core imports nothing with effects, no import
circles, no arrow back up between the rooms, and babysit never imports bot.

babysit/core/ holds the decisions (spec, verdict, amendment rules, guards, classify, retry, snapshot,
smoke selection, rendering, the run's transition, a campaign's spec, single-delta rule, grid and words):
it may import the standard library's pure modules and itself, nothing else — no store, probe, executor,
Slack or third-party module. A room is a package under babysit/ (core/, commands/, campaign/, …), a
top-level module, or bot/: the rooms' imports form no cycle, so every arrow runs down (`farm-studio look`
draws the same floors). bot/ (the slash-command app) depends on
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
           ("babysit/core/spec/tomlfile.py", "tomli"): "the TOML parser below Python 3.11 (tomllib above)",
           ("babysit/core/spec/source.py", "re2"): "RE2 compiles a [[source.patterns]] regex as `re` would: "
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


def pure_modules() -> list[Path]:
    return sorted((ROOT / "babysit" / "core").rglob("*.py"))


def test_the_core_imports_only_itself_and_pure_stdlib():
    bad = []
    for path in pure_modules():
        for line, module in imports(path):
            top = module.split(".")[0]
            if module == "babysit.core" or module.startswith("babysit.core."):
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
    ("babysit/commands/status.py", "babysit.view.watch"):
        "only `status --watch` needs it, and it imports structlog and rich (~0.2 s): `babysit status` stays fast",
    ("babysit/db/url.py", "babysit.db.postgres"):
        "psycopg (~0.35 s) only where a PostgreSQL url is configured: a SQLite box never loads it",
    ("babysit/commands/db.py", "babysit.db.postgres"): "psycopg only for a PostgreSQL url (`db version` on SQLite)",
    ("babysit/commands/db.py", "babysit.db.copy"): "psycopg only for `db copy`",
    ("babysit/service/daemon.py", "babysit.db.fleet"): "psycopg only for a daemon of a fleet (a PostgreSQL url)",
    ("babysit/demo/fleet.py", "babysit.db.migrate"):
        "SQLAlchemy + Alembic only for `demo --fleet`: `babysit demo` runs on README command 1's install, without them",
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
    sample.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from babysit.db.store import Store\n"
                      "def f():\n    import bot.app\n")
    assert {m for _, m in imports(sample)} == {"typing", "babysit.db.store", "bot.app"}
    assert local_imports(sample) == [(3, "babysit.db.store"), (5, "bot.app")]


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


# -- circles and arrows back up -----------------------------------------------------------------------------
def module_graph(root: Path, packages: tuple[str, ...] = ("babysit", "bot")) -> dict[str, set[str]]:
    """Every own module of `packages` under `root` -> the own modules it imports (anywhere in the file:
    `from a import b` names module a.b when there is one, else a; relative imports resolved)."""
    files: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path

    def own(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        names: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                # `from a import b`: module a.b when there is one, else a (b is a name in it)
                names += [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
        graph[module] = {target for name in names if (target := own(name)) is not None and target != module}
    return graph


def room(module: str, graph: dict[str, set[str]]) -> str:
    """The room a module stands in: its package under babysit/ (babysit/core/), else itself; bot/ whole."""
    parts = module.split(".")
    if parts[0] != "babysit":
        return parts[0] + "/"
    if len(parts) > 2 or any(m.startswith(module + ".") for m in graph):  # a module of a package, or a package
        return "/".join(parts[:2]) + "/"
    return "/".join(parts) + (".py" if len(parts) > 1 else "/")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def rooms_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """Room -> the rooms it imports, each with the module imports that make the arrow."""
    out: dict[str, dict[str, list[str]]] = {}
    for module, targets in graph.items():
        for target in targets:
            a, b = room(module, graph), room(target, graph)
            if a != b:
                out.setdefault(a, {}).setdefault(b, []).append(f"{module} -> {target}")
    return out


def back_up_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Arrows between rooms that stand in one cycle of rooms: one of them must run back up."""
    by_room = rooms_graph(graph)
    bad = []
    for cycle in cycles({a: set(bs) for a, bs in by_room.items()}):
        for a in cycle:
            for b in cycle:
                if b in by_room.get(a, {}):
                    bad.append(f"{a} -> {b} ({', '.join(sorted(by_room[a][b])[:3])})")
    return bad


def test_no_module_imports_itself_through_others():
    """0 import circles: a circle is two modules that cannot be understood (or imported) one without the
    other; what both need belongs in a module below them."""
    found = cycles(module_graph(ROOT))
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_arrow_runs_back_up_between_the_rooms():
    """The rooms (core/, commands/, campaign/, store.py, cli.py, bot/, …) stand on floors: each imports
    only rooms below it. A command never calls cli.main (it calls the command's function); the core never
    imports the shell (what both need lives in the core)."""
    bad = back_up_arrows(module_graph(ROOT))
    assert not bad, "rooms importing each other (move what both need down, or pass it in):\n" + "\n".join(bad)


def test_the_circle_and_arrow_checks_see_a_violation(tmp_path: Path):
    """A checker that sees nothing would pass everything: a circle, and two rooms that import each other
    without a circle of modules (cli.py -> commands/args, commands/demo -> cli), are both found."""
    pkg = tmp_path / "babysit"
    (pkg / "commands").mkdir(parents=True)
    (pkg / "core").mkdir()
    for init in (pkg, pkg / "commands", pkg / "core"):
        (init / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("from babysit.commands.args import build\n")
    (pkg / "commands" / "args.py").write_text("import argparse\n")
    (pkg / "commands" / "demo.py").write_text("from babysit.cli import main\nfrom . import args\n")
    (pkg / "core" / "a.py").write_text("from babysit.core import b\n")
    (pkg / "core" / "b.py").write_text("def f():\n    from .a import x\n")
    graph = module_graph(tmp_path, ("babysit",))
    assert graph["babysit.commands.demo"] == {"babysit.cli", "babysit.commands.args"}
    assert cycles(graph) == [["babysit.core.a", "babysit.core.b"]]
    assert sorted(b.split(" (")[0] for b in back_up_arrows(graph)) == ["babysit/cli.py -> babysit/commands/",
                                                                       "babysit/commands/ -> babysit/cli.py"]
    assert room("babysit.core.a", graph) == "babysit/core/" and room("babysit.cli", graph) == "babysit/cli.py"


def private_reaches(path: Path) -> list[str]:
    """Every `x._name` in `path` where x is not `self`/`cls`: a reach into another object's private part."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        private = isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
        if private and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:"
                         f"{node.lineno}: {ast.unparse(node)}")
    return found


def daemon_rooms() -> list[Path]:
    return [*sorted((ROOT / "babysit" / "service").glob("*.py")), *sorted((ROOT / "babysit" / "run").glob("*.py"))]


def test_the_daemon_and_a_runs_parts_use_each_other_by_public_names_only():
    """The supervisor is a thin shell over parts (run_launch, run_log, run_observe, run_guard, run_exit,
    run_polls, run_verdict, run_posts): the daemon and the parts ask each other through public methods and
    attributes, never `supervisor._x` — a private reach is a concern that leaked its seam."""
    bad = [hit for path in daemon_rooms() for hit in private_reaches(path)]
    assert not bad, "private names reached into (make it public where it belongs, or move it):\n" + "\n".join(bad)


def test_the_private_reach_check_sees_one(tmp_path: Path):
    sample = tmp_path / "m.py"
    sample.write_text("def f(supervisor):\n    supervisor._later('k', 0.0, print, 'w')\n    self._x = 1\n")
    assert private_reaches(sample) == ["m.py:2: supervisor._later"]


# -- the tree shows the architecture ---------------------------------------------------------------------------
TOP_LEVEL_MODULES = {"__init__.py", "__main__.py", "cli.py"}  # cli on top; everything else lives in a package
LONG_MODULE_LINES = 600  # STYLE.md: past ~400 lines a file is probably two concerns; past 600 it is


def test_babysit_has_no_loose_modules_beside_the_cli():
    """babysit/ holds packages by concern (core/, run/, service/, db/, sources/, channels/, view/, …) and
    cli.py on top: a new module goes into the package of its concern, so the tree reads as the picture in
    docs/architecture.md."""
    loose = sorted(p.name for p in (ROOT / "babysit").glob("*.py") if p.name not in TOP_LEVEL_MODULES)
    assert not loose, f"modules loose at babysit/'s top (move each into the package of its concern): {loose}"


def test_no_module_is_over_600_lines():
    """No module of babysit or bot over 600 lines, and no paragraph excusing a long one: a module that
    grows past it holds two concerns, and is split by concern (service/daemon.py into roster, control,
    jobs and fleet_report; core/spec/run_toml.py into prereg and slurm)."""
    bad = []
    for path in sorted([*(ROOT / "babysit").rglob("*.py"), *(ROOT / "bot").rglob("*.py")]):
        if "migrations" in path.parts:
            continue
        text = path.read_text()
        lines = text.count("\n")
        if lines > LONG_MODULE_LINES or "Long on purpose" in (ast.get_docstring(ast.parse(text)) or ""):
            bad.append(f"{path.relative_to(ROOT)} ({lines} lines)")
    assert not bad, f"modules over {LONG_MODULE_LINES} lines or excusing their length (split each by concern):\n" + "\n".join(bad)
