"""kind = "mlflow": records from the run's own `mlflow.log_metric(s)` calls (or HF's and Lightning's MLflow
loggers), read from the local tracking store the trainer writes, through MLflow's own store classes.

Which store: `path` is the store's file or folder, in the trainer's working directory by default
`mlflow.db` — MLflow 3's default tracking URI is `sqlite:///mlflow.db` — or a file store folder (`mlruns`,
MLflow 2's default, or wherever `MLFLOW_TRACKING_URI=file:…` points). A file is read with `SqlAlchemyStore`,
a folder with `FileStore`: the two local implementations of `AbstractStore`, the interface every MLflow
backend (and every tracking plugin) implements and the tracking server itself serves from. Its
`search_runs` and paged `get_metric_history(run_id, key, max_results, page_token)` are what is used:
the rows MLflow's UI shows, values bit-equal to what was logged (NaN kept: MLflow stores `is_nan`), each
with its step and the trainer's own timestamp (ms), so s/step is the trainer's pace.

Why these are stable to read: a store is what the MLflow UI and `mlflow server` read for every client
version; MLflow upgrades the SQLite schema only through `mlflow db upgrade` (a store whose schema is not
this MLflow's is said, with that fix), and the file store's layout has been unchanged since 1.x. The
daemon's MLflow reads the store; it should be the trainer's version.

Which runs: babysit sets `$MLFLOW_RUN_CONTEXT` for each attempt — MLflow's documented way (its
`SystemEnvironmentContext` run-context provider) to add tags to every run the process starts — to
`{"babysit.run": NAME, "babysit.attempt": "N"}` (merged into the user's own, if any); the reader reads
the runs so tagged, oldest first (each attempt starts its own). The user's tracking URI, experiment and
run names are left as they are: their MLflow UI shows the runs as before, with two more tags.

Never a write: SQLite is opened read-only (`mode=ro`), and not before the file exists (MLflow would
create it and its tables); a file store is opened once its folder exists. `mlflow` is imported only by a
run with this source (`require()` checks it first). State: per MLflow run and key, the number of points
read — the offset of the next page in MLflow's own order (timestamp, step, value), which new points of a
trainer's clock only extend.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from babysit.core.errors import BadInput
from babysit.core.spec.source import RESERVED, SourceSpec
from babysit.sources.kind import Evidence, Kind, RowsAdapter, RowsRead, sample
from babysit.sources.records import Item

ENV = "MLFLOW_RUN_CONTEXT"  # mlflow.environment_variables.MLFLOW_RUN_CONTEXT: JSON tags for every run
TAG_RUN = "babysit.run"
TAG_ATTEMPT = "babysit.attempt"
PAGE = 10_000  # points read per key per pump; the rest at the next
MAX_RUNS = 100  # tagged runs looked at (attempts of one babysit run)
SETTLED = 2.0  # s: a store last written longer ago than this, unchanged at the next read, is not queried


class MlflowMissing(BadInput):
    def __init__(self) -> None:
        super().__init__('[source] kind = "mlflow" needs the mlflow package, which is not installed',
                         hint="pip install 'babysit[mlflow]'  (MLflow's own store classes read the tracking store; "
                              "the version the trainer uses is best)")


def require() -> None:
    import importlib.util

    try:
        found = importlib.util.find_spec("mlflow") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MlflowMissing()


def run_context(run: str, attempt: int, user: str | None) -> str:
    """`$MLFLOW_RUN_CONTEXT` for an attempt: babysit's two tags over the user's own (a JSON object)."""
    import json

    tags: dict[str, Any] = {}
    if user:
        try:
            got = json.loads(user)
        except ValueError:
            got = None
        if isinstance(got, dict):
            tags.update(got)
    tags.update({TAG_RUN: run, TAG_ATTEMPT: str(attempt)})
    return json.dumps(tags)


class MlflowReader:
    """One run's view of its store; the store object is made once the store exists and kept."""

    def __init__(self, source: SourceSpec, run: str) -> None:
        assert source.path is not None
        self.source = source
        self.path = Path(source.path)
        self.run = run
        self._store: Any = None

    def _open(self) -> Any:
        """MLflow's store for `path`, read-only; None while the trainer has not made it."""
        if self._store is not None:
            return self._store
        if self.path.is_dir():
            from mlflow.store.tracking.file_store import FileStore

            self._store = FileStore(str(self.path.resolve()))
        elif self.path.is_file() and self.path.stat().st_size > 0:
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            # `mode=ro`: SQLite refuses every write (MLflow's table creation too). The path's slashes are
            # %-escaped, which SQLite decodes, so MLflow's mkdir of the URI's "parent" makes nothing.
            quoted = urllib.parse.quote(str(self.path.resolve()), safe="")
            self._store = SqlAlchemyStore(f"sqlite:///file:{quoted}?mode=ro&uri=true", str(self.path.parent))
        return self._store

    def read(self, state: Mapping[str, Any]) -> RowsRead:
        """Every point logged since the last read, of every run tagged with this babysit run (its lines: the
        metric points read)."""
        offsets: dict[str, dict[str, int]] = {rid: dict(keys) for rid, keys in state.get("offsets", {}).items()}
        files = self._files()
        sig = _signature(files)
        stat_at = time.time()
        if sig is not None and state.get("sig") == list(sig) and not state.get("more"):
            # the SQLite file and its journal as they were at the last read, last written over a second
            # before it: nothing was committed since (an idle read costs two stats, not ~15 ms of queries)
            return RowsRead((), 0, (), None, dict(state), files, False)
        try:
            store = self._open()
            if store is None:
                return RowsRead((), 0, (), None, {"offsets": offsets}, files, False)
            got = self._read(store, offsets, files)
            settled = sig is not None and stat_at - sig[-1] > SETTLED
            return dataclasses.replace(got, state={**got.state, "sig": list(sig) if settled else None,
                                                   "more": got.more})
        except Exception as exc:  # MlflowException, sqlalchemy's errors: said, read again at the next pump
            self._store = None
            text = " ".join(str(exc).split())[:700]  # MLflow says its way out last (e.g. MLFLOW_ALLOW_FILE_STORE)
            return RowsRead((), 0, (f"{self.path}: {type(exc).__name__}: {text}",), None, {"offsets": offsets},
                            files, False)

    def _read(self, store: Any, offsets: dict[str, dict[str, int]], files: tuple[Path, ...]) -> RowsRead:
        from mlflow.entities import ViewType
        from mlflow.utils.search_utils import SearchUtils

        _quiet()
        experiments = [e.experiment_id for e in store.search_experiments(view_type=ViewType.ALL)]
        runs = store.search_runs(experiments, f"tags.`{TAG_RUN}` = '{self.run}'", ViewType.ALL,
                                 max_results=MAX_RUNS, order_by=["attributes.start_time ASC"])
        items: list[Item] = []
        points = 0
        more = False
        sample = None
        for run in runs:
            rid = run.info.run_id
            done = offsets.setdefault(rid, {})
            at_step: dict[int, dict[str, float]] = {}
            stamps: dict[int, float] = {}
            for key in sorted(run.data.metrics):
                start = done.get(key, 0)
                token = SearchUtils.create_page_token(start) if start else None
                page = store.get_metric_history(rid, key, max_results=PAGE, page_token=token)
                done[key] = start + len(page)
                more = more or page.token is not None
                points += len(page)
                name = self.source.rename(key)
                if name in RESERVED:
                    sample = sample or f"a metric named {key!r} (babysit's own key: rename it in [source.metrics])"
                    continue
                for m in page:
                    step = int(m.step) + self.source.step_offset
                    at_step.setdefault(step, {})[name] = float(m.value)
                    ts = m.timestamp / 1000.0
                    if math.isfinite(ts):
                        stamps[step] = max(stamps.get(step, ts), ts)
            items += [Item(step, at_step[step], stamps.get(step)) for step in sorted(at_step)]
        return RowsRead(tuple(items), points, (), sample, {"offsets": offsets}, files, more)

    def _files(self) -> tuple[Path, ...]:
        """The files that grow as the trainer logs: the SQLite file and its journal, or (file store) none
        listed here (its metric files are many and found by the reads)."""
        if self.path.is_dir():
            return ()
        return (self.path, self.path.with_name(self.path.name + "-journal"),
                self.path.with_name(self.path.name + "-wal"))


def _signature(files: tuple[Path, ...]) -> tuple[int, ...] | None:
    """(size, mtime in ns) of the SQLite file and of its journals (0, 0 when absent), then the newest
    mtime in seconds; None for a file store (its many metric files are not stat-ed)."""
    if not files:
        return None
    out: list[int] = []
    newest = 0.0
    for path in files:
        try:
            st = path.stat()
        except OSError:
            out += [0, 0]
            continue
        out += [st.st_size, st.st_mtime_ns]
        newest = max(newest, st.st_mtime)
    return (*out, int(newest))


def _quiet() -> None:
    """MLflow's store logs INFO lines (alembic's too) on the daemon's root logger: warnings only."""
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


class MlflowKind(Kind):
    name = "mlflow"
    reads = "rows"

    def reader(self, source: SourceSpec, run_dir: Path, run: str) -> RowsAdapter:
        return RowsAdapter(MlflowReader(source, run))  # one a run: the store kept open

    def require(self) -> None:
        require()

    def attempt_env(self, source: SourceSpec, run: str, attempt: int, env: Mapping[str, str],
                    user_env: Mapping[str, str]) -> dict[str, str]:
        """MLflow tags every run the attempt starts (`run_context`): the reader finds them by it."""
        return {ENV: run_context(run, attempt, env.get(ENV))}

    def unreadable(self, source: SourceSpec, evidence: Evidence, log: Path) -> str:
        return (f"{source.path}: {evidence.lines_seen or 0} MLflow metric points read, 0 records."
                + sample(evidence, "Skipped")
                + " Check that source.path is the tracking store the trainer logs to (MLflow 3's default: mlflow.db "
                "in its working directory; a file store: its mlruns folder) and that the trainer starts its runs "
                "with mlflow.start_run() (babysit finds them by the tag babysit.run it sets in $MLFLOW_RUN_CONTEXT).")


KIND = MlflowKind()
