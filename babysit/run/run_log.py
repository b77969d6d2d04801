"""One run's log as the daemon reads it: the reader (babysit/run/log_chunks.py: the source pumped, the record
log read in chunks) and the state its records fill — step points, recent records, the latest evals and
shown metrics, the declared end step, a non-finite watched metric, when output and records were last
seen. The guards and polls observe this state (babysit/run/run_observe.py); the supervisor owns one.

Why an object of its own: the reading is done by whichever thread asks (the reader thread, a guard, an
exit's drain), under the reader's lock, and applied under the run's lock only when that is free; the
state it fills is read by the observation. Both belong together, apart from the run's life cycle.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from babysit import sources
from babysit.core import progress, snapshot
from babysit.core.reading import nonfinite
from babysit.core.reading.log_records import LogRecord, ProgressPoint
from babysit.core.spec.run_toml import RunSpec
from babysit.core.status import AttemptStatus
from babysit.db.store import Attempt
from babysit.run.context import RunHost
from babysit.run.log_chunks import CHUNK_BYTES, SMALL_CHUNK_BYTES, Chunk, ReadInterrupted, RunReader
from babysit.run.log_telling import LogTeller
from babysit.sources import logtail
from babysit.sources.records import ColumnSegment, RecordBatch

DATA_WAIT_METRICS = ("data_wait_frac",)  # a trainer's input-wait share of step time (the reference trainer logs it)
READ_BUDGET_SECONDS = 0.05  # a guard's or a tick's read of one run at most (real seconds); the reader thread reads on


class _NameRole(NamedTuple):
    """What a metric's name says, the same all run long: polls show it, it is an eval, it declares the end."""

    shown: bool
    eval: bool
    end: bool
    wait: bool  # the trainer's input-wait share (DATA_WAIT_METRICS)


class RunLog:
    """The run's reader and the read state. `read_log`, `is_running`, `failed` and `run` are what the
    daemon's reader thread (`log_chunks.ReadWorker`) asks of what it reads."""

    def __init__(self, host: RunHost, facts: dict[str, Any], check_guards: Callable[[], None]) -> None:
        self.host, self.ctx, self.run = host, host.ctx, host.run
        self.check_guards = check_guards  # the run's live check, at once after a non-finite value
        self.reader = RunReader(host.spec, host.ctx.state_dir, facts)  # the source, the record log, in chunks
        self.records_log: Path = self.reader.records_log
        self.points: deque[ProgressPoint] = deque(maxlen=256)
        self.recent: deque[LogRecord] = deque(maxlen=16)
        self.waits_logged = False  # a record of this attempt carried a DATA_WAIT_METRICS value (else: none to average)
        self.last_record_wall: float | None = None
        self.latest_eval: dict[str, float] | None = None
        self.latest_eval_step: int | None = None
        self.latest_shown: dict[str, tuple[int, float]] = {}  # metric -> (step, value) for polls ([poll].show)
        self._names: dict[str, _NameRole] = {}  # metric -> what its name says (shown, an eval, an end key)
        self._names_for: tuple[object, str | None] | None = None  # the ([poll].show, prereg metric) it is for
        self.declared_end: int | None = None  # the newest record's total_steps / max_steps
        self._argv_steps: tuple[tuple[str, ...], int | None] | None = None  # (an attempt's argv, its --steps)
        self.nonfinite: tuple[int, str, float] | None = None  # a watched metric went NaN/inf this attempt
        self.nonfinite_pending: frozenset[str] = frozenset()  # grad norms non-finite once (core/reading/nonfinite)
        self.eval_unread = False  # a record of the prereg metric applied, the verdict not read since
        self.last_output_wall: float | None = None
        self.first_output_wall: float | None = None  # this attempt's first output seen (by this daemon)
        self.teller = LogTeller(self, facts)  # what the reading found, said once each

    @property
    def spec(self) -> RunSpec:
        return self.host.spec  # the attempt's (a quarantined GPU may be swapped out): read it each time

    @property
    def tail(self) -> logtail.TailState:
        return self.reader.tail

    @property
    def pump(self) -> sources.SourcePump:
        return self.reader.pump

    @property
    def pumped(self) -> sources.PumpResult | None:
        return self.reader.pumped

    def is_running(self) -> bool:
        return self.host.is_running()

    def failed(self, where: str, exc: BaseException) -> None:
        self.host.failed(where, exc)

    def new_attempt(self, now: float) -> None:
        """A new attempt's reading is its own: the last one's pace, records and divergence say nothing of it."""
        self.nonfinite = None
        self.nonfinite_pending = frozenset()
        self.points.clear()
        self.recent.clear()
        self.waits_logged = False
        self.latest_shown.clear()
        self.last_record_wall = now
        self.first_output_wall = None
        self.teller.new_attempt()

    # -- reading ----------------------------------------------------------------------------------------
    def read_log(self, *, budget: float = READ_BUDGET_SECONDS, drain: bool = False, wait: bool = True,
                 chunk: int | None = None, final: bool = False) -> int:
        """Read the source and the record log on, chunk by chunk; returns the records applied. `drain`:
        to the end of what is written (an exit: the last lines belong to its classification and the
        verdict); else for about `budget` real seconds, the rest left to the daemon's reader thread.
        `wait=False` (the guard path): if another thread is reading this run, go on with what is known.
        Each chunk's offsets are stored with its records, so a restart reads on from there. `chunk`: its
        bytes at most (a drain's and the reader thread's: 256 KiB; a guard's: 64 KiB, a few ms). `final`
        (with `drain`, once the attempt's exit is known): a last printed line without its newline is read
        too — never while the trainer lives, as it may be writing that line still."""
        reader = self.reader
        # one save of the offsets a call, not one a chunk (a flood drained at ~30 chunks a second paid a store
        # commit and an fsync for each): the record log made durable first, so what is saved never runs ahead
        # of what it holds; a daemon killed before the save reads those chunks again (the pump cuts first)
        with self.ctx.store.deferred_readings():
            try:
                return self._read_chunks(budget, drain, wait, chunk, final)
            finally:
                reader.sync()

    def _read_chunks(self, budget: float, drain: bool, wait: bool, chunk: int | None, final: bool) -> int:
        start = time.monotonic()
        total = 0
        reader, lock = self.reader, self.host.lock
        size = chunk or (CHUNK_BYTES if drain else SMALL_CHUNK_BYTES)
        while True:
            if not reader.lock.acquire(blocking=wait):
                return total  # the reader thread (or an exit's drain) is on it
            try:
                t0 = time.monotonic()
                got = reader.next_chunk(self.ctx.now(), size, final=final)
                applied = lock.acquire(blocking=False)  # never wait on the run's lock while reading it
                if applied:
                    try:
                        total += self._apply(got)
                        reader.applied()
                    finally:
                        lock.release()
                self._note_pace(got.more, time.monotonic() - t0)
            finally:
                reader.lock.release()
            if applied and not got.more and (got.final or not final):  # a chunk read before the exit: once more
                break
            if drain and self.ctx.reads.closed:
                raise ReadInterrupted(f"{self.run}: the daemon stopped while the run's output was read for its "
                                      "exit", hint="the next `babysit up` reads it to the end and handles the exit")
            if not drain and (self.ctx.reads.closed or time.monotonic() - start >= budget):
                self.ctx.reads.want(self)  # the rest on the daemon's reader thread, off every guard's path
                break
            if not applied:
                if not wait:
                    self.ctx.reads.want(self)
                    break
                time.sleep(0.005)  # the run's lock is held (a poll, a guard): the chunk is applied once it is free
        if self.eval_unread and not self.reader.behind_since:
            with lock:
                if self.eval_unread:
                    self.eval_unread = False
                    self.host.verdicts.read()
        return total

    def _note_pace(self, more: bool, seconds: float) -> None:
        """How long the reader has been behind (a reader that cannot keep up says so: `check_reader`)."""
        reader = self.reader
        if not more:
            reader.behind_since, reader.read_seconds = None, 0.0
            return
        if reader.behind_since is None:
            reader.behind_since = self.ctx.now()
        reader.read_seconds += seconds

    def _apply(self, chunk: Chunk) -> int:
        """Under the run's lock: one chunk's records to the run's state (progress, metrics shown, the
        end step, divergence), and its offsets stored."""
        pumped, read = chunk.pumped, chunk.read
        if pumped is not None:
            self._say_notices(pumped.notices)
        grew = pumped is not None and (pumped.output_grew or bool(pumped.lines_seen))
        if pumped is not None and pumped.output_grew:
            self.last_output_wall = self.ctx.now()
            if self.first_output_wall is None:
                self.first_output_wall = self.last_output_wall
                self.teller.first_output()
        self.teller.after_chunk(read.records, pumped)
        if read.missing:
            if grew:
                self._save_tail()
            return 0
        metric = self.spec.prereg.metric if self.spec.prereg else None
        if self.spec.prereg is not None:
            self.host.verdicts.take_records(read.records, chunk.start, read.state)  # its series: no second parse
        batch = read.records
        for seg in batch.segments if isinstance(batch, RecordBatch) else (batch,):
            if isinstance(seg, ColumnSegment):
                self._apply_columns(seg, metric)
            else:
                self._apply_records(seg, metric)
        if not read.records and not read.reset and read.garbage == 0 and not grew:
            return 0  # nothing new: no write (this runs every tick for every run)
        if read.records:
            self.last_record_wall = self.ctx.now()
        self._save_tail()
        return len(read.records)

    def _apply_columns(self, seg: ColumnSegment, metric: str | None) -> None:
        """What the record loop leaves of a block of finite records with the same metrics, taken once:
        the last points and records, each shown metric's last value, the last declared end, the eval of
        the last record; no NaN or inf among them, so the pending grad norms clear (core.nonfinite)."""
        steps, names = seg.steps, seg.names
        keep = self.points.maxlen or len(steps)
        first = max(0, len(steps) - keep)
        self.points.extend(ProgressPoint(steps[i], seg.ts(i)) for i in range(first, len(steps)))
        self.recent.extend(seg.last(self.recent.maxlen or len(steps)))
        if not self.waits_logged and not set(names).isdisjoint(DATA_WAIT_METRICS):
            self.waits_logged = True
        spec = self.spec
        for j, name in enumerate(names):
            if snapshot.shown(spec.poll.show, metric, name):
                self.latest_shown[name] = (steps[-1], seg.value(j, -1))
        if not set(names).isdisjoint(progress.END_KEYS):
            for i in range(len(steps) - 1, -1, -1):
                declared = progress.declared_by({name: seg.value(j, i) for j, name in enumerate(names)})
                if declared is not None:
                    self.declared_end = declared
                    break
        if self.nonfinite_pending:
            self.nonfinite_pending = frozenset(k for k in self.nonfinite_pending if k not in names)
        evals = [(name, seg.value(j, -1)) for j, name in enumerate(names) if name.startswith("eval")]
        if evals:
            self.latest_eval, self.latest_eval_step = dict(evals), steps[-1]
        if metric is not None and metric in names:
            self.eval_unread = True

    def _say_notices(self, notices: tuple[tuple[str, str], ...]) -> None:
        """What the source found out about the run's printed lines, said once: the preset `auto` chose
        (a message, and the run's facts for `status` and polls), a computed step that went backwards."""
        attempt = self.host.attempt
        n = attempt.n if attempt else 0
        for kind, text in notices:
            if kind == "preset":
                self.ctx.store.merge_run_facts(self.run, self.ctx.now(), preset=text)
                if "read" in self.teller.answered:  # a switch (a preset's line came after the general reader's): said
                    self.host.message("text", {"text": f"📄 {self.run}: {sources.preset_line(text)}"},
                                      key=f"{self.run}:preset:{text}")
            elif kind in ("step-backwards", "general-backwards"):
                self.host.incident("step-backwards", text, {}, key=f"{self.run}:{n}:step-backwards")
            elif kind.startswith("general-"):  # how the general reader counts the steps (core/reading/printed.py)
                self.host.message("text", {"text": f"📄 {self.run}: {text}"}, key=f"{self.run}:{n}:{kind}")

    def _save_tail(self) -> None:
        """The record log's offset and the source's own state in one write: a restart reads on from both.
        A round defers it (`Store.deferred_readings`): a daemon killed before the round's one commit reads
        those records again, and the pump cuts its record log back first, so nothing is counted twice."""
        self.ctx.store.save_reading(self.run, tail=self.tail.to_dict(), source=dict(self.pump.state),
                                    step=self.points[-1].step if self.points else None,
                                    last_record_at=self.last_record_wall)

    def _apply_records(self, records: Sequence[LogRecord], metric: str | None) -> None:
        """Record by record (what `_apply_columns` takes a block at once): progress, metrics to show, the
        evals, the run's end step, divergence. Every record of every run passes here at each guard round,
        so what a metric's name says (shown? an eval? an end key?) is worked out once a name, not a record."""
        spec = self.spec
        if self._names_for != (spec.poll.show, metric):  # a spec of other [poll].show or prereg: asked again
            self._names, self._names_for = {}, (spec.poll.show, metric)
        names, shown, points, recent = self._names, self.latest_shown, self.points, self.recent
        for record in records:
            step, metrics, fields = record.step, record.metrics, record.fields
            points.append(ProgressPoint(step, record.ts))
            recent.append(record)
            if fields:  # NaN/inf are kept there (logtail): shown, and judged by the non-finite rule
                numbers: Mapping[str, object] = {k: v for k, v in fields.items() if isinstance(v, float)}
                numbers.update(metrics)  # type: ignore[attr-defined]
            else:
                numbers = metrics
            evals: dict[str, float] | None = None
            ends = False
            for name, value in numbers.items():
                what = names.get(name)
                if what is None:
                    what = names[name] = _NameRole(snapshot.shown(spec.poll.show, metric, name),
                                                   name.startswith("eval"), name in progress.END_KEYS,
                                                   name in DATA_WAIT_METRICS)
                if what.shown and isinstance(value, (int, float)):
                    shown[name] = (step, float(value))
                if what.eval and name in metrics:
                    if evals is None:
                        evals = {}
                    evals[name] = metrics[name]
                ends = ends or what.end
                if what.wait:
                    self.waits_logged = True
            if evals is not None:
                self.latest_eval, self.latest_eval_step = evals, step
            if ends:
                declared = progress.declared_by(metrics)
                if declared is not None:
                    self.declared_end = declared
            if metric is not None and metric in metrics:
                self.eval_unread = True
            if self.nonfinite_pending or len(numbers) != len(metrics):  # else: only finite numbers, none pending
                self._divergence(record, numbers)

    def _divergence(self, record: LogRecord, numbers: Mapping[str, object]) -> None:
        """A record with a non-finite number, or after a grad norm went non-finite: the watched metrics judged.
        The run's guards are checked at once (on the timers, once this read lets go of the run), not at the
        next guard round: a NaN stops the run within a second of being printed."""
        counted, self.nonfinite_pending = nonfinite.divergence(numbers, self.spec.guards.nonfinite_metrics,
                                                               self.nonfinite_pending)
        bad = next(iter(counted.items()), None)
        attempt = self.host.attempt
        if bad is not None and self.nonfinite is None and attempt is not None \
                and attempt.status == AttemptStatus.RUNNING:
            self.nonfinite = (record.step, bad[0], bad[1])
            self.ctx.store.merge_attempt_detail(attempt.id, {"nonfinite": f"{bad[0]} = {bad[1]} at step {record.step}"})
            self.host.later(f"nonfinite:{self.run}", 0.0, self.check_guards,
                            "checking its guards after a non-finite value")

    def end_step(self, attempt: Attempt) -> int | None:
        """The run's last step, by the rule status and the web page apply (`progress.end_step`); the
        command's --steps parsed once an attempt, not at each of its guard rounds and polls."""
        if self._argv_steps is None or self._argv_steps[0] != attempt.argv:
            self._argv_steps = (attempt.argv, progress.steps_from_argv(attempt.argv) if attempt.argv else None)
        return progress.end_step(self.spec.total_steps, self.declared_end, self._argv_steps[1])

    def quiet_seconds(self, now: float) -> float | None:
        """Since the last record AND the last byte of output (stdout, stderr, the source files): bursty
        sources and tqdm-only progress are not stalls; a frozen process is."""
        marks = [t for t in (self.last_record_wall, self.last_output_wall) if t is not None]
        return None if not marks else now - max(marks)

    def data_wait_frac(self) -> float | None:
        """The trainer's own input-wait share of step time over the recent records, when it logs one (most
        trainers do not: then no record is looked at, at every guard round of every run)."""
        if not self.waits_logged:
            return None
        values = [r.metrics[k] for r in self.recent for k in DATA_WAIT_METRICS if k in r.metrics]  # finite floats
        return sum(values) / len(values) if values else None
