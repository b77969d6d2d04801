"""Reading TOML files users write, with errors that name the file, the key path and what was expected.

`Table` walks a parsed table the way a validator should: every read names its key, every key that was
never read is an error (typos must not pass silently), and a value the user wrote is never replaced by
a default.
"""

from __future__ import annotations

import difflib
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from babysit.core.errors import SpecError, UnknownKey

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

T = TypeVar("T")
_MISSING: Any = object()
# An unread key at least this close (difflib ratio) to a missing required key is taken for its
# misspelling. tests/test_spec.py checks that no key babysit reads is this close to a required key
# of the same table, so the "unknown key" this claims is always true.
NEAR_MISS = 0.8


def read(path: Path, display: str, what: str = "TOML file") -> str:
    """A user's file as text; missing, unreadable or not UTF-8 is a SpecError naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(display, "", f"an existing {what}", "<no such file>")
    except (UnicodeDecodeError, IsADirectoryError, PermissionError) as exc:
        raise SpecError(display, "", "a readable UTF-8 TOML file", f"<{type(exc).__name__}>")
    except (OSError, ValueError) as exc:  # a name too long for the OS, a NUL in the path, a loop of links, EIO
        raise SpecError(display, "", f"a readable {what}", f"<{getattr(exc, 'strerror', None) or exc}>")


def load(path: Path, display: str | None = None) -> dict[str, Any]:
    """Parse a TOML file; a missing file or a syntax error is a SpecError naming the file."""
    name = display or str(path)
    return loads(read(path, name), name)


def loads(text: str, display: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(display, "", "valid TOML", f"<syntax error: {exc}>")


def describe(value: object) -> object:
    """How a wrong value is shown in an error: short, and its type when that is the problem."""
    if isinstance(value, dict):
        return "<a table>"
    if isinstance(value, list) and len(repr(value)) > 80:
        return f"<a list of {len(value)} items>"
    if isinstance(value, str) and len(value) > 80:
        return value[:77] + "..."
    return value


class Table:
    """A TOML table being validated: typed reads by key, unknown keys refused at `finish()`."""

    def __init__(self, data: object, file: str, path: str = "") -> None:
        if not isinstance(data, dict):
            raise SpecError(file, path or "<top level>", "a table", describe(data))
        self.data: dict[str, Any] = data
        self.file = file
        self.path = path
        self._read: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def error(self, name: str, expected: str, got: object) -> SpecError:
        return SpecError(self.file, self.key(name), expected, describe(got))

    def has(self, name: str) -> bool:
        return name in self.data

    def raw(self, name: str, default: Any = _MISSING) -> Any:
        self._read.add(name)
        if name not in self.data:
            if default is _MISSING:
                raise self.missing(name, "a value (this key is required)")
            return default
        return self.data[name]

    def missing(self, name: str, expected: str, got: str = "<nothing>") -> SpecError:
        """The error for a required key (or table) that is absent: its misspelling when an unread key
        is one (a typo in a required key must be named as a typo, not as a missing key)."""
        unread = [k for k in self.data if k not in self._read]
        typo = difflib.get_close_matches(name, unread, n=1, cutoff=NEAR_MISS)
        if typo:
            return UnknownKey(self.file, self.key(typo[0]), name,
                              hint=f'rename it to "{name}" ({self.key(name)} is required)')
        return SpecError(self.file, self.key(name), expected, got)

    def str(self, name: str, default: Any = _MISSING, *, check: Callable[[str], bool] | None = None,
            expected: str = "a string") -> Any:
        value = self.raw(name, default)
        if value is default and default is not _MISSING and name not in self.data:
            return value
        if not isinstance(value, str) or (check is not None and not check(value)):
            raise self.error(name, expected, value)
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: Any = _MISSING) -> Any:
        expected = "one of " + " | ".join(f'"{c}"' for c in choices)
        return self.str(name, default, check=lambda v: v in choices, expected=expected)

    def bool(self, name: str, default: Any = _MISSING) -> Any:
        value = self.raw(name, default)
        if name not in self.data:
            return value
        if not isinstance(value, bool):
            raise self.error(name, "true or false", value)
        return value

    def int(self, name: str, default: Any = _MISSING, *, minimum: int | None = None,
            expected: str | None = None) -> Any:
        value = self.raw(name, default)
        if name not in self.data:
            return value
        ok = isinstance(value, int) and not isinstance(value, bool) and (minimum is None or value >= minimum)
        if not ok:
            raise self.error(name, expected or _int_expected(minimum), value)
        return value

    def number(self, name: str, default: Any = _MISSING, *, positive: bool = False,
               minimum: float | None = None, maximum: float | None = None, expected: str | None = None) -> Any:
        value = self.raw(name, default)
        if name not in self.data:
            return value
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and (not positive or value > 0)
        ok = ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
        if not ok:
            raise self.error(name, expected or _number_expected(positive, minimum, maximum), value)
        return float(value)

    def str_list(self, name: str, default: Any = _MISSING, *, nonempty: bool = False,
                 expected: str = "a list of strings") -> Any:
        value = self.raw(name, default)
        if name not in self.data:
            return value
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (nonempty and not value):
            raise self.error(name, expected, value)
        return tuple(value)

    def int_list(self, name: str, default: Any = _MISSING, *, minimum: int = 0,
                 expected: str = "a list of non-negative integers") -> Any:
        value = self.raw(name, default)
        if name not in self.data:
            return value
        ok = isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value
        )
        if not ok or len(set(value)) != len(value):
            raise self.error(name, expected + " without repeats", value)
        return tuple(value)

    def str_map(self, name: str, default: Any = _MISSING) -> Any:
        value = self.raw(name, default)
        if name not in self.data:
            return value
        if not isinstance(value, dict):
            raise self.error(name, "a table of string values", value)
        for k, v in value.items():
            if not isinstance(v, str):
                raise SpecError(self.file, f"{self.key(name)}.{k}", "a string", describe(v))
        return dict(value)

    def table(self, name: str, required: bool = False) -> Table | None:
        self._read.add(name)
        if name not in self.data:
            if required:
                raise self.missing(name, "a table (this table is required)")
            return None
        return Table(self.data[name], self.file, self.key(name))

    def tables(self, name: str) -> Iterator[Table]:
        """An array of tables (`[[name]]`), each validated with its index in the key path."""
        self._read.add(name)
        value = self.data.get(name, [])
        if not isinstance(value, list):
            raise self.error(name, "an array of tables ([[" + self.key(name) + "]])", value)
        for i, item in enumerate(value):
            yield Table(item, self.file, f"{self.key(name)}[{i}]")

    def finish(self) -> None:
        """Refuse keys nobody read: a typo must never pass silently."""
        unknown = sorted(set(self.data) - self._read)
        if unknown:
            known = sorted(self._read)
            raise SpecError(
                self.file, self.key(unknown[0]), "a known key (" + ", ".join(known) + ")", "<unknown key>",
                hint=_close_hint(unknown[0], known),
            )


def _close_hint(name: str, known: list[str]) -> str | None:
    close = difflib.get_close_matches(name, known, n=1)
    return f"did you mean '{close[0]}'?" if close else None


def _int_expected(minimum: int | None) -> str:
    if minimum is None:
        return "an integer"
    if minimum == 0:
        return "a non-negative integer"
    if minimum == 1:
        return "a positive integer"
    return f"an integer >= {minimum}"


def _number_expected(positive: bool, minimum: float | None, maximum: float | None) -> str:
    if positive:
        return "a positive number"
    if minimum is not None and maximum is not None:
        return f"a number between {minimum:g} and {maximum:g}"
    if minimum is not None:
        return f"a number >= {minimum:g}"
    if maximum is not None:
        return f"a number <= {maximum:g}"
    return "a finite number"
