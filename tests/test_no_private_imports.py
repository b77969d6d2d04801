"""No module of ours leans on another package's private names: they change without notice in a patch
release (`re._compiler` was `sre_compile` until 3.11), and a trick on them is one the next engineer must
rediscover. A private name starts with one `_` (not a dunder, not an enum-style `_sunder_`).

Checked by an AST walk over babysit/, bot/ and trainer/:

- an import of a private module or name from a package that is not ours (`import re._parser`,
  `from re2 import _Anchor`);
- an attribute `module._name` on a module imported from a package that is not ours (`re._compiler`);
- an attribute `obj._name` whose name no module of ours defines anywhere (`compiled._regexp`): it can only
  be another package's.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ("babysit", "bot", "trainer", "tests")
WALKED = ("babysit", "bot", "trainer")

# Names with a leading underscore that their package documents as public API.
DOCUMENTED = {
    ("os", "_exit"): "os._exit: documented, the way to leave a forked child",
    ("sys", "_getframe"): "sys._getframe: documented in the sys module",
    ("_thread", ""): "_thread: the documented low-level threading module",
}
DOCUMENTED_ATTRIBUTES = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}  # namedtuple's public API

# Files that still use another package's private names, each with why (none now). A file listed here that no
# longer breaks the rule fails the test, so the list only shrinks.
ALLOW_LIST: dict[str, str] = {}
ATTRIBUTE_CALLS = {"getattr", "hasattr", "setattr", "delattr"}


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not (len(name) > 2 and name.endswith("_"))


def ours(module: str) -> bool:
    return module.split(".")[0] in OURS


def sources() -> list[Path]:
    return sorted(p for top in WALKED for p in (ROOT / top).rglob("*.py"))


def our_private_names(paths: list[Path]) -> set[str]:
    """Every private name our code defines: functions, classes, parameters, variables, attributes assigned,
    import aliases, keyword arguments and `__slots__` entries (a `setattr` with a string does not count). An attribute read with any other private
    name is another package's."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[-1])
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                      for t in node.targets):
                names.update(c.value for c in ast.walk(node.value)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return {name for name in names if private(name)}


def violations(path: Path, defined: set[str]) -> Iterator[str]:
    """`line: what` for each use of another package's private name in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    foreign_modules: dict[str, str] = {}  # a local name -> the foreign module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if ours(alias.name):
                    continue
                if any(private(part) for part in alias.name.split(".")) and (alias.name, "") not in DOCUMENTED:
                    yield f"{node.lineno}: import {alias.name}"
                local = alias.asname or alias.name.split(".")[0]  # `import a.b` binds `a`; `as x` binds a.b
                foreign_modules[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and not ours(node.module):
            if any(private(part) for part in node.module.split(".")):
                yield f"{node.lineno}: from {node.module} import …"
            for alias in node.names:
                if private(alias.name) and (node.module, alias.name) not in DOCUMENTED:
                    yield f"{node.lineno}: from {node.module} import {alias.name}"
                else:
                    foreign_modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            target, attr = node.value, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_CALLS
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            target, attr = node.args[0], node.args[1].value  # getattr(nv, "_private")
        else:
            continue
        if not private(attr) or attr in DOCUMENTED_ATTRIBUTES:
            continue
        module = foreign_modules.get(target.id) if isinstance(target, ast.Name) else None
        if module is not None:
            if (module, attr) not in DOCUMENTED:
                yield f"{node.lineno}: {module}.{attr}"
        elif attr not in defined:
            yield f"{node.lineno}: ….{attr} (no module of ours defines it)"


def test_no_module_uses_another_packages_private_names() -> None:
    paths = sources()
    defined = our_private_names(paths)
    found = {str(p.relative_to(ROOT)): list(violations(p, defined)) for p in paths}
    bad = {path: uses for path, uses in found.items() if uses and path not in ALLOW_LIST}
    assert not bad, "private names of other packages (use their public API; see this test's docstring):\n" + \
        "\n".join(f"  {path}:{use}" for path, uses in sorted(bad.items()) for use in uses)
    fixed = sorted(path for path in ALLOW_LIST if not found.get(path))  # fixed: take it off the list
    assert not fixed, f"no longer uses private names: remove from ALLOW_LIST in {Path(__file__).name}: {fixed}"


def test_the_check_finds_each_kind_of_private_use(tmp_path: Path) -> None:
    """The rule is not vacuous: each form it forbids is found, and our own or documented names are not."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import re\nimport re._parser as sre\nfrom re2 import _Anchor\nimport os, _thread\n"
        "from collections import namedtuple\n"
        "class Mine:\n    def __init__(self):\n        self._own = 1\n"
        "def f(compiled, point):\n"
        "    re._compiler.compile\n    compiled._regexp\n    Mine()._own\n    os._exit\n    point._replace\n"
        "    getattr(compiled, '_lookup', None)\n    getattr(Mine(), '_own')\n")
    found = sorted(violations(sample, our_private_names([sample])), key=lambda use: int(use.split(":")[0]))
    assert [use.split(":")[0] for use in found] == ["2", "3", "10", "11", "15"], found
    assert "re._compiler" in found[2] and "_regexp" in found[3] and "_lookup" in found[4]
