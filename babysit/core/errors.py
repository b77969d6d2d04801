"""Typed errors. The type decides the exit code and whether a failure is worth retrying.

Every error a user can cause names the file, the key path and what was expected, and ends with
what to do next, so `babysit` never answers bad input with a traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_RUN_FAILURE = 1  # a run-level failure the user must see (fixture mismatch, run failed, refused launch)
EXIT_BAD_INPUT = 2  # bad input: a spec, an amendment, a registry, a command line


def short_error(exc: BaseException) -> str:
    """`Type: message`, cut short: an error as an incident or a message says it (the traceback goes to a log)."""
    return f"{type(exc).__name__}: {exc}"[:300]


class BabysitError(Exception):
    """Base of every error babysit raises on purpose; `hint` tells the user what to do next."""

    exit_code = EXIT_RUN_FAILURE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class BadInput(BabysitError):
    """Input the user wrote is wrong; nothing was changed."""

    exit_code = EXIT_BAD_INPUT


class SpecError(BadInput):
    """A field of a TOML file is wrong: `FILE: key.path: expected …, got …`."""

    def __init__(self, file: str, key: str, expected: str, got: object, hint: str | None = None) -> None:
        self.file = file
        self.key = key
        self.expected = expected
        self.got = got
        where = f"{file}: {key}" if key else file
        got_text = got if isinstance(got, str) and got.startswith("<") else repr(got)
        super().__init__(f"{where}: expected {expected}, got {got_text}", hint)


class UnknownKey(SpecError):
    """A key nobody reads beside a required key it misspells: the typo is the error to show, not the
    missing key (`run.toml: run.commnd: unknown key — did you mean "command"?`)."""

    def __init__(self, file: str, key: str, meant: str, hint: str | None = None) -> None:
        self.file, self.key, self.expected, self.got = file, key, f'"{meant}"', "<unknown key>"
        BadInput.__init__(self, f'{file}: {key}: unknown key — did you mean "{meant}"?', hint)


class RegistryError(BadInput):
    """babysit.toml is unreadable, or a registration conflicts with what it holds."""


class UnknownRun(BadInput):
    """A run name that is not registered; the message lists close names."""


class PreregTampered(BabysitError):
    """The [prereg] table no longer hashes to what `register` froze."""


class FixtureMismatch(BabysitError):
    """The verdict instrument did not reproduce the fixture's expected delta or label."""


class LaunchRefused(BabysitError):
    """A guard refused to launch (e.g. a foreign process holds the run's GPU)."""


class DaemonAlreadyRunning(BabysitError):
    """Another `babysit up` holds this state directory."""


class StateError(BabysitError):
    """The state database is from a newer babysit, or cannot be written (disk full, permissions)."""


class TransientDeliveryError(Exception):
    """A channel could not deliver now (network, 5xx, 429); the outbox retries it later.

    `retry_after` is the delay the server asked for, in seconds, when it said one.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentDeliveryError(Exception):
    """A channel refused a message for good (bad token, unknown channel); retrying cannot help."""
