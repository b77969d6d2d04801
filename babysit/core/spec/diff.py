"""What changed in a run.toml between two registrations, key path by key path. Pure.

`babysit register` keeps the spec it registered (`<state_dir>/specs/<run>.json`); on the next
register of the same run it lists the fields that differ, so an edit is never answered "unchanged".
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


ABSENT: Any = _Absent()  # the side of a change where the key was not written
SHOWN_CHARS = 60  # a long value is cut to this many characters in a change line


@dataclass(frozen=True)
class Change:
    key: str  # e.g. "guards.stall_minutes", "attempts[1].args"
    old: Any  # ABSENT where the key was not written
    new: Any

    def __str__(self) -> str:
        return f"{self.key}: {_shown(self.old)} → {_shown(self.new)}"


def changes(old: Mapping[str, Any], new: Mapping[str, Any], *, skip: tuple[str, ...] = ()) -> tuple[Change, ...]:
    """Every leaf that differs, in key-path order; top-level tables in `skip` are left out."""
    before = {k: v for k, v in _leaves(old) if k.split(".")[0].split("[")[0] not in skip}
    after = {k: v for k, v in _leaves(new) if k.split(".")[0].split("[")[0] not in skip}
    return tuple(Change(k, before.get(k, ABSENT), after.get(k, ABSENT))
                 for k in sorted(before.keys() | after.keys()) if before.get(k, ABSENT) != after.get(k, ABSENT))


def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Tables are walked into and arrays of tables indexed; any other value (lists included) is a leaf."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, value


def _shown(value: Any) -> str:
    if value is ABSENT:
        return repr(ABSENT)
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"
