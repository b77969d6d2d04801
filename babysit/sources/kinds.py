"""A kind's adapter by its name: the module the registry (`core/spec/source_kinds.py`) names, and its `KIND`.

Imported when first asked for, so a run reading one kind never imports another kind's module (nor the
framework it reads with: those are imported by the readers themselves, later still).
"""

from __future__ import annotations

import importlib

from babysit.core.spec import source_kinds
from babysit.sources.kind import SourceKind

_LOADED: dict[str, tuple[str, SourceKind]] = {}


def adapter(name: str) -> SourceKind:
    """The `SourceKind` of a registered kind (KeyError for one the registry does not hold)."""
    module = source_kinds.rules(name).adapter
    got = _LOADED.get(name)
    if got is None or got[0] != module:  # (a test may register a kind of its own under a name)
        got = _LOADED[name] = (module, importlib.import_module(module).KIND)
    return got[1]
