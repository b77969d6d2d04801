"""Settings for the whole test session: hypothesis profiles, and what several pytest-xdist workers share.

The README's test command runs under pytest-xdist (`-n 3`): each worker is its own process with its own
`tmp_path_factory` base directory. `shared_dir` is the one directory all workers of a session see, and
`once_per_session` builds an expensive artefact there once, under a file lock, whichever worker asks
first (without xdist both are simply the session's own).

Hypothesis: the `dev` profile (the default) keeps property tests quick and the same on every run
(derandomized: a newcomer's run is green or red for the code, not for the draw); CI loads `ci`
(`BABYSIT_HYPOTHESIS_PROFILE=ci`, set by `.ci/run`) for many more examples, freshly drawn each run, so
the search for new failures goes on there. Neither has a deadline: a shared, loaded CPU makes
per-example time limits flaky, and no test asserts speed through them.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock
from hypothesis import settings

# torch's OpenMP threads spin while they wait for work. With more trainer processes than cores (xdist
# workers, DDP ranks, daemons' runs side by side) the spinning eats the CPU the others need: three tiny
# trainers on 2 cores took 100 s each instead of 20 s. Idle threads that sleep change no result, only
# the waiting. Every subprocess a test starts (daemons, shims, trainers, torchrun) inherits this.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# ...and one intra-op thread each: the test models are so small that a second thread halves nothing and
# costs the shared cores its hand-offs (a 1,000-step tiny run: 9 CPU-s with one thread, 16-27 with two,
# the same wall time). The reference trainer honours OMP_NUM_THREADS, as torch programs do.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Bytecode is cached as Python and pytest normally do, even where PYTHONDONTWRITEBYTECODE is set (some
# containers, this one included). Without the cache every xdist worker rewrote all the test files at
# collection (10 CPU-s a worker), and every daemon, shim and CLI process a test starts compiled
# babysit's modules again (0.2 CPU-s each, hundreds of processes).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# pytest started as a background job of a script (`cmd &`, nohup, some CI runners) begins with SIGINT
# ignored, and every process a test starts would inherit that: tests that stop a trainer or a watcher
# with SIGINT / Ctrl-C then fail. A handler (not SIG_IGN) is reset to the default in children.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

settings.register_profile("dev", max_examples=40, deadline=None, derandomize=True)
settings.register_profile("ci", max_examples=250, deadline=None)
settings.load_profile(os.environ.get("BABYSIT_HYPOTHESIS_PROFILE", "dev"))


_TERMINAL_VARS = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: tell each worker the terminal variables this session really started with. GNU
    readline (imported by pytest) exports COLUMNS=80 LINES=24 into the C environment the workers inherit,
    and every `{**os.environ}` a test hands a subprocess would then pin rich's width at 80 columns."""
    node.workerinput["babysit_terminal_env"] = {k: os.environ.get(k) for k in _TERMINAL_VARS}


def pytest_configure(config: pytest.Config) -> None:
    started_with = getattr(config, "workerinput", {}).get("babysit_terminal_env")
    if started_with is not None:  # an xdist worker: the controller's own values, or none
        for key, value in started_with.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def missing(*packages: str) -> bool:
    """Whether any of the packages is not installed, found without importing it."""
    return any(find_spec(p) is None for p in packages)


class Lazy:
    """A module imported at its first attribute: every xdist worker collects every test file, and
    importing transformers, accelerate and lightning (torch with them) at collection cost each worker
    ~6 CPU-s, most of them for tests another worker runs."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):  # pytest's collection probes every module global (__test__, fixture marks)
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)


# The test files that start real trainers and daemons (each tens of seconds on 2 shared cores), in
# about their order of cost. They run first: a long test drawn last keeps the other workers idle while it
# finishes (longest first evens the finish). It takes `--dist worksteal` (pyproject's addopts): under
# `load` the first quarter of the tests is dealt round-robin up front, so one worker could hold most of
# the long ones while the others sat idle (465 s).
LONG_FIRST = ("tests/reliability/test_crash_campaign.py", "tests/trainer/test_stop_and_resume.py",
              "tests/trainer/test_gradient_equivalence.py", "tests/test_smoke.py", "tests/scenarios/",
              "tests/slurm/", "tests/reliability/", "tests/trainer/", "tests/web/", "tests/integrations/",
              "tests/slack/", "tests/campaign/", "tests/fleet/")


@pytest.hookimpl(trylast=True)  # after `-m` deselected: only the tests this session runs count
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first: the files holding a slow test this session runs (.ci/run's one session of the fast
    and the slow ones), whole, so a module fixture is still built once; then LONG_FIRST's files, then the
    rest. Under xdist the long files are dealt to the workers' heads (`deal`)."""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> tuple[bool, int]:
        path = item.nodeid.split("::")[0]
        return (path not in slow,
                next((i for i, prefix in enumerate(LONG_FIRST) if path.startswith(prefix)), len(LONG_FIRST)))

    items.sort(key=rank)  # stable: a file's own order (and its module fixtures' reuse) is kept
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # the same on every worker: one order
    if workers > 1:
        items[:] = deal(items, workers, long=lambda item: rank(item) < (True, len(LONG_FIRST)))


def deal(items: list[pytest.Item], workers: int, long: Callable[[pytest.Item], bool]) -> list[pytest.Item]:
    """The order that starts every worker on long files. `--dist worksteal` first hands worker i the i-th
    of `workers` contiguous blocks of the collection, and a worker that runs dry steals from the END of
    the longest queue: with the long files all at the front, one worker ran every one of them, one after
    the other, and finished last (measured 2026-12-02: 1,864 s of tests against 1,707-1,750 s on the
    two others, its last five minutes three paced framework runs, mostly waiting). Here each
    block starts with every `workers`-th long file, in rank order (whole files), and is filled up with the
    rest; if a block's long files would not fit in it, the order is left as it was."""
    files: dict[str, list[pytest.Item]] = {}
    rest: list[pytest.Item] = []
    for item in items:
        if long(item):
            files.setdefault(item.nodeid.split("::")[0], []).append(item)
        else:
            rest.append(item)
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for i, group in enumerate(files.values()):
        heads[i % workers].extend(group)
    sizes, left = [], len(items)
    for i in range(workers):  # xdist's own split (WorkStealingScheduling.check_schedule)
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    if any(len(head) > size for head, size in zip(heads, sizes, strict=True)):
        return items
    dealt: list[pytest.Item] = []
    for head, size in zip(heads, sizes, strict=True):
        fill = size - len(head)
        dealt += head + rest[:fill]
        rest = rest[fill:]
    return dealt


def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """`name` under the directory every xdist worker of this session shares (created if missing)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # .../pytest-N/popen-gwK -> .../pytest-N, one per session
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session", autouse=True)
def _trainer_cache_of_this_session(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Trainers the tests start (through daemons too) cache their generated demos in this session's
    shared directory, not in the user's ~/.cache (unless BABYSIT_TRAINER_CACHE says where)."""
    os.environ.setdefault("BABYSIT_TRAINER_CACHE", str(shared_dir(tmp_path_factory, "trainer-cache")))


def once_per_session(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[], Any]) -> Any:
    """`build()`'s JSON-able result, computed by the first worker that asks and read back by the others.
    A build that raises caches nothing: the next worker tries again (and fails the same way)."""
    cached = shared_dir(tmp_path_factory, "once") / f"{name}.json"
    with FileLock(str(cached) + ".lock"):
        if cached.exists():
            return json.loads(cached.read_text())
        value = build()
        cached.write_text(json.dumps(value))
        return value


def _worker_server(tmp_path_factory: pytest.TempPathFactory, *, tcp: bool = False) -> Iterator[Any]:
    """A server of this worker's on a copy of the session's cluster (tests/postgres.py), stopped and removed
    at the session's end; skips where the binaries are missing."""
    from tests import postgres as pg

    pg.require()
    cluster = once_per_session(tmp_path_factory, "pg-cluster",
                               lambda: pg.make_cluster(shared_dir(tmp_path_factory, "pg")))
    server = pg.start_worker_server(Path(cluster), tcp=tcp)
    try:
        yield server
    finally:
        server.stop(mode="immediate")
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """This worker's PostgreSQL server, on its Unix socket."""
    yield from _worker_server(tmp_path_factory)


@pytest.fixture(scope="session")
def postgres_tcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """This worker's second server, reached over TCP at 127.0.0.1 (as a fleet's boxes reach theirs); started
    only for the tests that ask for it."""
    yield from _worker_server(tmp_path_factory, tcp=True)


@pytest.fixture
def pg_url(postgres: Any) -> str:
    """A fresh database at the current schema, this test's alone."""
    from tests import postgres as pg

    return pg.fresh_database(postgres)

