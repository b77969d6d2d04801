"""babysit.toml, the registry (docs/spec.md, babysit.toml): which runs are declared, and daemon-wide settings.

Runtime state lives in SQLite; this file holds only what a human declared, so it stays short,
readable and diff-able. `update` is its only writer: under an exclusive lock it re-reads, applies a
pure change, and replaces the file atomically, so concurrent `babysit register` calls lose nothing
and a writer killed at any instant leaves the old file or the new one, never a torn one.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import tomli_w

from babysit.core.errors import RegistryError, SpecError, UnknownRun
from babysit.core.spec import tomlfile
from babysit.runtime.atomic import temp_prefix, write_atomic
from babysit.runtime.faults import crash_point

T = TypeVar("T")

DEFAULT_FILE = "babysit.toml"
ENV_VAR = "BABYSIT_REGISTRY"
KNOWN_SHOWN = 12  # an unknown run name lists this many of the registered ones
RUN_NAME = re.compile(r"[a-z0-9_.-]{1,64}")
SLACK_USER_ID = re.compile(r"[UW][A-Z0-9]{2,}")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
HEADER = "# babysit registry: `babysit register` writes [[runs]]; [daemon] may be edited by hand.\n" \
         "# Rewritten on every registration: comments below this header are not kept.\n\n"

# Test seam: called with the temp file's path after it is written and fsynced, before os.replace.
_before_replace: Callable[[Path], None] | None = None


@dataclass(frozen=True)
class DaemonSettings:
    state_dir: str = ".babysit"  # relative to the registry file's directory when relative
    channel: str | None = None  # default Slack channel; None: a run without [notify].channel has none
    abort_allow_list: tuple[str, ...] = ()  # Slack user IDs allowed to /babysit abort
    guard_interval_seconds: float = 30.0  # the live foreign-process / GPU-hours-cap check interval
    gpu_sample_seconds: float = 2.0  # GPU utilization sampled this often while a run with GPUs is active


@dataclass(frozen=True)
class StoreSettings:
    url: str | None = None  # postgresql://… for a fleet (docs/fleet.md); None: SQLite in the state directory
    # how long PostgreSQL may take to answer one statement before babysit shuts the connection and treats the
    # database as down (docs/fleet.md, "The database frozen"): the daemon's and the commands' statements...
    deadline_seconds: float = 15.0
    # ...and a reader's (`status`, the web page, the bot's status), which then shows the box's mirror
    read_deadline_seconds: float = 3.0


@dataclass(frozen=True)
class HostSettings:
    name: str | None = None  # this box's name in a fleet; None: $BABYSIT_HOST, else the hostname
    lease_seconds: float = 30.0  # a box silent this long is lost: the others alert (docs/fleet.md)


@dataclass(frozen=True)
class RunEntry:
    name: str
    spec: str  # as written: relative to the registry file's directory, or absolute
    registered_at: str  # UTC, "YYYY-MM-DDTHH:MM:SSZ": when the experiment (its prereg) was frozen
    prereg_sha256: str | None = None  # None: the run has no [prereg]


@dataclass(frozen=True)
class Registry:
    path: Path  # absolute path of babysit.toml (which need not exist yet)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    runs: tuple[RunEntry, ...] = ()
    store: StoreSettings = field(default_factory=StoreSettings)
    host: HostSettings = field(default_factory=HostSettings)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.runs)

    @property
    def state_dir(self) -> Path:
        return _under(self.path.parent, self.daemon.state_dir)

    def find(self, name: str) -> RunEntry | None:
        return next((r for r in self.runs if r.name == name), None)

    def get(self, name: str) -> RunEntry:
        entry = self.find(name)
        if entry is not None:
            return entry
        close = difflib.get_close_matches(name, self.names, n=3, cutoff=0.6)
        message = f"no run named '{name}' in {self.path}"
        if close:
            message += " (did you mean " + ", ".join(f"'{c}'" for c in close) + "?)"
        elif not self.runs:
            message += " (no runs are registered there)"
        if self.runs:
            shown = ", ".join(self.names[:KNOWN_SHOWN])
            more = len(self.runs) - KNOWN_SHOWN
            message += f"; registered: {shown}" + (f" and {more} more (`babysit status` lists all)" if more > 0 else "")
        raise UnknownRun(message, hint="register it first: `babysit register RUN.toml` (or pass --registry PATH)")

    def spec_path(self, entry: RunEntry) -> Path:
        return _under(self.path.parent, entry.spec)

    def spec_ref(self, spec_file: Path) -> str:
        """How a spec path is stored: relative to the registry's directory when it lies under it (so the
        project can move), else absolute."""
        absolute = Path(os.path.abspath(spec_file))
        try:
            return absolute.relative_to(self.path.parent).as_posix()
        except ValueError:
            return str(absolute)


def utc_timestamp(when: datetime) -> str:
    """The registered_at format: UTC to the second, ISO 8601 with a Z."""
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def resolve_registry_path(arg: str | None, environ: Mapping[str, str] | None = None) -> Path:
    """--registry, else $BABYSIT_REGISTRY (when non-empty), else ./babysit.toml."""
    if arg:
        return Path(arg)
    env = (os.environ if environ is None else environ).get(ENV_VAR)
    return Path(env) if env else Path(DEFAULT_FILE)


def load(path: Path) -> Registry:
    """Read and validate babysit.toml; a missing file is an empty registry with default settings."""
    path = Path(path)
    display = str(path)
    absolute = Path(os.path.abspath(path))
    if not path.exists() and not path.is_symlink():
        return Registry(absolute)
    top = tomlfile.Table(tomlfile.load(path, display), display)
    daemon = _daemon(top.table("daemon"))
    store = _store(top.table("store"))
    host = _host(top.table("host"))
    runs: list[RunEntry] = []
    seen: dict[str, int] = {}
    for i, t in enumerate(top.tables("runs")):
        entry = _run(t)
        if entry.name in seen:
            raise SpecError(display, t.key("name"), f"a name not used by runs[{seen[entry.name]}]", entry.name,
                            hint="each run needs its own name; remove or rename one of the two entries")
        seen[entry.name] = i
        runs.append(entry)
    top.finish()
    return Registry(absolute, daemon, tuple(runs), store, host)


def with_run(registry: Registry, entry: RunEntry) -> tuple[Registry, str]:
    """Add or update a run entry; pure. Returns the new registry and "added" | "unchanged" | "updated".

    Same name and same prereg hash is the same experiment: re-registering it is idempotent and keeps
    the ORIGINAL registered_at (the time the prereg was frozen), also when the spec moved ("updated").
    A different prereg hash (including none vs some) under the same name is a different experiment
    and is refused: its evidence must not be mixed with the old one's.
    """
    _check_entry(entry)
    old = registry.find(entry.name)
    if old is None:
        return replace(registry, runs=(*registry.runs, entry)), "added"
    if old.prereg_sha256 != entry.prereg_sha256:
        raise RegistryError(
            f"run '{entry.name}' is already registered with {_prereg_text(old.prereg_sha256)} "
            f"(registered_at {old.registered_at}); this spec has {_prereg_text(entry.prereg_sha256)}: "
            "a different experiment needs a different name",
            hint=f"give [run].name a new name (e.g. '{entry.name}_v2'), or restore the original [prereg]",
        )
    if registry.spec_path(old) == registry.spec_path(entry):
        return registry, "unchanged"
    kept = replace(entry, registered_at=old.registered_at)
    runs = tuple(kept if r.name == entry.name else r for r in registry.runs)
    return replace(registry, runs=runs), "updated"


def update(path: Path, change: Callable[[Registry], tuple[Registry, T]]) -> T:
    """The only writer: lock, re-load, apply `change`, write atomically when it changed something.

    If `change` raises, nothing is written. Stale temp files left by killed writers are removed here,
    under the lock, where no other writer can be mid-write.
    """
    path = Path(os.path.realpath(path))  # write through a symlinked registry, never over the link
    lock_path = path.with_name(path.name + ".lock")
    try:
        lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise RegistryError(f"cannot open the registry lock {lock_path}: {exc.strerror}",
                            hint="check that the registry's directory exists and is writable")
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        _remove_stale_temps(path)
        current = load(path)
        new, result = change(current)
        if new != current:
            _write(path, new)
        return result
    finally:
        os.close(lock_fd)  # releases the flock


def dumps(registry: Registry) -> str:
    """The file's text: [daemon] first, then [[runs]] in registration order, keys in a fixed order."""
    d = registry.daemon
    daemon: dict[str, Any] = {"state_dir": d.state_dir}
    if d.channel is not None:
        daemon["channel"] = d.channel
    daemon["abort_allow_list"] = list(d.abort_allow_list)
    interval = d.guard_interval_seconds
    daemon["guard_interval_seconds"] = int(interval) if float(interval).is_integer() else interval
    if d.gpu_sample_seconds != DaemonSettings.gpu_sample_seconds:
        sample = d.gpu_sample_seconds
        daemon["gpu_sample_seconds"] = int(sample) if float(sample).is_integer() else sample
    doc: dict[str, Any] = {"daemon": daemon}
    if registry.store != StoreSettings():
        store: dict[str, Any] = {} if registry.store.url is None else {"url": registry.store.url}
        for key in ("deadline_seconds", "read_deadline_seconds"):
            value = getattr(registry.store, key)
            if value != getattr(StoreSettings, key):
                store[key] = int(value) if float(value).is_integer() else value
        doc["store"] = store
    if registry.host != HostSettings():
        host: dict[str, Any] = {} if registry.host.name is None else {"name": registry.host.name}
        if registry.host.lease_seconds != HostSettings.lease_seconds:
            host["lease_seconds"] = registry.host.lease_seconds
        doc["host"] = host
    if registry.runs:
        doc["runs"] = [_run_dict(r) for r in registry.runs]
    return HEADER + tomli_w.dumps(doc)


# --- internals ---------------------------------------------------------------------------------


def _usable_path(ref: str) -> bool:
    """A name over NAME_MAX or a path over PATH_MAX fails every file call (ENAMETOOLONG), a NUL every
    call, `~nosuchuser` the expansion: refused when the registry is read, by field, not met later as a
    traceback."""
    raw = os.fsencode(ref)
    if b"\0" in raw or len(raw) >= 4096 or any(len(part) > 255 for part in raw.split(b"/")):
        return False
    try:
        Path(ref).expanduser()
    except RuntimeError:  # "Could not determine home directory"
        return False
    return True


def _under(base: Path, ref: str) -> Path:
    return Path(os.path.normpath(base / Path(ref).expanduser()))


def _prereg_text(sha: str | None) -> str:
    return f"prereg sha256 {sha[:12]}…" if sha else "no [prereg]"


def _daemon(t: tomlfile.Table | None) -> DaemonSettings:
    if t is None:
        return DaemonSettings()
    defaults = DaemonSettings()
    settings = DaemonSettings(
        state_dir=t.str("state_dir", defaults.state_dir, check=bool, expected="a non-empty path"),
        channel=t.str("channel", None, check=bool, expected="a non-empty Slack channel (e.g. \"#ml-runs\")"),
        abort_allow_list=t.str_list(
            "abort_allow_list", (),
            expected="a list of Slack user IDs (e.g. \"U024BE7LH\")",
        ),
        guard_interval_seconds=t.number("guard_interval_seconds", defaults.guard_interval_seconds, positive=True),
        gpu_sample_seconds=t.number("gpu_sample_seconds", defaults.gpu_sample_seconds, positive=True),
    )
    if not _usable_path(settings.state_dir):
        raise SpecError(t.file, t.key("state_dir"), "a path the OS can open (names of at most 255 bytes, "
                        "a ~user that exists)",
                        settings.state_dir)
    for i, uid in enumerate(settings.abort_allow_list):
        if not SLACK_USER_ID.fullmatch(uid):
            raise SpecError(t.file, f"{t.key('abort_allow_list')}[{i}]", "a Slack user ID like \"U024BE7LH\"", uid,
                            hint="find it in Slack: profile → ⋮ → Copy member ID")
    t.finish()
    return settings


def _store(t: tomlfile.Table | None) -> StoreSettings:
    if t is None:
        return StoreSettings()
    url = t.str("url", None, check=lambda v: v.startswith(("postgresql://", "postgres://")),
                expected='a PostgreSQL url like "postgresql://babysit@db.lab/babysit" (docs/fleet.md)')
    deadline = t.number("deadline_seconds", StoreSettings.deadline_seconds, positive=True)
    read_deadline = t.number("read_deadline_seconds", StoreSettings.read_deadline_seconds, positive=True)
    t.finish()
    return StoreSettings(url, deadline, read_deadline)


def _host(t: tomlfile.Table | None) -> HostSettings:
    if t is None:
        return HostSettings()
    name = t.str("name", None, check=re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}").fullmatch,
                 expected="a host name of letters, digits, '.', '_' or '-' (at most 63)")
    lease = t.number("lease_seconds", HostSettings.lease_seconds, positive=True)
    t.finish()
    return HostSettings(name, lease)


def _run(t: tomlfile.Table) -> RunEntry:
    entry = RunEntry(
        name=t.str("name", check=RUN_NAME.fullmatch, expected="a run name matching [a-z0-9_.-]{1,64}"),
        spec=t.str("spec", check=lambda v: bool(v) and _usable_path(v),
                   expected="a non-empty path to the run's TOML"),
        registered_at=t.str("registered_at", check=_valid_timestamp,
                            expected='a UTC time string like "2026-08-17T18:41:02Z"'),
        prereg_sha256=t.str("prereg_sha256", None, check=SHA256_HEX.fullmatch,
                            expected="64 lowercase hex digits (a sha256)"),
    )
    t.finish()
    return entry


def _valid_timestamp(text: str) -> bool:
    if not TIMESTAMP.fullmatch(text):
        return False
    try:
        datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return False
    return True


def _check_entry(entry: RunEntry) -> None:
    """A new entry must be as valid as a loaded one: a bad value must never reach the file."""
    problems = [
        ("name", RUN_NAME.fullmatch(entry.name), "a run name matching [a-z0-9_.-]{1,64}", entry.name),
        ("spec", bool(entry.spec), "a non-empty path", entry.spec),
        ("registered_at", _valid_timestamp(entry.registered_at), 'a UTC time like "2026-08-17T18:41:02Z"',
         entry.registered_at),
        ("prereg_sha256", entry.prereg_sha256 is None or SHA256_HEX.fullmatch(entry.prereg_sha256),
         "64 lowercase hex digits or none", entry.prereg_sha256),
    ]
    for key, ok, expected, got in problems:
        if not ok:
            raise RegistryError(f"cannot register run '{entry.name}': {key}: expected {expected}, got {got!r}")


def _run_dict(r: RunEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"name": r.name, "spec": r.spec}
    if r.prereg_sha256 is not None:
        out["prereg_sha256"] = r.prereg_sha256
    out["registered_at"] = r.registered_at
    return out


def _remove_stale_temps(path: Path) -> None:
    prefix = temp_prefix(path)
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(path.parent):
            if entry.name.startswith(prefix) and entry.name.endswith(".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def _write(path: Path, registry: Registry) -> None:
    """Temp file in the same directory, fsync, rename over, fsync the directory."""
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644

    def before_replace(tmp: Path) -> None:
        crash_point("registry-before-replace")
        if _before_replace is not None:
            _before_replace(tmp)

    write_atomic(path, dumps(registry), mode=mode, before_replace=before_replace)
